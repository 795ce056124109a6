"""scripts/bench_loop.py: the real training loop of mmtx-train against its step alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_DATA
from tests.helpers import TINY_TWO_STREAM

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("overrides", "questions_per_image"),
    [(["model.encoder.dim=32", "model.encoder.depth=1", "model.encoder.num_heads=2", "model.decoder.dim=32",
       "model.decoder.depth=1", "model.decoder.num_heads=2"], False),
     (["experiment=vqa_shapes", *TINY_TWO_STREAM], True)],
    ids=["caption", "vqa"],
)  # fmt: skip
def test_a_tiny_run_reports_the_loop_and_the_step(overrides: list[str], questions_per_image: bool,
                                                  tmp_path: Path) -> None:  # fmt: skip
    command = [sys.executable, str(ROOT / "scripts" / "bench_loop.py"), "--warmup", "2", "--steps", "3",
               "--profile", "1", "--", *overrides, *TINY_DATA, "data.batch_size=16", f"paths.data_dir={tmp_path}",
               "logger=none", "trainer=cpu", "trainer.precision=32-true"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["device"] == "cpu" and out["examples_per_batch"] == 16
    assert (out["images_per_batch"] < 16) == questions_per_image  # a VQA batch holds each image once
    for kind in ("loop", "step"):  # a rate and its time per step describe the same steps
        ms = out["loop_ms_per_step" if kind == "loop" else "step_ms"]
        assert abs(ms * out[f"{kind}_examples_per_s"] - 16_000) < 1e-6 * 16_000
    assert out["loop_over_step"] == pytest.approx(out["loop_examples_per_s"] / out["step_examples_per_s"])
    assert out["host_between_steps_ms"] > 0
