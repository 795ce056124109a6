"""scripts/gpu_step_screens.sh on the CPU (SCREEN_ACCELERATOR=cpu): each screen of a spec trains for
its own step budget, not the CPU preset's minutes, and the results come back packed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = (
    "model.encoder.dim=32 model.encoder.depth=1 model.encoder.num_heads=2 model.decoder.dim=32 "
    "model.decoder.depth=1 model.decoder.num_heads=2 data.image_size=32 data.batch_size=8"
)


def test_a_screen_trains_its_own_steps_and_seed(tmp_path: Path) -> None:
    (tmp_path / "spec").write_text(
        f"# a comment\n\nfive seed=1 trainer.max_steps=5 {TINY}\n"
        "ask --tasks vqa seed=0 trainer.max_steps=3 data.image_size=32 data.batch_size=8\n"
    )
    env = {
        **os.environ,
        "SCREEN_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "MMTX_DATA_DIR": str(tmp_path / "data"),
        "CURVES_ARGS": "--num-train 24 --num-val 8 --val-every 100000",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    done = subprocess.run(
        ["bash", "scripts/gpu_step_screens.sh", str(tmp_path / "spec"), str(tmp_path / "out"), "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = json.loads((tmp_path / "out" / "five" / "curves.json").read_text())["tasks"]["caption"]["five"]
    assert run["seeds"]["0"]["steps"] == 5 and "seed=1" in run["overrides"], run  # steps, not the CPU preset's minutes
    assert "five rc=0" in done.stdout and "ask rc=0" in done.stdout
    asked = json.loads((tmp_path / "out" / "ask" / "curves.json").read_text())["tasks"]["vqa"]["ask"]  # --tasks vqa
    assert asked["seeds"]["0"]["steps"] == 3, asked
    assert "warm_caption rc=0" in done.stdout and "warm_vqa rc=0" in done.stdout  # each task's data made once, first
    config = (tmp_path / "out" / "five" / "runs" / "caption-five-seed0" / ".hydra" / "config.yaml").read_text()
    assert "\nseed: 1\n" in config and "max_time: null" in config
    with tarfile.open(tmp_path / "out" / "screens.tgz") as packed:
        names = packed.getnames()
    assert (
        "./five/curves.json" in names and "./ask/curves.json" in names and not any(n.endswith(".ckpt") for n in names)
    )
