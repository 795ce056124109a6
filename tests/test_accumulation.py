"""Gradient accumulation: k micro-batches of B/k train as one batch of B, whatever their token counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from mmtx.checkpoint import read_checkpoint
from mmtx.cli.common import leave_process_group
from mmtx.tasks.base import Task
from tests.conftest import free_ports
from tests.helpers import TINY_TWO_STREAM, csv_rows, draw_data, logged

STEPS = 6
RUN = [
    "logger=csv", "trainer.log_every_n_steps=1", f"trainer.max_steps={STEPS}", "trainer.max_time=null",
    "trainer.limit_val_batches=0",  # the training alone is compared
]  # fmt: skip
# nothing drawn at random per batch (dropout masks, shifts): every example's contribution is then the
# same in a batch of 16 as in one of 8
CAPTION = ["model.decoder.dropout=0", "model.encoder.dropout=0"]
VQA = [
    "task=vqa", *TINY_TWO_STREAM, "task.num_answers=50", "model.dropout=0", "model.backbone.dropout=0",
    "data.shift_px=0",
]  # fmt: skip
GENERATIVE_VQA = [  # a mean over the answers' tokens, of different lengths
    "task=vqa_generative", "model=vqa_generative_small", *TINY_TWO_STREAM, "model.backbone.dropout=0",
    "data.shift_px=0", "model.decoder.dropout=0", "model.decoder.dim=32",
    "model.decoder.depth=1", "model.decoder.num_heads=2",
]  # fmt: skip
ACCUMULATED = ["data.batch_size=8", "trainer.accumulate_grad_batches=2"]


class MeanOverItems(Task):
    """A linear model whose loss is the mean squared error over the batch's kept rows (as a
    caption's tokens are kept and its pads are not), in batches of 2; process r of N reads rows
    r, r + N, r + 2N ... Records the gradients the optimizer steps with."""

    def __init__(self, rows: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 1)
        self.rows = rows
        self.grads: list[list[torch.Tensor]] = []

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.rows[self.global_rank :: self.trainer.world_size], batch_size=2)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        errors = (self.model(batch["images"]).squeeze(1) - batch["targets"]) ** 2
        return self.summed_loss((errors * batch["kept"]).sum(), batch["kept"].sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)  # the update is the gradient's size: a wrong scale shows

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        self.grads.append([p.grad.clone() for p in self.model.parameters()])


def sgd_on_the_mean(
    start: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, steps: list[list[int]]
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], torch.Tensor]:
    """SGD from the weights ``start``, each step on the mean squared error of the rows it lists:
    each step's gradients, the final weights and the last step's loss."""
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        for p, w in zip(model.parameters(), start):
            p.copy_(w)
    grads = []
    for rows in steps:
        model.zero_grad()
        loss = ((model(x[rows]).squeeze(1) - y[rows]) ** 2).mean()
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return grads, [p.detach() for p in model.parameters()], loss.detach()


def fit(
    rows: int, kept: torch.Tensor, **trainer: Any
) -> tuple[MeanOverItems, L.Trainer, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``MeanOverItems`` trained for one epoch on ``rows`` random rows, 2 batches accumulated per step."""
    torch.manual_seed(1)
    x, y = torch.randn(rows, 3), torch.randn(rows)
    task = MeanOverItems([{"images": x[i], "targets": y[i], "kept": kept[i]} for i in range(rows)])
    start = [p.detach().clone() for p in task.model.parameters()]
    fitter = L.Trainer(max_epochs=1, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                       **trainer)  # fmt: skip
    fitter.fit(task)
    return task, fitter, x, y, start


def test_summed_loss_steps_with_the_gradient_of_the_mean_of_a_steps_items() -> None:
    """Three micro-batches of 2 rows holding 2, 1 and 1 kept rows, 2 accumulated per step: step 1
    takes the gradient of the mean over its 3 kept rows, step 2 (the epoch's last, one micro-batch)
    over its 1, whereas Lightning's division by k weighs each micro-batch's mean alike (and halves
    the last step's); ``train/loss`` is the last step's mean."""
    task, trainer, x, y, start = fit(6, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0]))
    assert trainer.global_step == 2
    grads, _, last_loss = sgd_on_the_mean(start, x, y, [[0, 1, 2], [5]])
    for got, want in zip(task.grads, grads, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(trainer.callback_metrics["train/loss"], last_loss)


class LeaveProcessGroup(L.Callback):
    """Each spawned process leaves its process group when it is done, as ``mmtx-train`` does: left
    to the interpreter's exit, gloo's threads can abort a process whose run succeeded."""

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        leave_process_group()


@pytest.mark.slow
def test_summed_loss_over_two_processes_and_micro_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on 2 processes (rows 0, 2, 4 .. and 1, 3, 5 ..): step 1 on rows 0-7 (7 kept,
    unevenly over processes and micro-batches), step 2 on rows 8-11 (2 kept, both on one process):
    the weights SGD reaches on those means, which a scale missing DDP's averaging would not."""
    kept = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    monkeypatch.setenv("MASTER_PORT", str(free_ports(1)[0]))  # Lightning's own pick is an ephemeral port
    task, trainer, x, y, start = fit(12, kept, strategy="ddp_spawn", accelerator="cpu", devices=2,
                                     callbacks=[LeaveProcessGroup()])  # fmt: skip
    steps = [[i for i in range(8) if kept[i]], [i for i in range(8, 12) if kept[i]]]
    _, weights, last_loss = sgd_on_the_mean(start, x, y, steps)
    for got, want in zip(task.model.parameters(), weights, strict=True):  # rank 0's, sent back by Lightning
        torch.testing.assert_close(got.detach(), want)
    torch.testing.assert_close(trainer.callback_metrics["train/loss"], last_loss)


def train(cli, common: list[str], root: Path, **runs: list[str]) -> dict[str, Path]:
    """A run with batch 16 (``big``) and ``runs``, at once, on a data set drawn before they start."""
    dirs = {"big": root / "big"} | {name: root / name for name in runs}
    draw_data(common)  # once, before the runs start at once
    commands = [("mmtx-train", *common, f"hydra.run.dir={dirs[name]}", *extra) for name, extra in runs.items()]
    cli.run_many(("mmtx-train", *common, f"hydra.run.dir={dirs['big']}", "data.batch_size=16"), *commands, cwd=root)
    return dirs


def assert_same_training(expected: Path, actual: Path) -> None:
    """The same ``train/loss`` at every optimizer step and the same weights at the end."""
    want, got = (logged(csv_rows(run), "train/loss") for run in (expected, actual))
    assert [s for s, _ in got] == [s for s, _ in want] == list(range(STEPS)), (want, got)
    want_t, got_t = torch.tensor([v for _, v in want]), torch.tensor([v for _, v in got])
    torch.testing.assert_close(got_t, want_t, rtol=1e-5, atol=0, msg=lambda m: f"{m}\n{want_t}\n{got_t}")
    assert want_t[-1] < want_t[0]  # it learned: the steps were not no-ops

    a, b = (read_checkpoint(run / "checkpoints" / "last.ckpt") for run in (expected, actual))
    assert a["global_step"] == b["global_step"] == STEPS
    for name, w in a["state_dict"].items():
        if w.is_floating_point():
            torch.testing.assert_close(b["state_dict"][name], w, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def caption_runs(cli, tiny: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny captioner at batch 16, at 8 with 2 batches accumulated, and on 2 processes at 4
    with 2 batches accumulated."""
    root = tmp_path_factory.mktemp("accumulate-caption")
    ddp = ["trainer=ddp_cpu", "data.batch_size=4", "trainer.accumulate_grad_batches=2"]
    return train(cli, [*tiny, *RUN, *CAPTION], root, accumulated=ACCUMULATED, ddp=ddp)


@pytest.mark.slow
def test_caption_accumulation_follows_the_big_batch(caption_runs: dict[str, Path], data_dir: Path) -> None:
    """Captioning, 2 x 8 accumulated vs 16 at once: the loss is the mean over the step's tokens, and
    two micro-batches hold different numbers of tokens (captions of varying length), so averaging
    the two micro-batches' means (Lightning's division by k) would not give the same updates."""
    (captions,) = data_dir.glob("shapes-32px-64-20-seed0/captions_train.json")
    lengths = {len(a["caption"].split()) for a in json.loads(captions.read_text())["annotations"]}
    assert len(lengths) > 3, lengths  # the token counts differ between micro-batches
    assert_same_training(caption_runs["big"], caption_runs["accumulated"])


@pytest.mark.slow
@pytest.mark.parametrize("task", ["classifier", "generative"])
def test_vqa_accumulation_follows_the_big_batch(cli, tiny: list[str], tmp_path: Path, task: str) -> None:
    """VQA's classifier (a mean over questions) and answer decoder (a mean over answer tokens):
    2 x 8 accumulated vs 16 at once."""
    data = [o for o in tiny if not o.startswith("model.")]  # the tiny captioner's sizes: not this model's
    runs = train(
        cli, [*data, *RUN, *(VQA if task == "classifier" else GENERATIVE_VQA)], tmp_path, accumulated=ACCUMULATED
    )
    assert_same_training(runs["big"], runs["accumulated"])


@pytest.mark.slow
def test_ddp_with_accumulation_follows_one_process(caption_runs: dict[str, Path]) -> None:
    """Captioning on 2 processes x 4 captions x 2 micro-batches vs 1 process with 16: the same
    examples per optimizer step, spread over processes and micro-batches of unequal token counts."""
    assert_same_training(caption_runs["big"], caption_runs["ddp"])
