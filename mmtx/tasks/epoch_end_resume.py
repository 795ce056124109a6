"""Resuming from a checkpoint written at an epoch's end as from the start of the next epoch.

``last.ckpt`` is written at every training epoch's end (``on_train_epoch_end``), when Lightning's
fit loop has counted the epoch processed but not yet completed. Resumed, Lightning (2.6) completes
that epoch only when ``trainer.max_steps`` is unset: with it set (iteration-based training) it
restarts the finished epoch, trains one more batch in it and goes on with the epoch after the
next, so the resumed run trains other batches than the uninterrupted one and, bounded by
``trainer.max_epochs`` too, stops after that one batch, an epoch early. Lightning issue #19617
is the case next to it.

Two steps give both kinds of run the state Lightning itself restores when training is not
iteration-based: `start_next_epoch` rewrites the checkpoint's loop counters to those of an epoch
completed and the next not begun, before Lightning restores its loops from them; then, when
training starts, `begin_epoch_afresh` tells the training epoch loop that it is not restarting, so
it begins that epoch as a fresh one (with ``max_steps`` set, Lightning marks every loop
restarting, and a restarting epoch loop would spend its first iteration on a validation it then
skips, counting one step too many for the logs).
"""

from __future__ import annotations

from typing import Any

import lightning as L


def _zero_current(progress: dict[str, Any]) -> None:
    """A progress counter's ``current`` part set to zero (Lightning's ``reset_on_run``)."""
    progress["current"] = dict.fromkeys(progress["current"], 0)


def start_next_epoch(checkpoint: dict[str, Any]) -> bool:
    """Where ``checkpoint`` was written at the end of a training epoch that ran its last batch, its
    fit loop's counters become those of the next epoch's start (in place); returns whether they did.

    Checkpoints written anywhere else are left to Lightning: mid-epoch, after a batch (the epoch's
    last one included), at an epoch that ``max_steps``, ``max_time`` or a stop request ended early,
    or with no loops at all.
    """
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


def begin_epoch_afresh(trainer: L.Trainer) -> None:
    """The training epoch loop (and its validation loop) not restarting: the next epoch begins as
    a fresh one. Called when training starts, after a checkpoint `start_next_epoch` rewrote."""
    trainer.fit_loop.epoch_loop.restarting = False
