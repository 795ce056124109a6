"""The real training loop against its step alone: how much of the step's speed a run keeps.

``mmtx-train OVERRIDES`` runs as typed (data module, task, Lightning's loop, the default callbacks),
watched by one callback, and prints one JSON line::

    python scripts/bench_loop.py --steps 30 -- trainer=gpu model=caption_base data.image_size=224 data.batch_size=128

1. ``--warmup`` steps, untimed;
2. ``--steps`` steps timed between two device synchronisations: the loop's examples per second;
3. ``--profile`` steps; on a GPU under ``torch.profiler`` and the sync debug mode: the GPU
   busy fraction (the union of its kernels' and copies' intervals over those steps' wall clock)
   and each place where the host waited for the device, with its count;
4. on the last batch, already on the device and prepared, the step alone ``--steps`` times:
   ``training_step``, backward, the task's gradient hooks, clipping as the trainer clips, the
   optimizer's step (Lightning's loop, data and callbacks left out).

``loop_over_step`` is the first rate over the last. Between the steps the host also fetches the
next batch: ``host_between_steps_ms`` is its time from one step's end to the next one's start.
Counts are of examples (a VQA batch's questions) and images (distinct images per batch).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class LoopBench(L.Callback):
    """Times the loop, profiles it and then times the step alone (see the module's docstring);
    writes the figures as JSON to ``path``."""

    def __init__(self, path: str, warmup: int, steps: int, profile: int) -> None:
        self.path, self.warmup, self.steps, self.profile = Path(path), warmup, steps, profile
        self.result: dict[str, Any] = {}
        self.gaps: list[float] = []
        self._ended: float | None = None
        self._profiler: Any = None
        self._warnings: Any = None
        self._caught: list[warnings.WarningMessage] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        step, device = trainer.global_step, pl_module.device
        timed = self.warmup <= step < self.warmup + self.steps
        if self._ended is not None and timed and step > self.warmup:
            self.gaps.append(time.perf_counter() - self._ended)
        if step == self.warmup:
            sync(device)
            self._start = time.perf_counter()
            self.result.update(examples_per_batch=len(batch["input_ids"]), images_per_batch=len(batch["images"]))
        elif step == self.warmup + self.steps:
            sync(device)
            seconds = time.perf_counter() - self._start
            self.result.update(loop_ms_per_step=1000 * seconds / self.steps, loop_examples_per_s=self._rate(seconds))
            self._start_profile(device)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           idx: int) -> None:  # fmt: skip
        self._ended = time.perf_counter()
        if trainer.global_step == self.warmup + self.steps + self.profile:
            self._stop_profile(pl_module.device)
            self._step_alone(trainer, pl_module, batch)
            self.result["host_between_steps_ms"] = 1000 * sum(self.gaps) / max(len(self.gaps), 1)
            self.path.write_text(json.dumps(self.result))

    def _rate(self, seconds: float) -> float:
        return self.steps * self.result["examples_per_batch"] / seconds

    def _start_profile(self, device: torch.device) -> None:
        if device.type != "cuda":  # a CPU is never idle waiting for itself
            return
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        self._profiler.__enter__()
        self._profile_start = time.perf_counter()

    def _stop_profile(self, device: torch.device) -> None:
        if device.type != "cuda":
            return
        sync(device)
        wall_us = 1e6 * (time.perf_counter() - self._profile_start)
        self._profiler.__exit__(None, None, None)
        torch.cuda.set_sync_debug_mode(0)
        self._warnings.__exit__(None, None, None)
        sites = collections.Counter(
            f"{Path(w.filename).name}:{w.lineno}" for w in self._caught if "synchroniz" in str(w.message)
        )
        self.result["host_waits_per_step"] = {k: v / self.profile for k, v in sites.most_common()}
        intervals = sorted(
            (e.time_range.start, e.time_range.end)
            for e in self._profiler.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
        )
        busy, end = 0.0, float("-inf")
        for start, stop in intervals:  # the union of the device's intervals
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        self.result["gpu_busy"] = min(1.0, busy / wall_us)

    def _step_alone(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        optimizer, device = trainer.optimizers[0], pl_module.device

        def step() -> None:
            with trainer.precision_plugin.forward_context():
                loss = pl_module.training_step(batch, 0)
            loss.backward()
            pl_module.on_before_optimizer_step(optimizer)
            if trainer.gradient_clip_val:
                pl_module.configure_gradient_clipping(
                    optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(2):
            step()
        sync(device)
        start = time.perf_counter()
        for _ in range(self.steps):
            step()
        sync(device)
        seconds = time.perf_counter() - start
        self.result.update(step_ms=1000 * seconds / self.steps, step_examples_per_s=self._rate(seconds))
        self.result["loop_over_step"] = self.result["loop_examples_per_s"] / self.result["step_examples_per_s"]
        if device.type == "cuda":
            self.result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps, loop and step alone (default: %(default)s)")
    parser.add_argument("--profile", type=int, default=5, help="profiled loop steps (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", help="mmtx-train overrides (after --)")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1 or args.profile < 1:
        parser.error("--warmup, --steps and --profile must be at least 1")
    from tests.helpers import train_in_process

    with tempfile.TemporaryDirectory() as out:
        found = Path(out) / "loop.json"
        train_in_process(
            [
                *args.overrides,
                "trainer.max_time=null",
                "trainer.max_epochs=-1",
                f"trainer.max_steps={args.warmup + args.steps + args.profile}",
                "trainer.accumulate_grad_batches=1",
                "trainer.limit_val_batches=0",
                "trainer.num_sanity_val_steps=0",
                f"paths.output_dir={out}",
                "+callbacks.loop_bench._target_=bench_loop.LoopBench",
                f"+callbacks.loop_bench.path={found}",
                f"+callbacks.loop_bench.warmup={args.warmup}",
                f"+callbacks.loop_bench.steps={args.steps}",
                f"+callbacks.loop_bench.profile={args.profile}",
            ]
        )
        result = json.loads(found.read_text())
    import mmtx

    return {"overrides": args.overrides, "mmtx": str(Path(mmtx.__file__).parent), "torch": torch.__version__,
            "device": device_name(), **result}  # fmt: skip


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # this module; tests.helpers
    print(json.dumps(main(sys.argv[1:])))
