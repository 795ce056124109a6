"""AdamW with decay/no-decay groups and a warm-up + cosine schedule over the run's budget of steps
or time, shared by every task."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer
from omegaconf import DictConfig, OmegaConf
from torch import nn

# parameters that are positions or special tokens: decaying them only shrinks information
NO_DECAY_NAMES = ("pos_embed", "cls_token", "mask_token")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: not on biases, norms, positions or special tokens; frozen
    parameters (``requires_grad=False``) in no group, so they get no optimizer state."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or any(n in name for n in NO_DECAY_NAMES):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]  # a frozen model part can leave one empty


def warmup_cosine(
    warmup_ratio: float,
    total_steps: float,
    min_lr_ratio: float = 0.0,
    time_progress: Callable[[], float] | None = None,
) -> Callable[[int], float]:
    """The LR factor at an optimizer step: linear warm-up to 1, then cosine decay to ``min_lr_ratio``.

    Progress is the fraction of the step budget done (``total_steps``; ``inf``: none) or, when the
    run has a time budget (``time_progress``: the fraction of ``trainer.max_time`` used), whichever
    is further along. So a run stopped by its deadline ends with a finished schedule instead of a
    cut one, and a run given both ends its schedule at whichever limit comes first. Warm-up covers
    ``warmup_ratio`` of the progress (at least one step). A plain function, not an object:
    ``LambdaLR`` would store an object's attributes in every checkpoint.
    """
    if not math.isfinite(total_steps) and time_progress is None:
        raise ValueError("a schedule needs a budget: trainer.max_steps, trainer.max_epochs or trainer.max_time")
    warmup_steps = max(1, int(warmup_ratio * total_steps)) if math.isfinite(total_steps) else None

    def factor(step: int) -> float:
        warm, progress = [], []  # per budget: warm-up done (0..1), decay progress after it
        if warmup_steps is not None:
            warm.append((step + 1) / warmup_steps)
            progress.append((step - warmup_steps) / max(1, total_steps - warmup_steps))
        if time_progress is not None:
            used = time_progress()
            warm.append(used / warmup_ratio if warmup_ratio > 0 else 1.0)
            progress.append((used - warmup_ratio) / (1 - warmup_ratio))
        done = min(1.0, max(0.0, *progress))
        decay = min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))
        return min(1.0, max(warm)) * decay

    return factor


def time_progress(trainer: L.Trainer) -> Callable[[], float] | None:
    """The fraction of ``trainer.max_time`` used so far (Lightning's ``Timer``; resumed runs
    count the time before the interruption), or None when the run has no time budget."""
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is None or timer._duration is None:
        return None
    duration = timer._duration
    return lambda: timer.time_elapsed() / duration


def budget_progress(trainer: L.Trainer) -> Callable[[int], float]:
    """``progress(step)``: how far the run is through its budget (0..1), steps over the step
    budget or time over ``trainer.max_time``, whichever is further along, as the LR schedule
    counts it. The budgets are read from the trainer once, here, not at every step."""
    total = float(trainer.estimated_stepping_batches)
    used = time_progress(trainer)

    def progress(step: int) -> float:
        done = [step / total] if math.isfinite(total) else []
        if used is not None:
            done.append(used())
        return min(1.0, max(done, default=0.0))

    return progress


def counted_budget(max_steps: Any, max_epochs: Any) -> bool:
    """Whether the trainer is given a budget in steps or epochs (-1 and None: none)."""
    return max_steps not in (None, -1) or max_epochs not in (None, -1)


def time_budget(budget: str | None, max_steps: Any, max_epochs: Any) -> str | None:
    """A preset's ``trainer.max_time`` (the ``${mmtx.time_budget:...}`` resolver): ``budget`` for a
    run given neither ``max_steps`` nor ``max_epochs``, else None. A step or epoch budget makes a
    run reproducible, and a deadline beside it would make the schedule and the stopping point
    follow the machine's pace; ``trainer.max_time=...`` given explicitly holds beside them."""
    return None if counted_budget(max_steps, max_epochs) else budget


def budget_note(trainer: DictConfig) -> tuple[int, str] | None:
    """The start-up line (logging level, message) on whether the run's budget makes it
    reproducible; None for a step or epoch budget alone where no preset deadline was dropped."""
    counted = [f"trainer.{k}={trainer.get(k)}" for k in ("max_steps", "max_epochs") if trainer.get(k) not in (None, -1)]
    max_time = trainer.get("max_time")
    if max_time is None and counted and OmegaConf.is_interpolation(trainer, "max_time"):
        return logging.INFO, (
            f"budget: {' and '.join(counted)}; the preset's time budget is off, so the learning-rate schedule "
            "and the stopping point do not depend on the machine's pace (trainer.max_time=DD:HH:MM:SS adds one)"
        )
    if max_time is not None and counted:
        return logging.WARNING, (
            f"budget: trainer.max_time={max_time} beside {' and '.join(counted)}: the learning-rate schedule and "
            "the stopping point follow whichever budget is further along, so they depend on the machine's pace and "
            "two runs of one seed can differ (trainer.max_time=null makes the run reproducible)"
        )
    if max_time is not None:
        return logging.INFO, (
            f"budget: trainer.max_time={max_time} of wall-clock time: the learning-rate schedule and the stopping "
            "point follow the clock, so the result depends on the machine's pace (trainer.max_steps=N or "
            "trainer.max_epochs=N makes the run reproducible)"
        )
    return None


def build_optimizer(
    model: nn.Module,
    trainer: L.Trainer,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    warmup_ratio: float,
    min_lr_ratio: float,
) -> dict:
    """The ``configure_optimizers`` answer: AdamW + a per-step warm-up/cosine schedule over the
    trainer's budget (steps, epochs and/or time)."""
    # the fused kernel updates every parameter in one pass (PyTorch's default on the CPU is a loop
    # over them, a visible share of a small model's step); not beside fp16's gradient scaler, with
    # which Lightning cannot clip gradients (see `mmtx.tasks.base.Task.configure_gradient_clipping`)
    scaled = getattr(trainer.precision_plugin, "scaler", None) is not None
    use_fused = next(model.parameters()).device.type in ("cuda", "cpu") and not scaled
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), fused=use_fused)
    factor = warmup_cosine(
        warmup_ratio, float(trainer.estimated_stepping_batches), min_lr_ratio, time_progress(trainer)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
