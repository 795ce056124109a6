"""Data-parallel runs on the CPU (2 processes, gloo): the same training and the same metrics as one process."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import torch

from mmtx.checkpoint import read_checkpoint
from tests.helpers import csv_rows, draw_data, logged

# 21 validation images: not divisible by 2 processes (or by the evaluation batch of 4)
DATA = ["data.num_train=40", "data.num_val=21", "data.eval_batch_size=4"]
STEPS = 6


@pytest.fixture(scope="module")
def runs(cli, tiny: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One process with batch 16 and two processes with batch 8 each, from the same seed, at once."""
    root = tmp_path_factory.mktemp("ddp")
    common = [
        *tiny,
        *DATA,
        f"paths.data_dir={root / 'data'}",
        "logger=csv",
        "trainer.log_every_n_steps=1",
        f"trainer.max_steps={STEPS}",
        "trainer.limit_val_batches=0",  # these runs compare training; validation on 2 processes is tested below
        "data.crop_scale=[0.5,1.0]",
        "model.decoder.dropout=0",  # dropout masks are drawn per process: not comparable
    ]
    # the data set is drawn before the two runs start, so they don't both write it; each run, and
    # each of the two processes, learns its own vocabulary: the same one
    draw_data(common)
    dirs = {"one": root / "one", "two": root / "two"}
    cli.run_many(
        ("mmtx-train", *common, f"hydra.run.dir={dirs['one']}", "data.batch_size=16"),
        ("mmtx-train", *common, f"hydra.run.dir={dirs['two']}", "data.batch_size=8", "trainer=ddp_cpu"),
        cwd=root,
    )
    return dirs


@pytest.mark.slow
def test_ddp_follows_the_single_process_loss_trajectory(runs: dict[str, Path]) -> None:
    """Same global batch (2 x 8 = 16), same examples, same crops: the same losses step by step
    and the same weights at the end, up to float summation order."""
    one, two = (logged(csv_rows(runs[k]), "train/loss") for k in ("one", "two"))
    assert [s for s, _ in one] == [s for s, _ in two] and len(one) == STEPS
    losses = torch.tensor([[a for _, a in one], [b for _, b in two]])
    assert torch.allclose(losses[0], losses[1], rtol=1e-4, atol=1e-5), losses
    assert losses[0, -1] < losses[0, 0]

    a, b = (read_checkpoint(runs[k] / "checkpoints" / "last.ckpt") for k in ("one", "two"))
    assert a["global_step"] == b["global_step"] == STEPS
    for name, w in a["state_dict"].items():
        assert torch.allclose(w, b["state_dict"][name], rtol=1e-4, atol=1e-5), name


@pytest.mark.slow
def test_distributed_eval_equals_single_process_eval(cli, runs: dict[str, Path], tmp_path: Path) -> None:
    """21 validation images on 2 processes (one padded with a repeat): every image counted once,
    the same captions and the same metrics as one process."""
    ckpt = runs["one"] / "checkpoints" / "last.ckpt"
    results = {}
    # the second from the GPU's DDP preset moved to the CPU: it must compute as trainer=cpu does
    for name, extra in (("one", []), ("two", ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])):
        out = tmp_path / name
        run = cli.run(
            "mmtx-eval",
            f"ckpt={ckpt}",
            f"output={out}/metrics.json",
            f"predictions={out}/predictions.json",
            *extra,
            cwd=tmp_path,
        )
        members = re.findall(r"MEMBER: (\d+)/(\d+)", run.stdout + run.stderr)  # Lightning's line per process
        assert sorted(members) == ([] if name == "one" else [("1", "2"), ("2", "2")]), members
        results[name] = (
            json.loads((out / "metrics.json").read_text()),
            json.loads((out / "predictions.json").read_text()),
        )
    (m1, p1), (m2, p2) = results["one"], results["two"]
    assert len(p1) == 21 and sorted(p["image_id"] for p in p2) == sorted(p["image_id"] for p in p1)
    assert sorted(p1, key=lambda p: p["image_id"]) == sorted(p2, key=lambda p: p["image_id"])
    assert m1 == m2


def _ddp_run(cli, tiny: list[str], run_dir: Path, *extra: str, check: bool = True):
    return cli.run(
        "mmtx-train", *tiny, *DATA, f"paths.data_dir={run_dir.parent / 'data'}", "trainer=ddp_cpu", "logger=csv",
        "trainer.log_every_n_steps=1", f"trainer.max_steps={STEPS}", "trainer.limit_val_batches=1",
        "data.batch_size=8", f"hydra.run.dir={run_dir}", *extra, cwd=run_dir.parent, check=check,
    )  # fmt: skip


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_and_saves(cli, tiny: list[str], tmp_path: Path, repo_on_path) -> None:
    """SIGTERM to the second process only (at the end of step 3): both agree to stop after the
    step in flight, last.ckpt holds it, and the run exits as a preempted one."""
    stopped = _ddp_run(cli, tiny, tmp_path / "run", "+callbacks.fault._target_=tests.helpers.SignalAtStep",
                       "+callbacks.fault.step=3", "+callbacks.fault.signal=SIGTERM", "+callbacks.fault.rank=1",
                       check=False)  # fmt: skip
    assert stopped.returncode == 128 + signal.SIGTERM, cli.describe(stopped)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert f"stopped by SIGTERM at step 4; saved {last}" in stopped.stderr  # the step in flight at the notice
    assert read_checkpoint(last)["global_step"] == 4


@pytest.mark.slow
def test_a_nonfinite_loss_in_one_process_is_skipped_by_both(cli, tiny: list[str], tmp_path: Path, repo_on_path) -> None:
    """A NaN loss on the second process only, with callbacks.nonfinite_loss.action=skip: both drop
    that update (or DDP's averaged gradient would make every weight NaN), training goes on, and
    train/skipped_steps is logged."""
    _ddp_run(
        cli,
        tiny,
        tmp_path / "run",
        "callbacks.nonfinite_loss.action=skip",
        "+callbacks.nan._target_=tests.helpers.NanImagesAtStep",
        "+callbacks.nan.step=2",
        "+callbacks.nan.rank=1",
    )
    last = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert last["global_step"] == STEPS
    assert all(torch.isfinite(w).all() for w in last["state_dict"].values() if w.is_floating_point())
    skipped = logged(csv_rows(tmp_path / "run"), "train/skipped_steps")
    assert skipped[0] == (2, 1.0) and {v for _, v in skipped} == {1.0}, skipped  # skipped so far: one, at step 2
