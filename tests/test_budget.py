"""A budget in steps or epochs makes a run reproducible: the CPU preset's deadline is then off,
and a run whose schedule follows the clock says so at start-up."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Timer

from mmtx.tasks.optim import budget_note
from tests.helpers import compose_train, train_in_process


@pytest.mark.parametrize(
    ("overrides", "max_time", "level", "says"),
    [
        ([], "00:00:08:00", logging.INFO, "depends on the machine's pace"),
        (["experiment=vqa_shapes"], "00:00:08:00", logging.INFO, "depends on the machine's pace"),
        (["trainer.max_steps=60"], None, logging.INFO, "trainer.max_steps=60; the preset's time budget is off"),
        (["trainer.max_epochs=3"], None, logging.INFO, "trainer.max_epochs=3; the preset's time budget is off"),
        (["debug=fast"], None, logging.INFO, "the preset's time budget is off"),
        (["trainer=ddp_cpu", "trainer.max_steps=5"], None, logging.INFO, "the preset's time budget is off"),
        (["trainer.max_steps=60", "trainer.max_time=00:00:01:00"], "00:00:01:00", logging.WARNING,
         "trainer.max_time=00:00:01:00 beside trainer.max_steps=60: the learning-rate schedule and the stopping "
         "point follow whichever budget is further along, so they depend on the machine's pace"),
        (["trainer.max_epochs=-1", "trainer.max_time=00:00:02:00"], "00:00:02:00", logging.INFO,
         "depends on the machine's pace"),
        (["trainer=gpu"], None, None, None),  # an epoch budget, no deadline to drop: nothing to say
        (["trainer.max_steps=60", "trainer.max_time=null"], None, None, None),
    ],
)  # fmt: skip
def test_a_step_or_epoch_budget_turns_the_presets_deadline_off(overrides, max_time, level, says) -> None:
    trainer = compose_train(overrides).trainer
    assert trainer.max_time == max_time
    note = budget_note(trainer)
    if says is None:
        assert note is None
    else:
        assert note is not None and note[0] == level and says in note[1], note


def _lrs(run: Path) -> list[float]:
    rows = list(csv.DictReader(open(next(run.glob("csv/version_*/metrics.csv")))))
    return [float(r["train/lr"]) for r in rows if r.get("train/lr")]


@pytest.mark.slow
def test_two_runs_of_a_step_budget_follow_one_schedule_on_a_slow_machine(
    tiny: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second run's clock goes 10000 times as fast (a machine that slow would use up the CPU
    preset's 8 minutes within the first step): with trainer.max_steps given, both runs train every
    step with the same learning rates and say at start-up that the deadline is off. Given a
    deadline beside the steps explicitly, the same clock stops the run and is warned about."""
    run = [*tiny, "logger=csv", "trainer.max_steps=8", "trainer.log_every_n_steps=1", "trainer.limit_val_batches=1",
           "trainer.num_sanity_val_steps=0"]  # fmt: skip
    caplog.set_level(logging.INFO, logger="mmtx")
    train_in_process([*run, f"paths.output_dir={tmp_path / 'a'}"])
    elapsed = Timer.time_elapsed
    monkeypatch.setattr(Timer, "time_elapsed", lambda self, *stage: 1e4 * elapsed(self, *stage))
    train_in_process([*run, f"paths.output_dir={tmp_path / 'slow'}"])
    assert len(_lrs(tmp_path / "a")) == 8 and _lrs(tmp_path / "slow") == _lrs(tmp_path / "a")
    off = [
        r
        for r in caplog.records
        if "trainer.max_steps=8 and trainer.max_epochs=2; the preset's time budget is off" in r.message
    ]
    assert len(off) == 2 and off[0].levelno == logging.INFO

    caplog.clear()
    train_in_process([*run, "trainer.max_time=00:00:08:00", f"paths.output_dir={tmp_path / 'both'}"])
    assert len(_lrs(tmp_path / "both")) < 8  # the deadline stopped it: the patched clock is a slow machine
    assert any(r.levelno == logging.WARNING and "depend on the machine's pace" in r.message for r in caplog.records)
