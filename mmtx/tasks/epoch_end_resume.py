"""Resuming from a checkpoint written at an epoch's end as from the start of the next epoch.

``last.ckpt`` is written at every training epoch's end (``on_train_epoch_end``), when Lightning's
fit loop has counted the epoch processed but not yet completed. Resumed, Lightning (2.6) completes
that epoch only when ``trainer.max_steps`` is unset: with it set (iteration-based training) it
restarts the finished epoch, trains one more batch in it, and goes on with the epoch after the
next, so the resumed run trains other batches than the uninterrupted one and stops a step into it
under ``trainer.max_epochs`` (the neighbouring case is Lightning issue #19617).
Rewriting the loop counters to those of an epoch completed and the next not begun makes both kinds
of run resume where they stopped: that is the state Lightning itself restores when training is not
iteration-based.
"""

from __future__ import annotations

from typing import Any


def _zero_current(progress: dict[str, Any]) -> None:
    """A progress counter's ``current`` part set to zero (Lightning's ``reset_on_run``)."""
    progress["current"] = dict.fromkeys(progress["current"], 0)


def start_next_epoch(checkpoint: dict[str, Any]) -> bool:
    """Where ``checkpoint`` was written at a training epoch's end, its fit loop's counters become
    those of the next epoch's start (in place); returns whether they did."""
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if not fit or "epoch_progress" not in fit:
        return False
    epochs = fit["epoch_progress"]
    total = epochs["total"]
    batches = fit.get("epoch_loop.batch_progress", {})
    at_epoch_end = total["ready"] == total["started"] == total["processed"] == total["completed"] + 1
    if not at_epoch_end or not batches.get("is_last_batch"):
        return False
    for part in ("total", "current"):
        epochs[part]["completed"] = epochs[part]["processed"]
    # what Lightning's training epoch loop resets when an epoch begins
    _zero_current(batches)
    batches["is_last_batch"] = False
    if "epoch_loop.scheduler_progress" in fit:
        _zero_current(fit["epoch_loop.scheduler_progress"])
    optim = fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {})
    for progress in optim.values():
        _zero_current(progress)
    return True
