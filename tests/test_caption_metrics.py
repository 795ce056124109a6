"""Tests for mmtx.metrics.caption against pycocoevalcap itself.

METEOR's java process loads a paraphrase table (seconds), so the tests
that score through it share module-scoped results.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from mmtx.metrics import caption
from mmtx.metrics.caption import METRIC_NAMES, caption_metrics, constant_baseline
from mmtx.metrics.table import format_metrics_table

needs_java = pytest.mark.skipif(
    shutil.which("java") is None,
    reason="java not on PATH: pycocoevalcap's PTB tokenizer and METEOR are Java programs",
)

REFERENCES: dict[int, list[str]] = {
    11: [
        "A man riding a wave on top of a surfboard.",
        "A surfer rides a large wave in the ocean.",
        "A person on a surfboard riding a big wave.",
        "Surfer in a black wetsuit catching a wave.",
        "A man surfing on a blue ocean wave.",
    ],
    22: [
        "A brown dog catching a frisbee in a grassy park.",
        "A dog jumps to catch a red frisbee.",
        "The dog is leaping in the air for a frisbee.",
        "A dog playing with a flying disc on the grass.",
        "Dog in mid-air grabbing a frisbee.",
    ],
    33: [
        "A pizza with cheese and pepperoni on a wooden table.",
        "A large pizza sitting on top of a table.",
        "Pepperoni pizza on a cutting board.",
        "A freshly baked pizza ready to be eaten.",
        "A cheese pizza next to a glass of soda.",
    ],
    44: [
        "A red double decker bus driving down a city street.",
        "A bus stopped at a bus stop in London.",
        "Double decker bus on a busy road.",
        "A tour bus with people on the upper deck.",
        "The red bus is parked by the sidewalk.",
    ],
    55: [
        "A kitchen with white cabinets and a stainless steel fridge.",
        "A clean kitchen with a stove and a microwave.",
        "An empty kitchen with wooden floors.",
        "Kitchen counter with a sink under a window.",
        "A small kitchen with appliances and a table.",
    ],
}

PREDICTIONS = {
    11: "A man riding a surfboard on a wave.",
    22: "A dog catching a frisbee in the park!",
    33: "A pizza on a table.",
    44: "A red bus driving down the street.",
    55: "",  # a model that emits [EOS] at once
}


@pytest.fixture(scope="module")
def scored() -> tuple[dict[str, float], dict[str, float], list[caption._Meteor]]:
    """Metrics of predictions that copy a reference, then of ``PREDICTIONS``, scored one after
    the other from a process with no METEOR scorer yet, and every scorer spawned for them."""
    spawned: list[caption._Meteor] = []

    class Recording(caption._Meteor):
        def __init__(self) -> None:
            super().__init__()
            spawned.append(self)

    if caption._meteor is not None:  # an earlier test's
        caption._meteor.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(caption, "_Meteor", Recording)
        patch.setattr(caption, "_meteor", None)
        perfect = caption_metrics({i: refs[0] for i, refs in REFERENCES.items()}, REFERENCES)
        model = caption_metrics(PREDICTIONS, REFERENCES)
        serving = caption._meteor
    caption._meteor = serving  # the later tests' scores come from it too, as a run's later validations'
    return perfect, model, spawned


@pytest.fixture(scope="module")
def perfect_metrics(scored) -> dict[str, float]:
    return scored[0]


@pytest.fixture(scope="module")
def model_metrics(scored) -> dict[str, float]:
    return scored[1]


# ---------------------------------------------------------------------- caption_metrics


@needs_java
def test_perfect_predictions_score_near_one(perfect_metrics: dict[str, float]) -> None:
    metrics = perfect_metrics
    assert list(metrics) == list(METRIC_NAMES)
    for name in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L"):
        assert metrics[name] == pytest.approx(1.0, abs=1e-6), name
    assert metrics["METEOR"] > 0.9
    assert metrics["CIDEr"] > 2.0


@needs_java
def test_one_meteor_process_serves_every_call(scored) -> None:
    """The second call's scores (checked against pycocoevalcap below) come from the first's process."""
    *_, spawned = scored
    assert len(spawned) == 1
    assert spawned[0].meteor_p.poll() is None  # still serving


def _official_meteor(gts: dict, res: dict) -> float:
    meteor = Meteor()
    try:
        return meteor.compute_score(gts, res)[0]
    finally:
        with meteor.meteor_p:  # its __del__ would leave the pipes open
            meteor.meteor_p.kill()


@needs_java
def test_metrics_equal_pycocoevalcap_run_by_hand(model_metrics: dict[str, float]) -> None:
    # The COCOEvalCap.evaluate recipe: PTB-tokenise both sides, then each scorer.
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": c} for c in refs] for i, refs in REFERENCES.items()})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in PREDICTIONS.items()})
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    expected = {
        "BLEU-1": bleu[0],
        "BLEU-2": bleu[1],
        "BLEU-3": bleu[2],
        "BLEU-4": bleu[3],
        "METEOR": _official_meteor(gts, res),
        "ROUGE-L": Rouge().compute_score(gts, res)[0],
        "CIDEr": Cider().compute_score(gts, res)[0],
    }
    assert model_metrics == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert all(type(v) is float for v in model_metrics.values())
    assert 0.0 < model_metrics["BLEU-4"] < model_metrics["BLEU-1"] < 1.0


@needs_java
def test_java_chatter_is_hidden_unless_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    caption._ptb_tokenize(["A dog 😀."])  # Java warns about the emoji and reports its speed
    assert capsys.readouterr() == ("", "")
    caption._ptb_tokenize(["A dog 😀."], verbose=True)
    assert "PTBTokenizer tokenized" in capsys.readouterr().out


@needs_java
def test_ptb_tokenize_matches_pycocoevalcap_ptbtokenizer() -> None:
    captions = [
        'A dog, running. "Quoted" (paren) U.S. -- ok...',
        "",
        "don't stop; it's 3:30 p.m.!",
        "Café ünïcode 日本語 {curly} [square] 1/2 $5",
        "line\rbreaks\u2028and\ttabs",
        "   ",
        "last one",
    ]
    # The official class would misalign captions on a stray "\r", so it gets them cleaned.
    cleaned = {k: [{"caption": " ".join(c.split())}] for k, c in enumerate(captions)}
    official = PTBTokenizer().tokenize(cleaned)
    assert caption._ptb_tokenize(captions) == [official[k][0] for k in range(len(captions))]
    assert caption._ptb_tokenize(["A DOG, running."]) == ["a dog running"]


def test_mismatched_ids_raise_naming_them() -> None:
    with pytest.raises(ValueError, match=r"predictions without references: 2 id\(s\), first 7, 8"):
        caption_metrics({**PREDICTIONS, 7: "x", 8: "y"}, REFERENCES)
    with pytest.raises(ValueError, match=r"references without predictions: 1 id\(s\), first 55"):
        caption_metrics({i: PREDICTIONS[i] for i in (11, 22, 33, 44)}, REFERENCES)


@pytest.mark.parametrize(
    ("predictions", "references", "message"),
    [
        ({}, {}, "predictions is empty"),
        ({1: ["a dog"]}, {1: ["a dog"]}, r"predictions\[1\] must be a str"),
        ({1: "a dog"}, {1: "a dog"}, r"references\[1\] must be a list of caption strings, got str"),
        ({1: "a dog"}, {1: []}, r"references\[1\] has no captions"),
        ({1: "a dog"}, {1: ["a dog", None]}, r"references\[1\] must contain only strings"),
    ],
)
def test_malformed_inputs_raise_value_error(predictions: dict, references: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        caption_metrics(predictions, references)


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="Java is needed .* PTB tokenizer and METEOR"):
        caption_metrics(PREDICTIONS, REFERENCES)
    with pytest.raises(RuntimeError, match="Java is needed"):
        constant_baseline(REFERENCES, REFERENCES)


# ---------------------------------------------------------------------- METEOR process handling


@needs_java
def test_meteor_close_is_idempotent_and_del_never_takes_the_lock() -> None:
    meteor = caption._Meteor()
    meteor.lock.acquire()  # as left behind by a compute_score that raised half-way
    finished = threading.Event()

    def collect() -> None:
        meteor.__del__()  # pycocoevalcap 1.2's own __del__ would block on the lock forever
        finished.set()

    threading.Thread(target=collect, daemon=True).start()
    assert finished.wait(timeout=30)
    assert meteor.meteor_p.returncode is not None and meteor.meteor_p.stdout.closed
    assert meteor.close() == ""


@needs_java
def test_meteor_failure_raises_runtime_error_and_the_next_call_starts_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[caption._Meteor] = []

    class Dead(caption._Meteor):
        def __init__(self) -> None:
            super().__init__()
            self.meteor_p.kill()
            self.meteor_p.wait()
            spawned.append(self)

    monkeypatch.setattr(caption, "_Meteor", Dead)
    monkeypatch.setattr(caption, "_meteor", None)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="METEOR"):
            caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]})
        assert caption._meteor is None
    assert len(spawned) == 2 and all(m.meteor_p.stdout.closed for m in spawned)


class StandIn(caption._Meteor):
    """A METEOR scorer whose process is ``sleep`` and which scores every caption 0.5; one that
    ``raises`` raises it from its first score."""

    spawned: list[StandIn] = []
    raises: type[BaseException] | None = None

    def __init__(self) -> None:
        self.meteor_p = subprocess.Popen(["sleep", "600"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)  # fmt: skip
        self.lock = threading.Lock()
        StandIn.spawned.append(self)

    def compute_score(self, gts: dict, res: dict) -> tuple[float, list[float]]:
        if self.raises is not None:
            raise self.raises
        return 0.5, [0.5]


@pytest.fixture()
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[StandIn]]:
    """``StandIn`` as the module's scorer class, no scorer yet; every stand-in ended afterwards."""
    monkeypatch.setattr(caption, "_Meteor", StandIn)
    monkeypatch.setattr(caption, "_meteor", None)
    monkeypatch.setattr(StandIn, "spawned", [])
    yield StandIn
    for meteor in StandIn.spawned:
        meteor.close()


def test_a_meteor_process_that_ended_between_calls_is_replaced(stand_in) -> None:
    """A process killed while idle (out of memory, by hand) costs no validation: the next call
    starts another."""
    assert caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]}) == 0.5
    assert caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]}) == 0.5
    assert len(stand_in.spawned) == 1
    stand_in.spawned[0].meteor_p.kill()
    stand_in.spawned[0].meteor_p.wait()
    assert caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]}) == 0.5
    assert len(stand_in.spawned) == 2


def test_a_scorer_interrupted_half_way_is_ended(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stand_in, "raises", KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]})
    assert caption._meteor is None and stand_in.spawned[0].meteor_p.returncode is not None


SCRIPT = """
import os, subprocess, sys, threading
from mmtx.metrics import caption

class StandIn(caption._Meteor):
    def __init__(self):
        self.meteor_p = subprocess.Popen(["sleep", "600"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
        self.lock = threading.Lock()

    def compute_score(self, gts, res):
        return 0.5, [0.5]

    def __del__(self):  # only the exit hook may end it
        pass

caption._Meteor = StandIn
assert caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]}) == 0.5
print(caption._meteor.meteor_p.pid, flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_the_meteor_process_ends_when_python_exits(tmp_path: Path) -> None:
    (script := tmp_path / "score.py").write_text(SCRIPT)
    pid = int(subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout)
    try:
        deadline = time.monotonic() + 30
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pid), "the scorer outlived Python"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_a_forked_child_leaves_its_parents_scorer_alone(tmp_path: Path) -> None:
    """A child forked after the first score (a data loader's worker) that exits as Python does
    ends none of its parent's processes, and scores with its own."""
    (script := tmp_path / "fork.py").write_text(SCRIPT + textwrap.dedent("""
        import gc
        del StandIn.__del__  # the scorer's own: a copy the child drops kills what it still holds
        child = os.fork()
        if child == 0:
            assert caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]}) == 0.5
            gc.collect()
            sys.exit(0)  # exit hooks run
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0, "the child failed"
        assert caption._meteor.meteor_p.poll() is None, "the child ended its parent's scorer"
        assert caption._meteor_score({1: ["a dog"]}, {1: ["a dog"]}) == 0.5
        caption._meteor.close()
    """))  # fmt: skip
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------- constant baseline


def _train_references() -> dict[int, list[str]]:
    """60 images; "a photo." is the most frequent caption, "a man riding a wave." fits best."""
    subjects = ["a man riding a wave", "a dog catching a frisbee", "a red bus on a street"]
    return {
        i: [
            f"{subjects[i % 3]} on a sunny day.",
            f"{subjects[i % 3]}.",
            "A man riding a wave." if i % 3 == 0 else f"{subjects[(i + 1) % 3]} nearby.",
            "a photo." if i % 4 == 0 else f"picture number {i}.",
            "A photo." if i % 2 == 0 else f"image {i} of {subjects[i % 3]}.",
        ]
        for i in range(60)
    }


@needs_java
def test_constant_caption_is_the_frequent_caption_with_best_cider() -> None:
    train = _train_references()
    assert caption._best_constant_caption(train, candidates=1) == "a photo."
    assert caption._best_constant_caption(train, candidates=50) == "a man riding a wave."
    with pytest.raises(ValueError, match="candidates must be >= 1"):
        caption._best_constant_caption(train, candidates=0)


@needs_java
def test_constant_baseline_is_far_below_perfect(perfect_metrics: dict[str, float]) -> None:
    train = _train_references()
    text, metrics = constant_baseline(train, REFERENCES)
    assert text in {" ".join(c.lower().split()) for refs in train.values() for c in refs}
    assert list(metrics) == list(METRIC_NAMES)
    perfect = perfect_metrics
    assert metrics["CIDEr"] < 0.25 * perfect["CIDEr"]
    assert metrics["BLEU-4"] < 0.5 * perfect["BLEU-4"]


# ---------------------------------------------------------------------- table


def test_format_metrics_table_aligns_model_and_baseline_columns() -> None:
    table = format_metrics_table({"BLEU-4": 0.31234, "CIDEr": 1.05}, {"BLEU-4": 0.1})
    lines = table.splitlines()
    assert lines[0] == "metric  model   constant baseline"
    assert lines[2] == "BLEU-4  0.3123  0.1000"
    assert lines[3] == "CIDEr   1.0500  -"
    assert set(lines[1]) == {"-", " "}
    alone = format_metrics_table({"CIDEr": 1.0}).splitlines()
    assert alone == ["metric  model", "------  ------", "CIDEr   1.0000"]
