"""How far gradient accumulation is from the big batch for the contrastive loss (``itc``).

In a batch of B pairs each image is scored against B captions; accumulated micro-batches of B/2
give it B/2, so the loss and its gradients are not those of the big batch (gradient caching would
make them so; mmtx does not implement it). This trains ``task=pretrain`` with ``itc`` as the only
objective twice from one seed on the same data order, at batch B and at B/2 with
``trainer.accumulate_grad_batches=2``, and prints one JSON object: each optimizer step's training
loss (the mean of its micro-batches), the largest relative difference between the runs at a step,
the final step's loss of each, and each final model's validation ``itc_loss`` and retrieval
recall, scored alike (the same validation batches)::

    python scripts/accumulation_contrastive.py --batch 32 --steps 30 [OVERRIDES...]

Runs on the CPU in fp32, with a tiny two-stream model unless OVERRIDES change it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning as L

TINY = [
    "task=pretrain", "task.objectives.itc=1.0", "task.objectives.caption=0",
    "task.objectives.mlm=0", "task.objectives.mpm=0", "task.objectives.itm=0",
    "model.backbone.vision.dim=32", "model.backbone.vision.depth=1", "model.backbone.vision.num_heads=2",
    "model.backbone.vision.patch_size=8", "model.backbone.text.dim=32", "model.backbone.text.depth=1",
    "model.backbone.text.num_heads=2", "model.backbone.co_layers=1", "model.backbone.joint_dim=32", "model.itc_dim=32",
    "model.backbone.vision.stem=patch",  # no BatchNorm: its statistics over the micro-batch would differ too
    "data.image_size=32", "data.num_train=200", "data.num_val=40", "data.num_workers=0",
    "monitor.metric=val/i2t_R@1",  # the best checkpoint's metric: alignment accuracy needs itm
]  # fmt: skip


class StepLosses(L.Callback):
    """Appends each optimizer step's loss to ``path``, one line per step: the sum of its
    micro-batches' ``training_step`` losses, each of which Lightning divided by the number
    accumulated (so the mean over the micro-batches)."""

    def __init__(self, path: str) -> None:
        self.path, self.loss, self.step = Path(path), 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        self.loss += float(outputs["loss"])
        if trainer.global_step > self.step:  # the optimizer stepped after this micro-batch
            with self.path.open("a") as f:
                f.write(f"{self.loss}\n")
            self.loss = 0.0


def run(overrides: list[str], out: Path) -> dict[str, Any]:
    """One ``mmtx-train`` run in this process: its per-step losses, final validation loss and metrics."""
    from tests.helpers import train_in_process

    losses = out / "losses.txt"
    metrics = train_in_process([
        *overrides, f"paths.output_dir={out}", "logger=csv",
        "+callbacks.steps._target_=accumulation_contrastive.StepLosses", f"+callbacks.steps.path={losses}",
    ])  # fmt: skip
    with next(out.glob("csv/version_*/metrics.csv")).open() as f:
        val = [float(r["val/itc_loss"]) for r in csv.DictReader(f) if r.get("val/itc_loss")]
    return {"losses": [float(x) for x in losses.read_text().split()], "val_itc_loss": val[-1], "metrics": metrics}


def main(batch: int, steps: int, overrides: list[str]) -> dict[str, Any]:
    common = [
        *TINY, *overrides, "trainer=cpu", "trainer.precision=32-true", "trainer.max_time=null",
        f"trainer.max_steps={steps}", "trainer.num_sanity_val_steps=0", "trainer.limit_val_batches=1",
        f"data.eval_batch_size={batch}", "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON only
        big = run([*common, f"data.batch_size={batch}"], Path(tmp) / "big")
        acc = run([*common, f"data.batch_size={batch // 2}", "trainer.accumulate_grad_batches=2"], Path(tmp) / "acc")
    diffs = [abs(a - b) / abs(b) for a, b in zip(acc["losses"], big["losses"])]
    return {
        "batch": batch,
        "steps": steps,
        "overrides": overrides,
        "max_relative_difference": max(diffs),
        "at_step": diffs.index(max(diffs)),
        "final_loss": {"big": big["losses"][-1], "accumulated": acc["losses"][-1]},
        "val_itc_loss": {"big": big["val_itc_loss"], "accumulated": acc["val_itc_loss"]},
        "val_metrics": {"big": big["metrics"], "accumulated": acc["metrics"]},
        "losses": {"big": big["losses"], "accumulated": acc["losses"]},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="the big batch B (accumulated: 2 x B/2)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps of each run")
    args, overrides = parser.parse_known_args()
    if args.batch < 2 or args.batch % 2:
        parser.error(f"--batch={args.batch}: must be an even number >= 2")
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # this module; tests.helpers
    print(json.dumps(main(args.batch, args.steps, overrides), indent=1))
