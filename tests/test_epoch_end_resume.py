"""Resuming a run bounded by ``trainer.max_steps`` from a checkpoint written at an epoch's end
(`mmtx.tasks.epoch_end_resume`), on a toy Lightning module: the resumed run takes the batches, logs
the steps and ends with the weights of the uninterrupted one, and checkpoints written anywhere else
are left to Lightning. (tests/test_faults.py resumes mmtx-train itself.)"""

from __future__ import annotations

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from mmtx.tasks.epoch_end_resume import begin_epoch_afresh, start_next_epoch

BATCHES = 5  # an epoch: 10 rows in batches of 2, in order


class Toy(L.LightningModule):
    """Records each step's (global step, first row, steps counted for logging); SGD at a constant
    rate, so two runs of the same batches end with the same weights."""

    def __init__(self, rewrite: bool = True) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.rewrite, self.afresh = rewrite, False
        self.seen: list[tuple[int, float, int]] = []

    def training_step(self, batch, batch_idx):
        counted = self.trainer.fit_loop.epoch_loop._batches_that_stepped
        self.seen.append((self.global_step, float(batch[0][0, 0]), counted))
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_load_checkpoint(self, checkpoint):
        self.afresh = self.rewrite and start_next_epoch(checkpoint)

    def on_train_start(self):
        if self.afresh:
            begin_epoch_afresh(self.trainer)


def _fit(model: Toy, tmp_path: Path, ckpt_path: Path | None = None, **trainer: object) -> L.Trainer:
    rows = torch.arange(20.0).view(10, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows), batch_size=2)
    fit = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                    default_root_dir=tmp_path, num_sanity_val_steps=0, **trainer)  # fmt: skip
    fit.fit(model, loader, val_dataloaders=loader, ckpt_path=ckpt_path)
    return fit


def _epoch_end_checkpoint(tmp_path: Path) -> Path:
    """A run of 1 epoch, validated at its end, and its last.ckpt, written at the epoch's end."""
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="last", save_on_train_epoch_end=True)
    torch.manual_seed(0)
    _fit(Toy(), tmp_path / "first", max_epochs=1, callbacks=[saver])
    return tmp_path / "last.ckpt"


@pytest.mark.parametrize("bounds", [{"max_steps": 8, "max_epochs": -1}, {"max_steps": 8, "max_epochs": 2}])
def test_a_run_bounded_by_steps_resumes_at_the_next_epochs_first_batch(tmp_path: Path, bounds: dict) -> None:
    torch.manual_seed(0)
    whole = Toy()
    _fit(whole, tmp_path / "whole", **bounds)
    assert [step for step, _, _ in whole.seen] == list(range(8))

    last = _epoch_end_checkpoint(tmp_path)
    resumed = Toy()
    _fit(resumed, tmp_path / "resumed", ckpt_path=last, **bounds)
    assert resumed.seen == whole.seen[BATCHES:]  # the batches, and the steps counted for logging
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))

    left_alone = Toy(rewrite=False)  # what Lightning does without the rewrite: other batches
    _fit(left_alone, tmp_path / "left-alone", ckpt_path=last, **bounds)
    assert left_alone.seen != whole.seen[BATCHES:]


def test_a_run_bounded_by_epochs_resumes_as_lightning_resumes_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    whole = Toy()
    _fit(whole, tmp_path / "whole", max_epochs=2)
    last = _epoch_end_checkpoint(tmp_path)
    for rewrite in (True, False):
        resumed = Toy(rewrite=rewrite)
        _fit(resumed, tmp_path / f"resumed-{rewrite}", ckpt_path=last, max_epochs=2)
        assert resumed.seen == whole.seen[BATCHES:]


def test_checkpoints_written_elsewhere_are_left_to_lightning(tmp_path: Path) -> None:
    """After a batch (mid-epoch, and at the epoch's last batch), at an epoch that max_steps ended
    early, and a checkpoint with no loops: unchanged. At an epoch's end: rewritten."""
    after_batches = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "batches", every_n_train_steps=1,
                                                        save_top_k=-1, filename="{step}")  # fmt: skip
    torch.manual_seed(0)
    _fit(Toy(), tmp_path / "run", max_steps=7, callbacks=[after_batches])  # steps 1..7: 5 is an epoch's last
    ended_early = tmp_path / "ended-early.ckpt"
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="ended-early", save_on_train_epoch_end=True)
    _fit(Toy(), tmp_path / "short", max_steps=3, callbacks=[saver])
    for path in [*sorted((tmp_path / "batches").glob("*.ckpt")), ended_early]:
        checkpoint = torch.load(path, weights_only=False)
        before = copy.deepcopy(checkpoint["loops"])
        assert not start_next_epoch(checkpoint), path.name
        assert checkpoint["loops"] == before, path.name
    assert not start_next_epoch({"state_dict": {}})

    checkpoint = torch.load(_epoch_end_checkpoint(tmp_path), weights_only=False)
    assert start_next_epoch(checkpoint)
    epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]
    assert epochs["completed"] == epochs["processed"] == 1
