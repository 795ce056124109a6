"""The LR schedule over a budget of steps or of time, and what a time-budgeted run logs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from mmtx.tasks.base import Task
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
    metrics = train_in_process(
        [
            *tiny,
            "logger=csv",
            "trainer.max_epochs=-1",
            "trainer.max_time=00:00:00:12",
            "trainer.val_check_interval=100000",
            "trainer.check_val_every_n_epoch=null",
            "trainer.log_every_n_steps=1",
            "task.lr=1e-3",
            "task.min_lr_ratio=0.05",
            f"paths.output_dir={tmp_path}",
        ]
    )
    assert "CIDEr" in metrics
    rows = list(csv.DictReader(open(next(tmp_path.glob("csv/version_*/metrics.csv")))))
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    assert len(lrs) > 10 and max(lrs) > 5 * lrs[-1]
    assert lrs[-1] == pytest.approx(0.05 * 1e-3, rel=0.5)  # annealed to the floor by the deadline


class _TinyTask(Task):
    """One linear layer under a task's optimizer and schedule, its gradients blown up."""

    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters(
            dict(lr=1e-3, weight_decay=0.0, betas=(0.9, 0.98), warmup_ratio=0.0, min_lr_ratio=0.1)
        )
        self.model = torch.nn.Linear(4, 4)
        self.norms: list[float] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return 1e3 * self.model(batch["images"]).square().mean()

    def configure_optimizers(self) -> dict:
        answer = super().configure_optimizers()
        norm = lambda *_: self.norms.append(math.hypot(*(p.grad.norm().item() for p in self.model.parameters())))  # noqa: E731
        answer["optimizer"].register_step_post_hook(norm)  # the gradients the update read
        return answer


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_the_fused_optimizer_steps_on_clipped_gradients(precision: str) -> None:
    """AdamW runs fused on the CPU, and its gradients are clipped under bf16 autocast too
    (where Lightning refuses to clip for a fused optimizer: `Task.configure_gradient_clipping`)."""
    torch.manual_seed(0)
    task = _TinyTask()
    trainer = L.Trainer(accelerator="cpu", precision=precision, gradient_clip_val=0.5, max_steps=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(task, train_dataloaders=DataLoader([{"images": x} for x in torch.randn(12, 4)], batch_size=4))
    assert trainer.optimizers[0].defaults["fused"]
    assert task.norms == pytest.approx([0.5] * 3, rel=1e-3)
