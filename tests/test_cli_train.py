"""mmtx-train end to end: the run directory, checkpoints and CSV log of the tiny captioner trained
in-process (the shared fixture ``trained``), the installed command resuming it with W&B (offline)
and CSV logging, and loggers that change nothing that is trained or generated."""

from __future__ import annotations

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
from PIL import Image

from mmtx.checkpoint import read_checkpoint
from mmtx.data.tokenizer import Tokenizer
from tests.helpers import (
    CAPTION_METRICS,
    STEPS_PER_EPOCH,
    TRAIN,
    Run,
    assert_caption_metrics,
    csv_rows,
    logged,
    table_row,
)

# the shared run's continuation: through the end of the next epoch (a validation at step 40) into the one after
RESUME_STOP = 2 * STEPS_PER_EPOCH + 4


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


# ---------------------------------------------------------------------------- the in-process run


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


def test_training_reduces_the_loss(trained: Run) -> None:
    losses = logged(csv_rows(trained.dir), "train/loss")
    assert [step for step, _ in losses] == list(range(STEPS_PER_EPOCH))  # log_every_n_steps=1
    first, last = losses[0][1], losses[-1][1]
    vocab = Tokenizer.from_file(trained.dir / "tokenizer.json").vocab_size
    assert abs(first - math.log(vocab)) < 0.5  # starts near a uniform guess over the vocabulary
    assert last < first - 0.5, losses


def test_a_resumed_run_does_not_read_its_init_from_again(cli, trained: Run, tiny: list[str], tmp_path: Path) -> None:
    """A run started from another's weights (``init_from=``) resumes from its own checkpoint, which
    holds every weight, though the run it started from is gone: the command that started it,
    ``ckpt_path=`` added, still works."""
    gone = tmp_path / "warm-up" / "checkpoints" / "last.ckpt"  # deleted since the run started
    stop = STEPS_PER_EPOCH + 2
    result = cli.run(
        "mmtx-train", *tiny, *TRAIN, "logger=csv", f"init_from={gone}", f"ckpt_path={trained.last}",
        "trainer.max_epochs=10", f"trainer.max_steps={stop}", "trainer.limit_val_batches=0", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == stop
    assert f"init_from={gone} not read: the run resumes from ckpt_path={trained.last}" in result.stdout + result.stderr

    # a new run (no ckpt_path=) still refuses the missing file before any work
    new = cli.run("mmtx-train", *tiny, *TRAIN, f"init_from={gone}", f"hydra.run.dir={tmp_path / 'new'}",
                  cwd=tmp_path, check=False)  # fmt: skip
    assert new.returncode != 0 and f"init_from={gone}: no such checkpoint file" in new.stdout + new.stderr


# ------------------------------------------------------------------- mmtx-train with W&B offline


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
        "path": None,
        "kind": "wordpiece",
        "vocab_size": 60,
        "min_frequency": 1,
        "add_words": False,
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


# ---------------------------------------------------------------------------------------- resume


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
    assert steps == list(range(STEPS_PER_EPOCH, RESUME_STOP))
    # validated at the epoch end and again on the final weights
    assert len(logged(rows, "val/CIDEr")) == 2
