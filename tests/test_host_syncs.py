"""A training step makes the host wait for the device once: the non-finite loss check.

Each wait stops the host until the GPU has caught up, so that it cannot prepare the next batch
meanwhile. A tensor's value read on the host (``item()``, ``bool()``, a shape that depends on
values: ``nonzero``, boolean indexing) waits, and so does a blocking copy of host data to the
device (``torch.tensor(x, device=...)``, ``.to(device)`` without ``non_blocking``). A CPU has
no such waits, but the calls that cause them run there too: one whole step of each task (its
batch fetched, moved and prepared, the step, every default callback), is watched for them.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import TINY_DATA, TINY_MODEL
from tests.helpers import TINY_TWO_STREAM, train_in_process

READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default"}


def site(what: str) -> str:
    frames = [f for f in traceback.extract_stack() if "/mmtx/" in f.filename or "lightning" in f.filename]
    return f"{what} at " + " <- ".join(f"{f.filename}:{f.lineno}" for f in frames[::-1][:6])


def caller() -> str:
    """The file of the code that called the torch function being watched."""
    machinery = ("/tests/", "/torch/overrides.py", "/torch/utils/_python_dispatch.py")
    frames = [f for f in traceback.extract_stack() if not any(m in f.filename for m in machinery)]
    return frames[-1].filename if frames else ""


class HostReads(TorchDispatchMode):
    """Where an operation needs a tensor's values on the host."""

    def __init__(self, sites: list[str]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        boolean_index = name.startswith("aten.index.Tensor") and any(
            t is not None and t.dtype == torch.bool for t in args[1]
        )
        if name in READS or boolean_index:
            self.sites.append(site(name))
        return func(*args, **(kwargs or {}))


class BlockingCopies(TorchFunctionMode):
    """Where host data goes to a device with the host waiting for it: a tensor made from Python
    values on a given device, or a host tensor's blocking ``.to(device)``."""

    def __init__(self, sites: list[str]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            self.sites.append(site(f"torch.{name}(..., device=)"))
        elif name in ("to", "cuda") and isinstance(args[0], torch.Tensor) and "/mmtx/" in caller():
            # mmtx's own copies (Lightning moves batches with non_blocking=True, except to a CPU)
            device = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
            if (device is not None or name == "cuda") and not kwargs.get("non_blocking", False):
                self.sites.append(site(f"Tensor.{name}(device)"))
        return func(*args, **kwargs)


class WatchStep(L.Callback):
    """Watches from the end of optimizer step 1 (not the first: one-time setup may wait) to the
    end of step 2, and writes the sites found to ``path``."""

    def __init__(self, path: str) -> None:
        self.path, self.sites = Path(path), []
        self.modes = (HostReads(self.sites), BlockingCopies(self.sites))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == 1:
            for mode in self.modes:
                mode.__enter__()
        elif trainer.global_step == 2:
            for mode in reversed(self.modes):
                mode.__exit__(None, None, None)
            self.path.write_text(json.dumps(self.sites))


TASKS = {
    "caption": TINY_MODEL,
    # every objective on, masked patches too
    "pretrain": ["experiment=pretrain_shapes", *TINY_TWO_STREAM, "task.objectives.mpm=1.0"],
    "vqa": ["experiment=vqa_shapes", *TINY_TWO_STREAM],
}


@pytest.mark.parametrize("task", TASKS)
def test_a_training_step_waits_for_the_device_once(task: str, data_dir: Path, tmp_path: Path) -> None:
    found = tmp_path / "sites.json"
    train_in_process(
        [
            *TASKS[task],
            *TINY_DATA,
            f"paths.data_dir={data_dir}",
            "trainer.enable_progress_bar=false",  # its own reads: test_first_hour.py
            "trainer.max_epochs=-1",
            "trainer.max_steps=3",
            "trainer.limit_val_batches=0",
            "trainer.num_sanity_val_steps=0",
            "logger=none",
            f"paths.output_dir={tmp_path}",
            "+callbacks.watch._target_=tests.test_host_syncs.WatchStep",
            f"+callbacks.watch.path={found}",
        ]
    )
    sites = json.loads(found.read_text())
    assert len(sites) == 1 and "mmtx/callbacks.py" in sites[0], "\n".join(sites)  # NonFiniteLoss, before the backward
