"""Reading checkpoints safely: ``weights_only=True`` always, clear errors, name-matched init."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import get_class
from torch import nn

log = logging.getLogger(__name__)

TASK_KEY = "mmtx_task"  # the task class's import path, written into every checkpoint
DATA_KEY = "mmtx_data"  # the resolved data config the task was trained on


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or not an mmtx checkpoint."""


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint's plain contents without executing code from it (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, pickle with code, foreign format ...
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a checkpoint (it holds a {type(ckpt).__name__})")
    return ckpt


def task_class(ckpt: dict[str, Any], path: str | Path) -> type[L.LightningModule]:
    """The LightningModule class that wrote ``ckpt`` (only classes from ``mmtx.tasks`` are allowed)."""
    name = ckpt.get(TASK_KEY)
    if not isinstance(name, str) or not name.startswith("mmtx.tasks."):
        raise CheckpointError(f"{path} was not written by an mmtx task (no valid '{TASK_KEY}' entry)")
    return get_class(name)


def load_task(path: str | Path, map_location: str | torch.device = "cpu") -> L.LightningModule:
    """Rebuild the trained task (model, tokenizer, settings) from its checkpoint, in eval mode."""
    return task_from_checkpoint(read_checkpoint(path), path).to(map_location).eval()


def task_from_checkpoint(ckpt: dict[str, Any], path: str | Path) -> L.LightningModule:
    """The task that wrote the already-read checkpoint ``ckpt``, with its weights."""
    cls = task_class(ckpt, path)
    task = cls(**ckpt.get("hyper_parameters", {}))
    missing, unexpected = task.load_state_dict(ckpt["state_dict"], strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match {cls.__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    task.data_config = ckpt.get(DATA_KEY)
    return task


def init_from(
    module: nn.Module, path: str | Path, renames: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Copy into ``module`` every weight of checkpoint ``path`` whose name and shape match.

    ``renames`` maps name prefixes of the checkpoint to this module's (e.g. a pretraining
    checkpoint's ``model.backbone.vision.`` to a captioner's ``model.encoder.``); names that no
    prefix matches are compared as they are. Returns (loaded, left as initialised) names.
    """
    state = read_checkpoint(path)
    state = state.get("state_dict", state)
    for old, new in (renames or {}).items():
        state = {new + k[len(old):] if k.startswith(old) else k: v for k, v in state.items()}
    own = module.state_dict()
    loaded = [k for k, v in state.items() if k in own and own[k].shape == v.shape]
    kept = set(loaded)
    skipped = [k for k in own if k not in kept]
    if not loaded:
        raise CheckpointError(f"init_from={path}: no parameter name and shape matches this model")
    module.load_state_dict({k: state[k] for k in loaded}, strict=False)
    log.info("init_from %s: loaded %d tensors, %d left as initialised", path, len(loaded), len(skipped))
    return loaded, skipped
