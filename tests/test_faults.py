"""Long runs survive faults: exact resume after SIGKILL, preemption signals, atomic checkpoints,
non-finite losses; and the data order that makes resume and DDP exact."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from mmtx.callbacks import NonFiniteLoss, NonFiniteLossError, Preempted, Preemption
from mmtx.checkpoint import read_checkpoint
from mmtx.checkpoint_io import AtomicCheckpointIO
from mmtx.data.sampling import SeededDataset, ShardedBatchSampler
from mmtx.tasks.base import RNG_KEY
from tests.conftest import TINY_MODEL
from tests.helpers import TINY_TWO_STREAM, draw_data, recorded_batches

# ------------------------------------------------------------------------------ data order


def test_processes_share_out_the_global_batches_of_one_process() -> None:
    """Global batch k of 3 processes (batch 4 each) holds exactly batch k of one process (batch 12)."""
    one = list(ShardedBatchSampler(50, 12, shuffle=True, drop_last=True, seed=7))
    three = [
        list(ShardedBatchSampler(50, 4, shuffle=True, drop_last=True, seed=7, rank=r, world_size=3)) for r in range(3)
    ]
    assert len(one) == 4 and all(len(p) == 4 for p in three)
    for k, batch in enumerate(one):
        assert batch == three[0][k] + three[1][k] + three[2][k]  # in rank order: gathered, one process's batch
    # a new permutation each epoch, the same one for the same (seed, epoch)
    s = ShardedBatchSampler(50, 12, shuffle=True, drop_last=True, seed=7)
    s.set_epoch(1)
    assert list(s) != one
    s.set_epoch(0)
    assert list(s) == one


def test_grouped_order_keeps_groups_together_and_shares_like_one_process() -> None:
    """With groups (an image's questions), a shuffled epoch lists each group's examples one after
    another, every example once; 2 processes' global batches hold those of one process."""
    groups = [i // 3 for i in range(48)][::-1]  # 16 groups of 3, ids in descending order
    one = list(ShardedBatchSampler(48, 12, shuffle=True, drop_last=True, seed=3, groups=groups))
    order = [i for batch in one for i, _ in batch]
    assert sorted(order) == list(range(48))
    runs = [groups[i] for k, i in enumerate(order) if k == 0 or groups[order[k - 1]] != groups[i]]
    assert len(runs) == 16 and runs != sorted(runs, reverse=True)  # contiguous groups, shuffled
    two = [
        list(ShardedBatchSampler(48, 6, shuffle=True, drop_last=True, seed=3, rank=r, world_size=2, groups=groups))
        for r in range(2)
    ]
    for k, batch in enumerate(one):
        assert sorted(batch) == sorted(two[0][k] + two[1][k])
        assert two[0][k] == batch[:6]  # a contiguous slice: a group stays on one process
    with pytest.raises(ValueError, match="groups has 3 ids for 48 examples"):
        ShardedBatchSampler(48, 12, shuffle=True, drop_last=True, groups=[0, 1, 2])


def test_evaluation_shares_cover_every_example_with_equal_counts() -> None:
    shares = [ShardedBatchSampler(25, 4, shuffle=False, drop_last=False, rank=r, world_size=2) for r in range(2)]
    indices = [[i for batch in s for i, _ in batch] for s in shares]
    assert len(indices[0]) == len(indices[1]) == 13  # 26 = 25 + one repeat
    assert sorted(set(indices[0] + indices[1])) == list(range(25))
    single = [i for batch in ShardedBatchSampler(25, 4, shuffle=False, drop_last=False) for i, _ in batch]
    assert single == list(range(25))  # one process: no padding, the data set's order


def test_resumed_sampler_continues_the_interrupted_epoch_once() -> None:
    full = list(ShardedBatchSampler(40, 4, shuffle=True, drop_last=True, seed=1))
    s = ShardedBatchSampler(40, 4, shuffle=True, drop_last=True, seed=1)
    s.resume(epoch=0, batches_done=3)
    assert list(s) == full[3:]
    assert list(s) == full  # the next epoch-0 pass is whole again
    s.resume(epoch=1, batches_done=3)
    s.set_epoch(2)  # the saved position belongs to another epoch: ignored
    assert len(list(s)) == len(full)


def test_seeded_dataset_fixes_augmentation_per_example_leaving_caller_rng() -> None:
    class Noise(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.rand(3)

    ds = SeededDataset(Noise())
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a, b = ds[(1, 123)], ds[(2, 123)]
    assert torch.equal(a, b) and not torch.equal(a, ds[(1, 124)])
    assert torch.equal(torch.get_rng_state(), before)


# ------------------------------------------------------------------------------ atomic writes


def test_atomic_checkpoint_keeps_the_old_file_when_a_write_fails(tmp_path: Path, monkeypatch) -> None:
    io, path = AtomicCheckpointIO(), tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    assert torch.load(path, weights_only=True)["step"] == 1

    def dies_halfway(obj, f) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    assert torch.load(path, weights_only=True)["step"] == 1  # still the whole previous checkpoint
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind


# ------------------------------------------------------------------------------ non-finite loss


class _Regression(L.LightningModule):
    """y = Wx on fixed data; the loss is made NaN at the steps in ``nan_at``."""

    def __init__(self, nan_at: set[int]) -> None:
        super().__init__()
        self.layer, self.nan_at = nn.Linear(4, 1), nan_at

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        return loss * float("nan") if self.global_step in self.nan_at else loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _fit(module: L.LightningModule, tmp_path: Path, *callbacks: L.Callback, steps: int = 6) -> L.Trainer:
    every_step = L.pytorch.callbacks.ModelCheckpoint(
        tmp_path, "last", every_n_train_steps=1, enable_version_counter=False
    )
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[*callbacks, every_step],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        plugins=[AtomicCheckpointIO()],
    )
    trainer.fit(module)
    return trainer


def test_nonfinite_loss_stops_with_a_message_and_keeps_the_last_good_ckpt(tmp_path: Path) -> None:
    module = _Regression(nan_at={3})
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at step 3.*last\.ckpt.*action=skip"):
        _fit(module, tmp_path, NonFiniteLoss("stop"))
    saved = read_checkpoint(tmp_path / "last.ckpt")
    assert saved["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())
    assert torch.equal(saved["state_dict"]["layer.weight"], module.layer.weight.detach())  # not updated since


def test_nonfinite_loss_skip_drops_only_that_update(tmp_path: Path) -> None:
    weights = {}

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, module, *args) -> None:
            weights[trainer.global_step] = module.layer.weight.detach().clone()

    skip = NonFiniteLoss("skip")
    trainer = _fit(_Regression(nan_at={2}), tmp_path, skip, Record())
    assert skip.skipped == 1 and trainer.global_step == 6
    assert torch.equal(weights[3], weights[2])  # the step with the NaN loss changed nothing
    assert not torch.equal(weights[4], weights[3])  # and training went on
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_nonfinite_loss_rejects_unknown_actions() -> None:
    with pytest.raises(ValueError, match="nonfinite_loss.action='ignore'"):
        NonFiniteLoss("ignore")


def test_preemption_signal_saves_then_stops_within_the_step(tmp_path: Path) -> None:
    """SIGUSR1 during step 3: the run writes its full state to the path and raises Preempted."""

    class Notice(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx: int) -> None:
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGUSR1)

    path = tmp_path / "preempted.ckpt"
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(Preempted, match=r"stopped by SIGUSR1 at step 3; saved .*preempted\.ckpt"):
        _fit(_Regression(set()), tmp_path, Notice(), Preemption(str(path)), steps=10)
    assert read_checkpoint(path)["global_step"] == 3
    assert signal.getsignal(signal.SIGUSR1) == before  # handlers given back


# ------------------------------------------------------------------------------ exact resume

STEPS = 14  # 10 a epoch (batch 32 of 320 captions or questions of 64 images): a resume crosses an epoch end
# the randomness a resume must carry on: dropout (the random generators' states) and each example's
# crop, shift or mirroring (its own seed, at the data's position); pretraining also masks words and patches and
# picks alignment negatives, random ones first, then hard ones from step 9 (after the resume); VQA
# also drops out in its answer head (0.1) and shifts images by up to 4 px (the task's); every task
# validates at the epoch end
RANDOM = {
    "caption": ["model.encoder.dropout=0.1", "model.decoder.dropout=0.1", "data.crop_scale=[0.5,1.0]", "data.shift_px=2",
                "data.mirror_words=[[left,right]]"],
    "pretrain": ["task=pretrain", *TINY_TWO_STREAM, "model.backbone.dropout=0.1", "task.objectives.mpm=1.0",
                 "task.objectives.itc=0.5", "task.objectives.hard_negatives_from=0.6", "data.shift_px=2"],
    "vqa": ["task=vqa", *TINY_TWO_STREAM, "model.backbone.dropout=0.1", "trainer.val_check_interval=null",
            "trainer.check_val_every_n_epoch=1"],
}  # fmt: skip


def _command(tiny: list[str], task: str, run_dir: Path, record: str, *extra: str) -> tuple:
    """``mmtx-train`` of a tiny ``task`` run of 14 steps with randomness on, last.ckpt every 3
    steps; the step and example ids of every batch the process trains go to ``run_dir/record``."""
    base = tiny if task == "caption" else [o for o in tiny if o not in TINY_MODEL]  # a two-stream model
    return (
        "mmtx-train", *base, *RANDOM[task], "logger=none", f"hydra.run.dir={run_dir}", "data.batch_size=32",
        f"trainer.max_steps={STEPS}", "trainer.max_epochs=-1", "trainer.limit_val_batches=1",
        "callbacks.step_checkpoint.every_n_train_steps=3", "+callbacks.ids._target_=tests.helpers.RecordImageIds",
        f"+callbacks.ids.path={run_dir / record}", f"+callbacks.ids.key={'question_ids' if task == 'vqa' else 'image_ids'}",
        *extra,
    )  # fmt: skip


def _whole_and_stopped(cli, tiny: list[str], tmp_path: Path, task: str, *settings: str, signal_name: str,
                       step: int, rank: int = 0) -> subprocess.CompletedProcess:  # fmt: skip
    """An uninterrupted run (``tmp_path/whole``) and one whose process ``rank`` sends itself
    ``signal_name`` after step ``step`` (``tmp_path/stopped``), at once; the stopped one's result."""
    draw_data(list(_command(tiny, task, tmp_path, "-")[1:]))  # drawn once, not by both runs at once
    fault = ("+callbacks.fault._target_=tests.helpers.SignalAtStep", f"+callbacks.fault.step={step}",
             f"+callbacks.fault.signal={signal_name}", f"+callbacks.fault.rank={rank}")  # fmt: skip
    whole, stopped = cli.run_many(
        _command(tiny, task, tmp_path / "whole", "ids", *settings),
        _command(tiny, task, tmp_path / "stopped", "ids-first", *settings, *fault),
        cwd=tmp_path,
        check=False,
    )
    assert whole.returncode == 0, cli.describe(whole)
    return stopped


def _resume_and_compare(cli, tiny: list[str], tmp_path: Path, task: str, *settings: str, saved_at: int,
                        ranks: int = 1) -> subprocess.CompletedProcess:  # fmt: skip
    """Resume ``tmp_path/stopped`` from its last.ckpt, written at step ``saved_at``: each resumed
    process trains steps ``saved_at``..13 only, on the batches the uninterrupted run took there,
    and the run ends with the uninterrupted run's weights and optimizer state, bit for bit."""
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)["global_step"] == saved_at
    resumed = cli.run(*_command(tiny, task, tmp_path / "stopped", "ids-resumed", *settings, f"ckpt_path={last}"),
                      cwd=tmp_path)  # fmt: skip
    for rank in range(ranks):
        whole = recorded_batches(tmp_path / "whole" / "ids", rank)
        assert [step for step, _ in whole] == list(range(STEPS))
        assert recorded_batches(tmp_path / "stopped" / "ids-first", rank)[:saved_at] == whole[:saved_at]
        assert recorded_batches(tmp_path / "stopped" / "ids-resumed", rank) == whole[saved_at:]  # not from step 0
    _assert_same_state(tmp_path / "whole" / "checkpoints" / "last.ckpt", last)
    return resumed


def _assert_same_state(a: Path, b: Path) -> None:
    x, y = read_checkpoint(a), read_checkpoint(b)
    assert x["global_step"] == y["global_step"] == STEPS
    counted = [c["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] for c in (x, y)]
    assert counted[0] == counted[1], f"steps counted for logging: {counted}"
    assert x["state_dict"].keys() == y["state_dict"].keys()
    different = [k for k in x["state_dict"] if not torch.equal(x["state_dict"][k], y["state_dict"][k])]
    assert not different, f"weights differ from the uninterrupted run: {different[:5]}"
    for p, q in zip(
        x["optimizer_states"][0]["state"].values(), y["optimizer_states"][0]["state"].values(), strict=True
    ):
        assert all(torch.equal(p[k], q[k]) for k in p)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["caption", "pretrain", "vqa"])
def test_killed_run_resumed_from_last_ckpt_ends_bit_identical(cli, tiny: list[str], tmp_path: Path, task: str,
                                                              repo_on_path) -> None:  # fmt: skip
    """SIGKILL after step 7 (mid-epoch; last.ckpt of step 6), resume: the resumed process trains
    steps 6..13 only, and ends with the weights and optimizer state of a run never interrupted,
    dropout, crops, shifts, masking and negatives on."""
    killed = _whole_and_stopped(cli, tiny, tmp_path, task, signal_name="SIGKILL", step=7)
    assert killed.returncode == -signal.SIGKILL, cli.describe(killed)
    assert [s for s, _ in recorded_batches(tmp_path / "stopped" / "ids-first")] == list(range(7))  # 7 steps done
    resumed = _resume_and_compare(cli, tiny, tmp_path, task, saved_at=6)
    assert f"budget: trainer.max_steps={STEPS}; the preset's time budget is off" in resumed.stdout + resumed.stderr


@pytest.mark.slow
def test_resume_with_loader_workers_and_bf16_autocast_is_exact(
    cli, tiny: list[str], tmp_path: Path, repo_on_path
) -> None:
    """The same as the SIGTERM case with two loader workers (random crops drawn in the workers)
    and bf16 autocast: resumed, the run ends where the uninterrupted one does, bit for bit."""
    settings = ("data.num_workers=2", "trainer.precision=bf16-mixed")
    stopped = _whole_and_stopped(cli, tiny, tmp_path, "caption", *settings, signal_name="SIGTERM", step=4)
    assert stopped.returncode == 128 + signal.SIGTERM, cli.describe(stopped)
    _resume_and_compare(cli, tiny, tmp_path, "caption", *settings, saved_at=5)
    last = read_checkpoint(tmp_path / "stopped" / "checkpoints" / "last.ckpt")
    assert last["state_dict"]["model.encoder.cls_token"].dtype == torch.float32  # autocast, fp32 weights


@pytest.mark.slow
def test_sigterm_saves_and_exits_then_resumes_exactly(cli, tiny: list[str], tmp_path: Path, repo_on_path) -> None:
    """SIGTERM after step 4: the step in flight finishes, last.ckpt of step 5 is written, the
    process exits with 128+15; resumed, it trains steps 5..13 only and ends bit-identical."""
    stopped = _whole_and_stopped(cli, tiny, tmp_path, "caption", signal_name="SIGTERM", step=4)
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert stopped.returncode == 128 + signal.SIGTERM, cli.describe(stopped)
    assert f"stopped by SIGTERM at step 5; saved {last}" in stopped.stderr  # the step in flight when the notice came
    _resume_and_compare(cli, tiny, tmp_path, "caption", saved_at=5)


@pytest.mark.slow
def test_resumes_from_an_epochs_last_batch_and_again_are_exact(
    cli, tiny: list[str], tmp_path: Path, repo_on_path
) -> None:
    """Batch 48 of 320 captions: 6 steps an epoch. SIGTERM after step 5 saves at the epoch's last
    batch, from where a resumed Lightning counts its ``current_epoch`` one ahead; resumed, the run
    is stopped again after step 8 (mid-epoch) and resumed once more. Each time it trains only the
    steps left, on the uninterrupted run's batches shifted as they were, and it ends bit-identical."""
    settings = ("data.batch_size=48",)
    stopped = _whole_and_stopped(cli, tiny, tmp_path, "caption", *settings, signal_name="SIGTERM", step=5)
    assert stopped.returncode == 128 + signal.SIGTERM, cli.describe(stopped)
    run, last = tmp_path / "stopped", tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)["global_step"] == 6
    fault = ("+callbacks.fault._target_=tests.helpers.SignalAtStep", "+callbacks.fault.step=8",
             "+callbacks.fault.signal=SIGTERM")  # fmt: skip
    again = cli.run(*_command(tiny, "caption", run, "ids-second", *settings, *fault, f"ckpt_path={last}"),
                    cwd=tmp_path, check=False)  # fmt: skip
    assert again.returncode == 128 + signal.SIGTERM, cli.describe(again)
    assert read_checkpoint(last)["global_step"] == 9
    cli.run(*_command(tiny, "caption", run, "ids-resumed", *settings, f"ckpt_path={last}"), cwd=tmp_path)
    whole = recorded_batches(tmp_path / "whole" / "ids")
    assert [step for step, _ in whole] == list(range(STEPS))
    assert [ids for _, ids in whole[:6]] != [ids for _, ids in whole[6:12]]  # each epoch its own order
    assert recorded_batches(run / "ids-first") == whole[:6]
    assert recorded_batches(run / "ids-second") == whole[6:9]
    assert recorded_batches(run / "ids-resumed") == whole[9:]
    _assert_same_state(tmp_path / "whole" / "checkpoints" / "last.ckpt", last)


@pytest.mark.slow
def test_a_run_killed_after_an_epoch_end_checkpoint_resumes_exactly(
    cli, tiny: list[str], tmp_path: Path, repo_on_path
) -> None:
    """SIGKILL after step 11: last.ckpt is the one written at the first epoch's end
    (``on_train_epoch_end``, step 10). Resumed (the run is bounded by trainer.max_steps), it trains
    epoch 1's batches from its first, as the uninterrupted run did, and ends bit-identical.
    (Lightning, left alone, restarts the finished epoch and trains other batches.)"""
    killed = _whole_and_stopped(cli, tiny, tmp_path, "caption", signal_name="SIGKILL", step=11)
    assert killed.returncode == -signal.SIGKILL, cli.describe(killed)
    _resume_and_compare(cli, tiny, tmp_path, "caption", saved_at=10)


@pytest.mark.slow
def test_two_processes_resume_with_each_ones_own_random_state(
    cli, tiny: list[str], tmp_path: Path, repo_on_path
) -> None:
    """2 processes (``trainer=ddp_cpu``, batch 16 each), dropout on: each process draws its own
    dropout masks, and only process 0 writes the checkpoint, which holds both processes'
    generators. SIGTERM to process 1 after step 4 (both stop, last.ckpt of step 5), resume: both
    train steps 5..13 only and the run ends bit-identical to an uninterrupted 2-process run."""
    settings = ("trainer=ddp_cpu", "data.batch_size=16")
    stopped = _whole_and_stopped(cli, tiny, tmp_path, "caption", *settings, signal_name="SIGTERM", step=4, rank=1)
    assert stopped.returncode == 128 + signal.SIGTERM, cli.describe(stopped)
    assert len(read_checkpoint(tmp_path / "stopped" / "checkpoints" / "last.ckpt")[RNG_KEY]) == 2
    _resume_and_compare(cli, tiny, tmp_path, "caption", *settings, saved_at=5, ranks=2)


def test_lightning_hands_each_epoch_to_the_batch_sampler() -> None:
    """Lightning calls ``set_epoch`` on a loader's ``sampler`` and ``batch_sampler.sampler`` only
    (``_set_sampler_epoch``, at each training epoch's start): a loader on mmtx's batch sampler must
    lead it there, or every epoch repeats the first one's order and per-example draws."""
    from lightning.fabric.utilities.data import _set_sampler_epoch

    sampler = ShardedBatchSampler(16, 4, shuffle=True, drop_last=True, seed=0)
    loader = torch.utils.data.DataLoader(
        SeededDataset(list(range(16)), reseed=False), batch_sampler=sampler, collate_fn=list
    )
    first = list(loader)
    _set_sampler_epoch(loader, 3)
    assert sampler.epoch == 3 and list(loader) != first


def test_lightning_counter_for_mid_epoch_resume_counts_this_epochs_batches() -> None:
    """mmtx's data modules record where an epoch stands from a Lightning internal
    (``fit_loop.epoch_loop.batch_progress.current.ready``, read in ``mmtx/data/sampling.py``); this fast
    test fails if an upgrade renames it or stops resetting it at each epoch. 5 batches an epoch,
    7 steps: the counter reads 1..5, then 1, 2."""
    seen: list[int] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
            seen.append(trainer.fit_loop.epoch_loop.batch_progress.current.ready)

    class Toy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(10, 2)), batch_size=2)
    trainer = L.Trainer(max_steps=7, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Record()], accelerator="cpu")  # fmt: skip
    trainer.fit(Toy(), data)
    assert seen == [1, 2, 3, 4, 5, 1, 2]
