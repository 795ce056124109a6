"""Activation checkpointing under any strategy: each transformer block's activations are dropped
after its forward pass and recomputed in the backward pass (less memory, more compute)."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmtx.nn.blocks import BLOCKS

log = logging.getLogger("mmtx")


class _CheckpointedWhenTraining:
    """A block's ``forward``: checkpointed where a backward pass will follow (the block in training
    mode, gradients on), the plain forward for evaluation, ``torch.no_grad`` and cached decoding.

    Non-reentrant ``torch.utils.checkpoint``: the RNG state is restored before the recompute, so
    dropout draws the same masks. It calls whatever ``forward`` the block had, a compiled one too.
    """

    def __init__(self, block: nn.Module, forward: Any, **options: Any) -> None:
        self.block, self.forward, self.options = block, forward, options

    def __call__(self, *args: Any, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        if cache is not None:  # cached decoding (only blocks with self-attention take a cache)
            return self.forward(*args, cache=cache, **kwargs)
        if not (self.block.training and torch.is_grad_enabled()):
            return self.forward(*args, **kwargs)
        return checkpoint(self.forward, *args, use_reentrant=False, **self.options, **kwargs)


def checkpoint_blocks(model: nn.Module, **options: Any) -> int:
    """Checkpoint every residual block (`mmtx.nn.blocks.BLOCKS`) in ``model`` in place (``options`` go to
    ``torch.utils.checkpoint.checkpoint``, e.g. ``preserve_rng_state``); parameter names and
    checkpoints are unchanged. Returns how many blocks."""
    blocks = [m for m in model.modules() if isinstance(m, BLOCKS)]
    for block in blocks:
        if not isinstance(block.forward, _CheckpointedWhenTraining):
            block.forward = _CheckpointedWhenTraining(block, block.forward, **options)  # type: ignore[method-assign]
    return len(blocks)


class CheckpointBlocks(L.Callback):
    """``activation_checkpointing=true`` in mmtx-train: the task's transformer blocks are
    checkpointed when training is set up. Under FSDP the strategy checkpoints each unit itself
    (``trainer.strategy.activation_checkpointing`` follows the same key), so this does nothing."""

    def __init__(self, enabled: bool = True, **options: Any) -> None:
        self.enabled, self.options = enabled, options

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not (self.enabled and stage == "fit"):
            return
        if isinstance(trainer.strategy, FSDPStrategy):
            log.info("activation checkpointing: left to FSDP, per unit (trainer.strategy.activation_checkpointing)")
            return
        count = checkpoint_blocks(pl_module.model, **self.options)
        log.info("activation checkpointing: %d transformer blocks recomputed in the backward pass", count)
