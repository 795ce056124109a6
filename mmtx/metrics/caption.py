"""Official COCO caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr) via pycocoevalcap.

Numbers match ``pycocoevalcap.eval.COCOEvalCap`` (what papers report): every
caption goes through the Stanford PTB tokenizer with punctuation removed,
then the reference scorers run on the result. Java must be on PATH: the PTB
tokenizer and METEOR are Java programs shipped inside pycocoevalcap.
"""

from __future__ import annotations

import atexit
import heapq
import os
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer import ptbtokenizer

__all__ = ["METRIC_NAMES", "caption_metrics", "constant_baseline"]

METRIC_NAMES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")

_PTB_JAR = Path(ptbtokenizer.__file__).with_name(ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
_PTB_PUNCTUATION = frozenset(ptbtokenizer.PUNCTUATIONS)

# Training images whose CIDEr ranks the constant-caption candidates: enough to
# rank a handful of generic captions, few enough to take well under a second.
_BASELINE_IMAGES = 300


def caption_metrics(predictions: Mapping[int, str], references: Mapping[int, Sequence[str]]) -> dict[str, float]:
    """Score one predicted caption per image against its reference captions.

    Returns the keys of ``METRIC_NAMES`` on pycocoevalcap's scales (BLEU,
    METEOR and ROUGE-L in [0, 1]; CIDEr as returned, about 0-10). Every
    prediction id needs references and vice versa.
    """
    ids = _check_ids(predictions, references)
    _require_java()
    flat_refs = [ref for i in ids for ref in references[i]]
    tokens = iter(_ptb_tokenize([*flat_refs, *(predictions[i] for i in ids)]))
    gts = {i: [next(tokens) for _ in references[i]] for i in ids}
    res = {i: [next(tokens)] for i in ids}

    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    metrics = {f"BLEU-{n}": float(score) for n, score in enumerate(bleu, 1)}
    metrics["METEOR"] = _meteor_score(gts, res)
    metrics["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    metrics["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    return metrics


def constant_baseline(
    train_references: Mapping[int, Sequence[str]],
    eval_references: Mapping[int, Sequence[str]],
    candidates: int = 50,
) -> tuple[str, dict[str, float]]:
    """The best single training caption, predicted for every evaluation image, and its metrics.

    Captions are compared lowercased with whitespace collapsed. The
    ``candidates`` most frequent ones (ties broken alphabetically) are ranked
    by CIDEr on an evenly spread subset of at most 300 training images; the
    winner (ties go to the more frequent caption) is returned in that
    normalised form and scored on ``eval_references`` with :func:`caption_metrics`.
    """
    _check_references(eval_references, "eval_references")
    caption = _best_constant_caption(train_references, candidates)
    return caption, caption_metrics({i: caption for i in eval_references}, eval_references)


def _best_constant_caption(train_references: Mapping[int, Sequence[str]], candidates: int) -> str:
    """The frequent training caption with the highest CIDEr as a constant prediction (see above)."""
    if candidates < 1:
        raise ValueError(f"candidates must be >= 1, got {candidates}")
    _check_references(train_references, "train_references")
    _require_java()
    counts = Counter(
        caption
        for refs in train_references.values()
        for caption in (" ".join(ref.lower().split()) for ref in refs)
        if caption
    )
    if not counts:
        raise ValueError("train_references: every caption is empty")
    frequent = heapq.nsmallest(candidates, counts.items(), key=lambda kv: (-kv[1], kv[0]))
    pool = [text for text, _ in frequent]

    ids = sorted(train_references)
    size = min(_BASELINE_IMAGES, len(ids))
    subset = [ids[k * len(ids) // size] for k in range(size)]
    flat_refs = [ref for i in subset for ref in train_references[i]]
    tokens = _ptb_tokenize([*pool, *flat_refs])
    pool_tokens, ref_tokens = tokens[: len(pool)], iter(tokens[len(pool) :])
    subset_refs = [[next(ref_tokens) for _ in train_references[i]] for i in subset]

    references = dict(enumerate(subset_refs))
    scores = [Cider().compute_score(references, {i: [text] for i in references})[0] for text in pool_tokens]
    return pool[max(range(len(pool)), key=lambda k: (scores[k], -k))]


# ---------------------------------------------------------------------- input checks


def _require_java() -> None:
    if shutil.which("java") is None:
        raise RuntimeError(
            "Java is needed for the official COCO caption metrics (pycocoevalcap's "
            "PTB tokenizer and METEOR are Java programs); install a JRE so `java` is on PATH"
        )


def _check_references(references: Mapping[int, Sequence[str]], name: str) -> None:
    if not references:
        raise ValueError(f"{name} is empty")
    for key, refs in references.items():
        if isinstance(refs, str) or not isinstance(refs, Sequence):
            raise ValueError(f"{name}[{key!r}] must be a list of caption strings, got {type(refs).__name__}")
        if not refs:
            raise ValueError(f"{name}[{key!r}] has no captions")
        if not all(isinstance(ref, str) for ref in refs):
            raise ValueError(f"{name}[{key!r}] must contain only strings")


def _check_ids(predictions: Mapping[int, str], references: Mapping[int, Sequence[str]]) -> list[int]:
    """The ids to score (in ``predictions`` order) after checking both mappings agree."""
    if not predictions:
        raise ValueError("predictions is empty: nothing to score")
    for key, caption in predictions.items():
        if not isinstance(caption, str):
            raise ValueError(f"predictions[{key!r}] must be a str, got {type(caption).__name__}")
    unreferenced = [i for i in predictions if i not in references]
    unpredicted = [i for i in references if i not in predictions]
    for what, missing in (
        ("predictions without references", unreferenced),
        ("references without predictions", unpredicted),
    ):
        if missing:
            shown = ", ".join(map(repr, missing[:5])) + (", ..." if len(missing) > 5 else "")
            raise ValueError(f"{what}: {len(missing)} id(s), first {shown}")
    _check_references(references, "references")
    return list(predictions)


# ---------------------------------------------------------------------- Java tools


def _ptb_tokenize(captions: Sequence[str], verbose: bool = False) -> list[str]:
    """COCO's caption tokenisation: pycocoevalcap's PTBTokenizer on a flat list of captions.

    Same jar, flags and punctuation removal as ``PTBTokenizer.tokenize``, but
    one Java call for all captions through stdin (nothing written into
    site-packages), with Java's messages captured and failures raised instead of
    silently misaligning captions. Whitespace runs, line breaks included (Java
    would split a caption at a stray ``\\r``), become single spaces first.
    """
    lines = [" ".join(caption.split()) for caption in captions]
    command = ["java", "-cp", str(_PTB_JAR), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase"]
    result = subprocess.run(command, input="\n".join(lines).encode(), capture_output=True)
    messages = result.stderr.decode(errors="replace").strip()
    if verbose and messages:
        print(messages)
    output = result.stdout.decode().split("\n")
    if result.returncode != 0 or len(output) < len(lines):
        raise RuntimeError(
            f"PTB tokenizer ({_PTB_JAR}) failed with exit code {result.returncode}, "
            f"{len(output)} lines for {len(lines)} captions: {messages[-2000:]}"
        )
    return [" ".join(w for w in line.rstrip().split(" ") if w not in _PTB_PUNCTUATION) for line in output[: len(lines)]]


class _Meteor(Meteor):
    """pycocoevalcap's METEOR scorer with an explicit, idempotent :meth:`close`.

    In pycocoevalcap 1.2 the java process only ends in ``Meteor.__del__``,
    which re-acquires the scorer's lock: after ``compute_score`` failed
    half-way (lock still held) the garbage collector deadlocks there. Here
    ``__del__`` just kills and reaps the process, never touching the lock.
    """

    def close(self) -> str:
        """Kill and reap the java process; returns what it wrote on stderr."""
        process = getattr(self, "meteor_p", None)  # Absent if __init__ failed.
        if process is None or process.stdout.closed:
            return ""
        process.kill()  # A no-op if it already ended.
        _, stderr = process.communicate()  # Reaps it and closes all three pipes.
        return stderr.decode(errors="replace")

    def __del__(self) -> None:
        self.close()


_meteor: _Meteor | None = None  # this process's one METEOR scorer, see _meteor_score
_meteor_lock = threading.Lock()


def _meteor_score(gts: dict[int, list[str]], res: dict[int, list[str]]) -> float:
    """Corpus METEOR of tokenised captions.

    One java process serves every call: METEOR spends seconds loading its paraphrase table at
    start, which every validation of a run would pay again. It starts at the first call and is
    killed when Python exits; one that failed is ended (its replies could be out of step with
    its questions), and one that failed or ended between calls is replaced by the next call.
    """
    global _meteor
    with _meteor_lock:
        if _meteor is not None and _meteor.meteor_p.poll() is not None:  # ended while idle
            _meteor.close()
            _meteor = None
        if _meteor is None:
            _meteor = _Meteor()
        try:
            score, _ = _meteor.compute_score(gts, res)
        except BaseException as err:  # interrupted or failed half-way: out of step with its questions
            stderr = _meteor.close().strip()
            _meteor = None
            if isinstance(err, (ValueError, OSError)):  # java died: empty reply or broken pipe
                raise RuntimeError(f"METEOR (java) failed: {stderr[-2000:] or 'no message'}") from err
            raise
    return float(score)


@atexit.register
def _close_meteor() -> None:
    if _meteor is not None:
        _meteor.close()


def _forget_inherited_meteor() -> None:
    """In a forked child (a data loader's worker): the parent's scorer is the parent's to use
    and to end, at the child's exit too."""
    global _meteor, _meteor_lock
    if _meteor is not None:
        _meteor.meteor_p = None  # its close() then leaves the parent's process alone
    _meteor, _meteor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_inherited_meteor)
