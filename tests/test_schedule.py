"""The LR schedule over a budget of steps or of time, and what a time-budgeted run logs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from mmtx.tasks.optim import warmup_cosine
from tests.helpers import train_in_process


def old_warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """The step-budget schedule as it was before time budgets existed."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def test_step_budget_is_unchanged() -> None:
    factor = warmup_cosine(0.05, 400.0, 0.01)
    for step in range(0, 420, 7):
        assert factor(step) == pytest.approx(old_warmup_cosine(step, 20, 400, 0.01), abs=1e-12)


def test_time_budget_warms_up_then_anneals_to_the_deadline() -> None:
    used = [0.0]
    factor = warmup_cosine(0.1, math.inf, 0.01, time_progress=lambda: used[0])
    used[0] = 0.05
    assert factor(3) == pytest.approx(0.5)  # half-way through the warm-up, whatever the step
    used[0] = 0.1
    assert factor(50) == pytest.approx(1.0)
    used[0] = 0.55  # half of the decay
    assert factor(100) == pytest.approx(0.01 + 0.99 * 0.5)
    used[0] = 1.0
    assert factor(200) == pytest.approx(0.01)
    used[0] = 1.3  # past the deadline (the step that stops the run): the floor, not a new cycle
    assert factor(201) == pytest.approx(0.01)


def test_with_both_budgets_the_schedule_follows_the_one_further_along() -> None:
    used = [0.0]
    factor = warmup_cosine(0.0, 1000.0, 0.0, time_progress=lambda: used[0])
    used[0] = 0.5
    assert factor(100) == pytest.approx(0.5)  # time is further along than 100/1000 steps
    used[0] = 0.01
    assert factor(900) == pytest.approx(old_warmup_cosine(900, 1, 1000, 0.0))


def test_no_budget_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_time"):
        warmup_cosine(0.05, math.inf, 0.01)


def test_a_time_budgeted_run_ends_its_schedule_and_logs_minutes(tiny: list[str], tmp_path: Path) -> None:
    """trainer.max_time alone (no step or epoch limit): the run stops by itself at the deadline
    and its last learning rate is the schedule's floor (no validation inside the budget here: a
    validation's time jumps the schedule forward between two steps)."""
    metrics = train_in_process([
        *tiny, "logger=csv", "trainer.max_epochs=-1", "trainer.max_time=00:00:00:12",
        "trainer.val_check_interval=100000", "trainer.check_val_every_n_epoch=null", "trainer.log_every_n_steps=1",
        "task.min_lr_ratio=0.05", f"paths.output_dir={tmp_path}",
    ])
    assert "CIDEr" in metrics
    rows = list(csv.DictReader(open(next(tmp_path.glob("csv/version_*/metrics.csv")))))
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    assert len(lrs) > 10 and max(lrs) > 5 * lrs[-1]
    assert lrs[-1] == pytest.approx(0.05 * 1e-3, rel=0.5)  # annealed to the floor by the deadline
