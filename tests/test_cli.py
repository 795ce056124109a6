"""End-to-end tests of the command-line apps: mmtx-train, mmtx-eval, mmtx-caption.

One tiny captioner is trained in-process through Hydra's compose API (module fixture
``trained``); the evaluation, captioning and resume tests reuse its checkpoint. The other
tests start the installed console scripts in subprocesses, as a user would.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from PIL import Image

from mmtx.checkpoint import DATA_KEY, load_task, read_checkpoint
from mmtx.data.captions import read_coco_captions
from mmtx.data.images import load_image
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.transforms import build_transforms
from mmtx.metrics.caption import caption_metrics
from tests.helpers import compose_train, train_in_process

# the caption metric keys every command reports (INTERFACES.md)
CAPTION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")
# and on drawn scenes, the captions scored against the scene (relation_accuracy: when any relation is stated)
SCENE_METRICS = ("correctness", "relation_accuracy", "relations_stated")

# the shared run: 64 images x 5 captions in batches of 16 = 20 steps in its one epoch
TRAIN = ["data.batch_size=16", "task.lr=3e-3", "trainer.log_every_n_steps=1"]
STEPS_PER_EPOCH = 64 * 5 // 16
# its continuation: through the end of the next epoch (a validation at step 40) into the one after
RESUME_STOP = 2 * STEPS_PER_EPOCH + 4


# ------------------------------------------------------------------------------------ helpers


@dataclass
class Run:
    dir: Path
    metrics: dict[str, float]

    @property
    def last(self) -> Path:
        return self.dir / "checkpoints" / "last.ckpt"

    def summary(self) -> dict[str, Any]:
        return json.loads((self.dir / "metrics.json").read_text())


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    """The rows of the (only) CSVLogger metrics file of a run."""
    (path,) = run_dir.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


def logged(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every row of a CSV log where ``key`` was logged."""
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]


def assert_caption_metrics(metrics: dict[str, Any]) -> None:
    """Exactly the 7 caption metrics (plus the scene scores on shapes data), as finite floats."""
    assert sorted(set(metrics) - set(SCENE_METRICS)) == sorted(CAPTION_METRICS)
    for name, value in metrics.items():
        assert type(value) is float and math.isfinite(value), (name, value)
        assert 0.0 <= value <= {"CIDEr": 10.0, "relations_stated": math.inf}.get(name, 1.0), (name, value)


def table_row(stdout: str, metric: str) -> list[str]:
    """The cells of ``metric``'s row in a printed metrics table."""
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] == [metric]]
    assert len(rows) == 1, f"no single {metric} row in:\n{stdout}"
    return rows[0]


def copy_images(sources: list[Path], folder: Path, names: list[str]) -> None:
    """Copy images under new names (converting by extension, e.g. a .jpg from a PNG)."""
    folder.mkdir(parents=True, exist_ok=True)
    for src, name in zip(sources, names):
        Image.open(src).convert("RGB").save(folder / name)


# --- reading a W&B offline run -----------------------------------------------------------------
# wandb 0.31 (wandb-core) writes an offline run as one `run-<id>.wandb` file, plus media under
# files/. `files/wandb-summary.json` and `config.yaml` are only made when the run is synced, and
# the Python SDK no longer ships a reader (the old wandb.sdk.internal.datastore is gone), so the
# records are read here. The file is a LevelDB-style log: a 7-byte header (":W&B", magic
# 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a header (crc32 of type + data,
# uint32 LE; length, uint16 LE; type: 1 full, 2 first, 3 middle, 4 last) and the data; a block's
# last < 7 bytes are zero padding. Each reassembled record is a `wandb_internal_pb2.Record`.

_BLOCK, _CHUNK_HEADER = 32768, 7


def wandb_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path} is not a W&B run file"
    records, pending, pos = [], b"", 7
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # block trailer
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        if (crc, length, kind) == (0, 0, 0):  # zero padding up to the end of a block
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        assert len(chunk) == length and zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad chunk at {pos}"
        pos += _CHUNK_HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def _items(items) -> dict[str, Any]:
    """Protobuf items (``key`` or ``nested_key`` + ``value_json``) as a nested dict."""
    out: dict[str, Any] = {}
    for item in items:
        *parents, last = list(item.nested_key) or [item.key]
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = json.loads(item.value_json)
    return out


@dataclass
class WandbRun:
    config: dict[str, Any]  # the run config after every update
    history: list[dict[str, Any]]  # the wandb.log calls, in order
    summary: dict[str, Any]  # the last value of every key
    artifacts: list[Any]  # ArtifactRecords (tables with media are logged as artifacts)
    exit_code: int | None


def read_wandb_run(run_dir: Path) -> WandbRun:
    (path,) = run_dir.glob("run-*.wandb")
    config, history, summary, artifacts, exit_code = {}, [], {}, [], None
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update(_items(record.config.update))
        elif kind == "history":
            history.append(_items(record.history.item))
        elif kind == "summary":
            summary.update(_items(record.summary.update))
        elif kind == "artifact":
            artifacts.append(record.artifact)
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return WandbRun(config, history, summary, artifacts, exit_code)


# ------------------------------------------------------------------------------------ fixtures
# Every mmtx-train run costs seconds of Java for the official metrics (validation, baseline):
# the tests share three runs, the in-process one, its resumption, and the multirun.


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny: list[str]) -> Run:
    """One tiny captioner trained in-process through the compose API (CSV logs), shared by the tests."""
    out = tmp_path_factory.mktemp("trained")
    metrics = train_in_process([*tiny, *TRAIN, "logger=csv", "trainer.max_epochs=1", f"paths.output_dir={out}"])
    return Run(out, metrics)


@pytest.fixture(scope="module")
def val_records(trained: Run):
    """The shapes val split the shared run was validated on (from the checkpoint's data config)."""
    root = Path(read_checkpoint(trained.last)[DATA_KEY]["root"])
    return read_coco_captions(root / "captions_val.json", root / "val")


@pytest.fixture(scope="module")
def resumed(cli, trained: Run, tiny: list[str], tmp_path_factory: pytest.TempPathFactory):
    """The installed ``mmtx-train`` resuming the shared run from its last.ckpt (step 20) up to step
    44, logging to W&B (offline) and CSV. ``tokenizer.vocab_size=60`` would give a new, smaller
    vocabulary if the run did not take the checkpoint's."""
    cwd = tmp_path_factory.mktemp("resumed")
    result = cli.run(
        "mmtx-train", *tiny, *TRAIN, "logger=[wandb,csv]", f"ckpt_path={trained.last}",
        "trainer.max_epochs=10", f"trainer.max_steps={RESUME_STOP}", "tokenizer.vocab_size=60",
        f"hydra.run.dir={cwd / 'run'}", cwd=cwd,
    )  # fmt: skip
    return Run(cwd / "run", json.loads((cwd / "run" / "metrics.json").read_text())["metrics"]), result


@pytest.fixture(scope="module")
def evals(cli, trained: Run, val_records, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """mmtx-eval on the shared checkpoint: on the data it was trained on (the default), on a small
    official-COCO file and on a Karpathy-split file, both over copies of shapes images. Run at
    once: they are mostly start-up and Java time."""
    root = tmp_path_factory.mktemp("evals")
    recs = val_records[:7]

    coco_ids = [42, 7, 123456]  # not the shapes ids: predictions must carry the file's ids
    names = [f"COCO_val2014_{i:012d}.{ext}" for i, ext in zip(coco_ids, ("png", "jpg", "png"))]
    copy_images([r.path for r in recs[:3]], root / "val2014", names)
    (root / "captions_val.json").write_text(json.dumps({
        "info": {}, "licenses": [],
        "images": [{"id": i, "file_name": n, "width": 32, "height": 32} for i, n in zip(coco_ids, names)],
        "annotations": [
            {"id": 10 * i + j, "image_id": i, "caption": c}
            for i, r in zip(coco_ids, recs) for j, c in enumerate(r.captions)
        ],
    }))  # fmt: skip

    # Karpathy: train/restval/val/test images in one file, each at images/filepath/filename
    splits = ["train", "restval", "val", "test", "test", "val", "test"]
    cocoids = [900 + k for k in range(len(recs))]
    entries = []
    for k, (rec, split, cocoid) in enumerate(zip(recs, splits, cocoids)):
        copy_images([rec.path], root / "karpathy" / "val2014", [f"img_{k}.png"])
        entries.append({
            "filepath": "val2014", "filename": f"img_{k}.png", "imgid": k, "cocoid": cocoid, "split": split,
            "sentids": list(range(5 * k, 5 * k + len(rec.captions))),
            "sentences": [{"raw": c, "tokens": c.split(), "imgid": k} for c in rec.captions],
        })  # fmt: skip
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))

    ckpt = f"ckpt={trained.last}"
    shapes, coco, karpathy = cli.run_many(
        # output folders that do not exist yet are made (the results are not lost at the end)
        # at the precision the run was trained and validated at (the CPU preset's is bf16 where the CPU has it)
        ("mmtx-eval", ckpt, "trainer.precision=32-true", "output=shapes/metrics.json", "predictions=shapes/predictions.json"),
        ("mmtx-eval", ckpt, "data=coco", f"data.val.annotations={root / 'captions_val.json'}",
         f"data.val.images={root / 'val2014'}", "data.num_workers=0",
         "output=coco/metrics.json", "predictions=coco/predictions.json"),
        ("mmtx-eval", ckpt, "data=karpathy", f"data.annotations={root / 'dataset_coco.json'}",
         f"data.images={root / 'karpathy'}", "data.num_workers=0", "split=test",
         "output=karpathy/metrics.json", "predictions=karpathy/predictions.json"),
        cwd=root, check=False,
    )  # fmt: skip
    return {
        "root": root, "results": {"shapes": shapes, "coco": coco, "karpathy": karpathy},
        "ids": {"coco": coco_ids, "karpathy": [i for i, s in zip(cocoids, splits) if s == "test"]},
    }  # fmt: skip


def eval_outputs(cli, evals: dict[str, Any], source: str) -> tuple[Any, dict[str, float], list[dict]]:
    """The finished mmtx-eval run on ``source``: its process, metrics and predictions."""
    result = evals["results"][source]
    assert result.returncode == 0, cli.describe(result)
    folder = evals["root"] / source
    metrics = json.loads((folder / "metrics.json").read_text())
    return result, metrics, json.loads((folder / "predictions.json").read_text())


# ------------------------------------------------------------------------------ 1. compose API


def test_compose_config(tiny: list[str], tmp_path: Path) -> None:
    cfg = compose_train([*tiny, f"paths.output_dir={tmp_path}", "seed=3"])
    HydraConfig.instance().set_config(cfg)
    try:
        assert cfg.run_name == "caption-shapes"  # ${hydra:runtime.choices.*}
        assert cfg.seed == 3 and cfg.model.encoder.dim == 32 and cfg.model.decoder.context_dim == 32
        assert cfg.callbacks.model_checkpoint.dirpath == f"{tmp_path}/checkpoints"
        assert cfg.trainer.default_root_dir == str(tmp_path)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]


def test_train_in_process_writes_the_run_directory(trained: Run) -> None:
    assert_caption_metrics(trained.metrics)

    checkpoints = trained.dir / "checkpoints"
    assert trained.last.is_file()
    (best,) = checkpoints.glob("best-*.ckpt")
    last = read_checkpoint(trained.last)
    assert last["global_step"] == STEPS_PER_EPOCH
    assert read_checkpoint(best)["global_step"] <= last["global_step"]

    # the vocabulary beside the checkpoints is the one the checkpoint carries
    tokenizer = Tokenizer.from_file(trained.dir / "tokenizer.json")
    assert tokenizer.to_str() == last["hyper_parameters"]["tokenizer"]
    assert tokenizer.vocab_size < 1000  # learnt from the captions (vocab_size is an upper bound)

    summary = trained.summary()
    assert summary["metrics"] == pytest.approx(trained.metrics)
    assert summary["steps"] == STEPS_PER_EPOCH
    baseline = {k: v for k, v in summary["baseline"].items() if k in CAPTION_METRICS}
    assert_caption_metrics(baseline)
    # a constant caption cannot describe varied scenes: the baseline's CIDEr stays low but is not 0
    assert 0 < baseline["CIDEr"] < 2


# ----------------------------------------------------------------------- 7. the loss goes down


def test_training_reduces_the_loss(trained: Run) -> None:
    losses = logged(csv_rows(trained.dir), "train/loss")
    assert [step for step, _ in losses] == list(range(STEPS_PER_EPOCH))  # log_every_n_steps=1
    first, last = losses[0][1], losses[-1][1]
    vocab = Tokenizer.from_file(trained.dir / "tokenizer.json").vocab_size
    assert abs(first - math.log(vocab)) < 0.5  # starts near a uniform guess over the vocabulary
    assert last < first - 0.5, losses


# ------------------------------------------------------------- 2. mmtx-train with W&B offline


@pytest.mark.slow
def test_mmtx_train_prints_metrics_and_baseline(resumed) -> None:
    run, result = resumed
    summary = run.summary()
    assert_caption_metrics(run.metrics)
    header = next(line for line in result.stdout.splitlines() if line.split()[:2] == ["metric", "model"])
    assert "baseline" in header
    for name in ("BLEU-4", "CIDEr"):  # model and baseline columns, the numbers of metrics.json
        assert table_row(result.stdout, name) == [name, f"{run.metrics[name]:.4f}", f"{summary['baseline'][name]:.4f}"]
    assert "baseline" in result.stdout.split("metric", 1)[0]  # what the baseline is, said before the table
    for noise in ("litlogger", "litmodels", "LeafSpec", "could not find the monitored key"):  # libraries' chatter
        assert noise not in result.stdout + result.stderr, noise


@pytest.mark.slow
def test_mmtx_train_logs_to_wandb_offline(resumed, trained: Run) -> None:
    run_dir, metrics = resumed[0].dir, resumed[0].metrics
    baseline = resumed[0].summary()["baseline"]
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    run = read_wandb_run(offline)
    assert run.exit_code == 0

    # the resolved Hydra config (interpolations filled in), not clobbered by the task's hyperparameters
    assert run.config["seed"] == 0 and run.config["ckpt_path"] == str(trained.last)
    assert run.config["paths"]["output_dir"] == str(run_dir)
    assert run.config["model"]["encoder"]["dim"] == 32 and run.config["model"]["decoder"]["context_dim"] == 32
    assert run.config["tokenizer"] == {
        "path": None, "kind": "wordpiece", "vocab_size": 60, "min_frequency": 1, "add_words": False,
    }
    assert run.config["task"]["lr"] == pytest.approx(3e-3)

    # the training loss and learning rate at every step, validations, the baseline
    losses = [row["train/loss"] for row in run.history if "train/loss" in row]
    assert len(losses) == RESUME_STOP - STEPS_PER_EPOCH and all(math.isfinite(x) for x in losses)
    assert sum("train/lr" in row for row in run.history) == len(losses)
    vals = [row for row in run.history if "val/CIDEr" in row]
    assert len(vals) == 2  # at the epoch end (step 40), then on the final weights (44)
    assert {k: vals[-1][f"val/{k}"] for k in metrics} == pytest.approx(metrics, rel=1e-6, abs=1e-6)  # float32
    assert all(math.isfinite(row["val/loss"]) for row in vals)
    (base,) = [row for row in run.history if "baseline/CIDEr" in row]
    assert [base[f"baseline/{k}"] for k in CAPTION_METRICS] == pytest.approx([baseline[k] for k in CAPTION_METRICS])
    assert run.summary["val/CIDEr"] == vals[-1]["val/CIDEr"] and run.summary["train/loss"] == losses[-1]

    # a table of validation images with predicted and reference captions per validation. The
    # history entry points at a "run_table" artifact that holds the table and its images
    # (files/media/table/ only keeps a copy with the placeholder "Image" for each image); an
    # offline run keeps the artifact's files in W&B's staging folder (WANDB_DATA_DIR) until synced.
    samples = [row["val/samples"] for row in run.history if "val/samples" in row]
    assert len(samples) == 2
    assert all(s["_type"] == "table-file" and s["ncols"] == 4 and s["nrows"] == 16 for s in samples)
    tables = [a for a in run.artifacts if a.type == "run_table"]
    assert len(tables) == 2
    for artifact in tables:
        files = {entry.path: Path(entry.local_path) for entry in artifact.manifest.contents}
        table = json.loads(files["val/samples.table.json"].read_text())
        assert table["columns"] == ["image", "prediction", "references", "attention"] and len(table["data"]) == 16
        for image, prediction, references, attention in table["data"]:
            assert image["_type"] == attention["_type"] == "image-file"
            assert files[image["path"]].is_relative_to(os.environ["WANDB_DATA_DIR"])
            assert Image.open(files[image["path"]]).size == (32, 32)
            assert Image.open(files[attention["path"]]).size[0] == 4 * 160  # the image, then a panel per word
            assert isinstance(prediction, str) and len(references.splitlines()) == 5


# ------------------------------------------------------------------------------------ 6. resume


@pytest.mark.slow
def test_the_logger_changes_nothing_that_is_trained_or_generated(cli, tiny: list[str], tmp_path: Path) -> None:
    """logger=csv, wandb (offline) and none train bit-identical weights and score the same: three
    runs that learn their vocabularies, side by side, from the same seed."""
    loggers = ("csv", "wandb", "none")
    cli.run_many(*[
        ("mmtx-train", *tiny, *TRAIN, f"logger={name}", "trainer.max_steps=3", f"hydra.run.dir={tmp_path / name}")
        for name in loggers
    ], cwd=tmp_path)  # fmt: skip
    states = [read_checkpoint(tmp_path / name / "checkpoints" / "last.ckpt")["state_dict"] for name in loggers]
    metrics = [json.loads((tmp_path / name / "metrics.json").read_text())["metrics"] for name in loggers]
    for name, state, scores in zip(loggers[1:], states[1:], metrics[1:]):
        assert state.keys() == states[0].keys()
        differing = [key for key in state if not torch.equal(state[key], states[0][key])]
        assert not differing, f"logger={name} trained other weights: {differing[:3]}"
        assert scores == metrics[0], name


@pytest.mark.slow
def test_resume_continues_from_last_checkpoint(resumed, trained: Run) -> None:
    """Resuming crosses an epoch end (validation at step 40) and stops in the next epoch (44): the
    run continues from step 20 with the checkpoint's vocabulary, and ends with last.ckpt at 44
    and metrics of the final weights."""
    run = resumed[0]
    start, end = read_checkpoint(trained.last), read_checkpoint(run.last)
    assert start["global_step"] == STEPS_PER_EPOCH and end["global_step"] == RESUME_STOP
    assert run.summary()["steps"] == RESUME_STOP

    # the vocabulary is the checkpoint's, not a new one (that would have <= 60 tokens)
    vocabulary = start["hyper_parameters"]["tokenizer"]
    assert Tokenizer.from_file(run.dir / "tokenizer.json").to_str() == vocabulary
    assert end["hyper_parameters"]["tokenizer"] == vocabulary
    assert Tokenizer.from_str(vocabulary).vocab_size > 60

    rows = csv_rows(run.dir)
    steps = [step for step, _ in logged(rows, "train/loss")]
    # continued, not restarted: only the remaining steps were trained (and logged after step 20)
    assert len(steps) == RESUME_STOP - STEPS_PER_EPOCH and min(steps) >= STEPS_PER_EPOCH
    assert steps == sorted(set(steps))
    # validated at the epoch end and again on the final weights
    assert len(logged(rows, "val/CIDEr")) == 2


# ---------------------------------------------------------------------------------- 3. mmtx-eval


@pytest.mark.slow
def test_mmtx_eval_writes_official_formats(cli, evals: dict[str, Any], trained: Run, val_records) -> None:
    result, metrics, predictions = eval_outputs(cli, evals, "shapes")
    assert_caption_metrics(metrics)
    assert table_row(result.stdout, "CIDEr") == ["CIDEr", f"{metrics['CIDEr']:.4f}"]

    assert isinstance(predictions, list)
    for p in predictions:
        assert set(p) == {"image_id", "caption"}
        assert type(p["image_id"]) is int and isinstance(p["caption"], str) and p["caption"].strip()
    ids = [p["image_id"] for p in predictions]
    assert sorted(ids) == sorted(r.image_id for r in val_records) and len(set(ids)) == len(ids)

    # the numbers are the official metrics of the written predictions ...
    references = {r.image_id: list(r.captions) for r in val_records}
    recomputed = caption_metrics({p["image_id"]: p["caption"] for p in predictions}, references)
    assert {k: metrics[k] for k in recomputed} == pytest.approx(recomputed, rel=1e-9, abs=1e-12)
    # shapes data: captions checked against the scene
    assert {"correctness", "relations_stated"} <= set(metrics) - set(recomputed) <= set(SCENE_METRICS)
    # ... and the ones training reported for the same (final) weights
    assert metrics == pytest.approx(trained.metrics, rel=1e-6, abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["coco", "karpathy"])
def test_mmtx_eval_on_other_data(cli, evals: dict[str, Any], source: str) -> None:
    result, metrics, predictions = eval_outputs(cli, evals, source)
    assert_caption_metrics(metrics)
    assert table_row(result.stdout, "CIDEr") == ["CIDEr", f"{metrics['CIDEr']:.4f}"]
    assert [p["image_id"] for p in predictions] == sorted(evals["ids"][source])
    assert all(set(p) == {"image_id", "caption"} and p["caption"].strip() for p in predictions)


# ------------------------------------------------------------------------------- 4. mmtx-caption


@pytest.mark.slow
def test_mmtx_caption_prints_one_caption_per_image(cli, trained: Run, val_records, tmp_path: Path) -> None:
    images = [tmp_path / "a.png", tmp_path / "b b.jpg", tmp_path / "c.png"]  # a space in a name, a JPEG
    copy_images([r.path for r in val_records[:3]], tmp_path, [p.name for p in images])
    listed = "images=[" + ",".join(f"'{p}'" for p in images) + "]"
    greedy, beam, mapped = cli.run_many(
        ("mmtx-caption", f"ckpt={trained.last}", listed),
        ("mmtx-caption", f"ckpt={trained.last}", listed, "generation.num_beams=3", "batch_size=2"),
        ("mmtx-caption", f"ckpt={trained.last}", listed, f"attention={tmp_path / 'maps'}", "batch_size=2"),
        cwd=tmp_path,
    )
    # with attention maps: the same captions, and a PNG per image (the image, then a panel per word)
    assert [line for line in mapped.stdout.splitlines() if "\t" in line] == \
        [line for line in greedy.stdout.splitlines() if "\t" in line]  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["a.png", "b b.png", "c.png"]
    assert Image.open(tmp_path / "maps" / "a.png").size[0] == 4 * 160
    printed = []
    for result in (greedy, beam):
        lines = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
        assert [path for path, _ in lines] == [str(p) for p in images], cli.describe(result)
        for _, caption in lines:
            assert caption.strip() and caption == " ".join(caption.split())  # words, single spaces
        printed.append([caption for _, caption in lines])

    # the command line's settings reach the decoder: the captions are what the checkpoint's model
    # generates greedily and with 3 beams (tested in test_generation to find likelier captions)
    task = load_task(trained.last).eval()
    batch = torch.stack([build_transforms(task.model.encoder.image_size, train=False)(load_image(p)) for p in images])
    with torch.no_grad():
        expected = [task.caption(batch, dataclasses.replace(task.generation, num_beams=beams)) for beams in (1, 3)]
    assert printed == expected
    assert expected[0] != expected[1], expected  # on these images beam search finds other captions


@pytest.mark.slow
def test_the_inference_commands_read_an_export_directory_like_the_checkpoint(cli, trained: Run, val_records,
                                                                             tmp_path: Path) -> None:
    copy_images([r.path for r in val_records[:2]], tmp_path, ["a.png", "b.png"])
    listed = f"images=[{tmp_path / 'a.png'},{tmp_path / 'b.png'}]"
    export = tmp_path / "export"
    cli.run("mmtx-export", f"ckpt={trained.last}", f"out={export}", cwd=tmp_path)
    from_ckpt, from_export, evaluated = cli.run_many(
        ("mmtx-caption", f"ckpt={trained.last}", listed),
        ("mmtx-caption", f"ckpt={export}", listed),
        ("mmtx-eval", f"ckpt={export}"),  # an export records no data set: say so, in one line
        cwd=tmp_path, check=False,
    )
    captions = [line.split("\t") for line in from_export.stdout.splitlines() if "\t" in line]
    assert len(captions) == 2 and from_export.stdout == from_ckpt.stdout, cli.describe(from_export)
    assert evaluated.returncode == 1 and evaluated.stderr.strip() == (
        f"mmtx: {export} records no data set: choose one, e.g. data=coco data.val.annotations=..."
    ), cli.describe(evaluated)


def test_checkpoints_record_absolute_data_paths_and_eval_names_the_missing_ones(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started with ``data.val.annotations=mydata/x.json`` records where that is, so the
    checkpoint evaluates from any directory; files gone since are named, with how to give others."""
    from omegaconf import OmegaConf

    from mmtx.cli.common import absolute_data_paths
    from tests.bad_inputs import write_tiny_checkpoint

    monkeypatch.chdir(tmp_path)
    cfg = compose_train(["data=coco", "data.max_length=24", *(f"data.{s}.{f}=mydata/{s}_{f}" for s in ("train", "val")
                                        for f in ("annotations", "images"))])  # fmt: skip (24: the tiny model's)
    absolute_data_paths(cfg.data)
    assert cfg.data.val.annotations == str(tmp_path / "mydata" / "val_annotations")
    assert cfg.data.train.images == str(tmp_path / "mydata" / "train_images")

    ckpt = write_tiny_checkpoint(tmp_path / "run" / "last.ckpt")
    contents = torch.load(ckpt, weights_only=True)
    torch.save({**contents, DATA_KEY: OmegaConf.to_container(cfg.data, resolve=True)}, ckpt)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = cli.run("mmtx-eval", f"ckpt={ckpt}", cwd=elsewhere, check=False)
    assert result.returncode == 1, cli.describe(result)
    assert result.stderr.strip() == (
        f"mmtx: {ckpt} was trained on data files that are not here (annotations={tmp_path}/mydata/val_annotations, "
        f"images={tmp_path}/mydata/val_images); give the data to evaluate on, e.g. data=coco "
        "data.val.annotations=FILE data.val.images=DIR"
    )


def test_a_checkpoint_recording_a_data_module_this_mmtx_lacks_is_named_with_the_override(
    cli, tmp_path: Path
) -> None:
    """A checkpoint from before a data module moved (say ``mmtx.data.datamodule.CocoCaptions``):
    one line naming it and the data to give, not a traceback."""
    from tests.bad_inputs import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "old.ckpt")
    contents = torch.load(ckpt, weights_only=True)
    old = {"_target_": "mmtx.data.datamodule.CocoCaptions", "image_size": 32, "val": None}
    torch.save({**contents, DATA_KEY: old}, ckpt)
    result = cli.run("mmtx-eval", f"ckpt={ckpt}", cwd=tmp_path, check=False)
    assert result.returncode == 1, cli.describe(result)
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and message.startswith(f"mmtx: {ckpt} records a data module this mmtx cannot build")
    assert "mmtx.data.datamodule.CocoCaptions" in message and "data=coco data.val.annotations=FILE" in message


# ------------------------------------------------------------------- 5. overrides and multirun


@pytest.mark.slow
def test_multirun_sweeps_seeds_into_numbered_jobs(cli, tiny: list[str], tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cli.run(
        "mmtx-train", "-m", "seed=0,1", *tiny, "trainer.max_steps=2", "logger=none", "data.batch_size=16",
        f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )
    weights = []
    for job, seed in ((0, 0), (1, 1)):
        ckpt = read_checkpoint(sweep / str(job) / "checkpoints" / "last.ckpt")
        assert ckpt["global_step"] == 2
        assert f"seed={seed}" in (sweep / str(job) / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((sweep / str(job) / "metrics.json").read_text())["steps"] == 2
        weights.append(ckpt["state_dict"])
    assert any(not weights[0][k].equal(weights[1][k]) for k in weights[0])  # the seed reached the weights
    assert (sweep / "multirun.yaml").is_file()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_wrong_overrides_fail_with_a_message_naming_them(cli, tiny: list[str], tmp_path: Path) -> None:
    common = [*tiny, "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    bad_key, bad_value = cli.run_many(
        ("mmtx-train", *common, "model.encoder.nonsense=1"),
        ("mmtx-train", *common, "model.encoder.pos_embed=alibi"),
        cwd=tmp_path, check=False,
    )
    assert bad_key.returncode != 0, cli.describe(bad_key)
    assert "model.encoder.nonsense" in bad_key.stderr + bad_key.stdout
    assert bad_value.returncode != 0, cli.describe(bad_value)
    message = bad_value.stderr + bad_value.stdout
    assert "alibi" in message and "pos_embed" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_help_lists_the_config_groups(cli, tmp_path: Path) -> None:
    result = cli.run("mmtx-train", "--help", cwd=tmp_path)
    groups = result.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    options = {
        line.split(":", 1)[0].strip(): {o.strip() for o in line.split(":", 1)[1].split(",")}
        for line in groups.splitlines() if ":" in line and not line.startswith("Compose")
    }  # fmt: skip
    for group in ("task", "model", "data", "trainer", "logger", "callbacks", "experiment", "debug"):
        assert group in options, groups
    assert {"caption"} <= options["task"]
    assert {"shapes", "coco", "karpathy"} <= options["data"]
    assert {"cpu", "gpu"} <= options["trainer"]
    assert {"wandb", "csv", "none"} <= options["logger"]
    assert "seed: 0" in result.stdout  # and the config, with its defaults


def test_too_few_examples_for_one_batch_fail_naming_the_batch_size(cli, tiny: list[str], tmp_path: Path) -> None:
    """A training split smaller than one batch would train 0 steps and exit 0: it must fail instead."""
    result = cli.run(
        "mmtx-train", *tiny, "logger=none", "data.num_train=6", "data.batch_size=64",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, check=False,
    )
    assert result.returncode == 1, cli.describe(result)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mmtx: data.batch_size=64: the training split has ") and "or less" in last, last
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_preset_on_a_cpu_machine_fails_before_touching_the_data(cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = cli.run("mmtx-train", "trainer=gpu", f"paths.data_dir={data}", f"hydra.run.dir={tmp_path / 'run'}",
                     cwd=tmp_path, check=False)
    assert result.returncode == 1, cli.describe(result)
    assert "trainer.accelerator=gpu: this machine has no GPU" in result.stderr and "trainer=cpu" in result.stderr
    assert not data.exists()


@pytest.mark.parametrize("app", ["mmtx-eval", "mmtx-caption", "mmtx-vqa", "mmtx-export"])
def test_help_of_each_inference_command_says_what_it_does_with_examples(cli, app: str, tmp_path: Path) -> None:
    result = cli.run(app, "--help", cwd=tmp_path)
    first = result.stdout.lstrip().splitlines()[0]
    assert first.startswith(f"{app}: ") and len(first) > len(app) + 30, first
    examples = result.stdout.split("Examples:", 1)[1]
    assert f"{app} ckpt=" in examples
    assert "powered by Hydra" not in result.stdout and "Configuration groups" not in result.stdout
    assert "ckpt: ???" in result.stdout  # and its settings


def test_vqa_with_an_image_and_no_question_is_one_line_before_loading(cli, tmp_path: Path) -> None:
    result = cli.run("mmtx-vqa", "ckpt=missing.ckpt", "image=a.jpg", cwd=tmp_path, check=False)
    assert result.returncode == 1, cli.describe(result)
    assert result.stderr.strip() == 'mmtx: give image=FILE question="..." or questions=FILE.json images=DIR (given: image)'


def _probe_script():
    spec = importlib.util.spec_from_file_location(
        "mmtx_probe_shape_kinds", Path(__file__).resolve().parents[1] / "scripts" / "probe_shape_kinds.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kind_probe_reads_a_kind_that_is_in_the_features_and_not_one_that_is_not() -> None:
    probe = _probe_script()
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(200, 2, generator=g) > 0.5).float()
    noise = torch.randn(200, 6, generator=g)
    features = torch.cat([noise, labels[:, :1] + 0.1 * torch.randn(200, 1, generator=g)], dim=1)  # kind 0 only
    seen, unseen = probe.probe_accuracy(features[:150], labels[:150], features[150:], labels[150:])
    assert seen == 1.0
    assert unseen < 0.8


def test_kind_probe_script_trains_a_fresh_vision_stream_on_the_kinds_as_a_reference(capsys) -> None:
    probe = _probe_script()
    assert probe.main(["--fresh", "1", "--train", "24", "--val", "12", "--image-size", "32"]) == 0
    result = json.loads(capsys.readouterr().out)
    shares = result["fresh encoder, 1 s on the kinds"]
    assert len(shares) == 3 and all(0.0 <= s <= 1.0 for s in shares)
    # --override reaches the fresh stream's config: a variant of it is probed under its own name
    small = ["--fresh", "1", "--train", "24", "--val", "12", "--image-size", "32", "--override", "model.backbone.vision.depth=0"]
    assert probe.main(small) == 0
    assert "fresh encoder model.backbone.vision.depth=0, 1 s on the kinds" in json.loads(capsys.readouterr().out)
    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        probe.main([*small[:-1], "model.backbone.vision.no_such_key=1"])
    with pytest.raises(SystemExit):  # nothing to probe
        probe.main(["--train", "24"])
    assert "give checkpoints to probe, --fresh SECONDS, or both" in capsys.readouterr().err


def test_kind_probe_script_scores_a_captioner_checkpoint(trained: Run, capsys) -> None:
    probe = _probe_script()
    assert probe.main([str(trained.last), "--train", "24", "--val", "12", "--image-size", "32"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kinds"] == ["circle", "square", "triangle"]
    for shares in (result["majority"], result[str(trained.last)]):
        assert len(shares) == 3 and all(0.0 <= s <= 1.0 for s in shares)
