"""FLOPs of one training step of any ``mmtx-train`` configuration, counted on the CPU.

The run's own code path (data module, task, Lightning's loop) takes one step of the given config
in fp32 under PyTorch's ``FlopCounterMode`` (forward and backward: every matrix product, the CPU's
flash attention kernels included, as ``scripts/bench.py`` counts them). Prints one JSON line with
the FLOPs per step and per image; multiplied by the images per second that Lightning's
ThroughputMonitor logs for a real run (docs/gpu.md), they give that run's model FLOP
utilisation. Text is padded to the longest caption of the batch, so a small batch counts its
decoder on shorter sequences than a large one does (a lower bound; the image side is exact)::

    python scripts/train_step_flops.py experiment=pretrain_shapes data.image_size=224 data.batch_size=2 ...
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.flop_counter import FlopCounterMode


class CountFlops(L.Callback):
    """Counts the FLOPs of the first training batch (forward, loss and backward) and writes them,
    with the batch's image count, to ``path`` as JSON."""

    def __init__(self, path: str) -> None:
        from bench_hardware import cpu_flash_attention_flops  # the FLOP table's missing CPU kernels

        self.path = Path(path)
        self.counter = FlopCounterMode(display=False, custom_mapping=cpu_flash_attention_flops())
        self.images = 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == 0 and batch_idx == 0:
            self.images = len(batch["images"])
            self.counter.__enter__()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if trainer.global_step == 0:  # backward done; the optimizer's arithmetic is not the model's
            self.counter.__exit__(None, None, None)
            self.path.write_text(json.dumps({"flops": self.counter.get_total_flops(), "images": self.images}))


def main(overrides: list[str]) -> dict[str, Any]:
    """One fp32 training step of ``mmtx-train OVERRIDES`` on the CPU, counted: FLOPs per step and
    per image."""
    from tests.helpers import train_in_process

    with tempfile.TemporaryDirectory() as out:
        counted = Path(out) / "flops.json"
        train_in_process(
            [
                *overrides,
                "trainer=cpu",
                "trainer.precision=32-true",
                "trainer.max_time=null",
                "trainer.max_steps=1",
                "trainer.accumulate_grad_batches=1",
                "trainer.limit_val_batches=0",
                "trainer.num_sanity_val_steps=0",
                "trainer.enable_progress_bar=false",
                "logger=none",
                f"paths.output_dir={out}",
                "+callbacks.flops._target_=train_step_flops.CountFlops",
                f"+callbacks.flops.path={counted}",
            ]
        )
        step = json.loads(counted.read_text())
    return {
        "flops_per_step": step["flops"],
        "images_per_step": step["images"],
        "gflops_per_image": round(step["flops"] / step["images"] / 1e9, 3),
        "overrides": overrides,
    }


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # bench, this module; tests.helpers
    print(json.dumps(main(sys.argv[1:])))
