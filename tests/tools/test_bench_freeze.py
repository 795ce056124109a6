"""scripts/bench_freeze.py: a frozen encoder saves activations, gradients and optimizer state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_run_prints_one_row_per_setting() -> None:
    command = [sys.executable, str(ROOT / "scripts" / "bench_freeze.py"), "--image-size", "32", "--batch", "2",
               "--steps", "1", "--warmup", "0", "--vocab", "50"]  # fmt: skip
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    none, encoder, last2 = (out["rows"][k] for k in ("none", "encoder", "encoder_but_last_2_blocks"))
    assert none["frozen_params"] == 0 and 0 < last2["frozen_params"] < encoder["frozen_params"] < none["params"]
    for key in ("saved_for_backward_bytes", "grad_bytes", "optimizer_state_bytes"):
        assert encoder[key] < last2[key] <= none[key], key
    trained = none["params"] - encoder["frozen_params"]
    assert encoder["grad_bytes"] == 4 * trained and encoder["optimizer_state_bytes"] >= 8 * trained
