"""scripts/learning_curves.py end to end on tiny two-stream runs: a variant is pretrained and
fine-tuned alike, and finished runs are reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "learning_curves.py"
TINY_TWO_STREAM = (
    "model.backbone.vision.dim=32 model.backbone.vision.depth=1 model.backbone.vision.num_heads=2 "
    "model.backbone.text.dim=32 model.backbone.text.depth=1 model.backbone.text.num_heads=2 "
    "model.backbone.joint_dim=32 model.backbone.co_layers=1"
)


def _run(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    common = [
        "--minutes",
        "0.05",
        "--seeds",
        "1",
        "--num-train",
        "24",
        "--num-val",
        "12",
        "--val-every",
        "100000",
        "--out",
        str(out),
        "--set",
        "data.image_size=32",
        "trainer.precision=32-true",
    ]
    return subprocess.run(
        [sys.executable, str(SCRIPT), *common, *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_a_variant_is_fine_tuned_from_its_own_pretraining(tmp_path: Path) -> None:
    out = tmp_path / "curves"
    # a pretraining objective's weight goes to the pretraining run only: the VQA task has no such key
    variant = f"tiny={TINY_TWO_STREAM} pretrain:task.objectives.mpm=0.5"
    done = _run("--tasks", "pretrain,vqa_from_pretrain", "--only-variants", "--variant", variant, out=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pretrained = out / "runs" / "pretrain-tiny-seed0" / "checkpoints" / "last.ckpt"
    assert f"init_from={pretrained}" in done.stdout
    results = json.loads((out / "curves.json").read_text())
    assert set(results["tasks"]) == {"pretrain", "vqa_from_pretrain"}
    for task, keys in (("pretrain", {"itm_accuracy", "i2t_R@1", "t2i_R@1"}), ("vqa_from_pretrain", {"accuracy"})):
        run = results["tasks"][task]["tiny"]["seeds"]["0"]
        assert keys <= set(run["final"]) and run["steps"] > 0, (task, run)
    assert results["tasks"]["pretrain"]["tiny"]["overrides"] == [*TINY_TWO_STREAM.split(), "task.objectives.mpm=0.5"]
    assert results["tasks"]["vqa_from_pretrain"]["tiny"]["overrides"] == TINY_TWO_STREAM.split()
    pretrain_config = (out / "runs" / "pretrain-tiny-seed0" / ".hydra" / "config.yaml").read_text()
    assert "mpm: 0.5" in pretrain_config

    again = _run("--tasks", "vqa_from_pretrain", "--only-variants", "--variant", variant, out=out)
    assert again.returncode == 0 and "reusing" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]


def test_fine_tuning_without_its_pretraining_names_the_run_it_needs(tmp_path: Path) -> None:
    done = _run(
        "--tasks",
        "vqa_from_pretrain",
        "--only-variants",
        "--variant",
        "wide=model.backbone.vision.dim=64",
        out=tmp_path / "curves",
    )
    assert done.returncode != 0
    assert "pretrain-wide-seed0" in done.stderr and "--tasks pretrain (variant wide)" in done.stderr
