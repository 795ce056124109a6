"""``torch.compile`` where it pays: each transformer block's full-sequence pass."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from torch import nn

from mmtx.nn.blocks import BLOCKS

log = logging.getLogger("mmtx")

RECOMPILE_LIMIT = 32


class _CompiledUnlessCached:
    """A block's ``forward``: compiled for whole sequences, eager for cached decoding steps
    (whose growing cache would make the compiler specialise again at every step)."""

    def __init__(self, forward: Any, **options: Any) -> None:
        self.eager, self.compiled = forward, torch.compile(forward, **options)

    def __call__(self, *args: Any, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        if cache is not None:
            return self.eager(*args, cache=cache, **kwargs)
        return self.compiled(*args, **kwargs)


def compile_blocks(model: nn.Module, **options: Any) -> int:
    """Compile every residual block (`mmtx.nn.blocks.BLOCKS`) in ``model`` in place (``options`` go to
    ``torch.compile``); parameter names and checkpoints are unchanged. Returns how many."""
    blocks = [m for m in model.modules() if isinstance(m, BLOCKS)]
    for block in blocks:
        if not isinstance(block.forward, _CompiledUnlessCached):
            block.forward = _CompiledUnlessCached(block.forward, **options)  # type: ignore[method-assign]
    return len(blocks)


class CompileBlocks(L.Callback):
    """``compile=true`` in mmtx-train: the task's transformer blocks are compiled when training is
    set up (Lightning's hook for changing the model to train), not by the command after building."""

    def __init__(self, enabled: bool = True, **options: Any) -> None:
        self.enabled, self.options = enabled, options

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.enabled and stage == "fit":
            # every block shares one code object, compiled once per kind of call: encoder or
            # decoder, with or without gradients, training or frozen (`task.freeze`); more kinds
            # than the compiler's default limit would leave the rest uncompiled
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            log.info("torch.compile: %d transformer blocks", compile_blocks(pl_module.model, **self.options))
