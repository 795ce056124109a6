"""AdamW with decay/no-decay groups and a linear-warmup cosine schedule, shared by every task."""

from __future__ import annotations

import math

import torch
from torch import nn

# parameters that are positions or special tokens: decaying them only shrinks information
NO_DECAY_NAMES = ("pos_embed", "cls_token", "mask_token")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: not on biases, norms, positions or special tokens."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or any(n in name for n in NO_DECAY_NAMES):
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the base LR, then a cosine decay to ``min_lr_ratio`` of it at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_optimizer(
    model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
    warmup_ratio: float, total_steps: int, min_lr_ratio: float,
) -> dict:
    """The ``configure_optimizers`` answer: AdamW + a per-step warmup-cosine schedule."""
    use_fused = next(model.parameters()).is_cuda
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), fused=use_fused)
    warmup = max(1, int(warmup_ratio * total_steps))
    scheduler = warmup_cosine(optimizer, warmup, total_steps, min_lr_ratio)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
