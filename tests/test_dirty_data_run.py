"""End to end: a tiny captioner run on a COCO-format data set with bad images and bad annotations.

With ``data.on_bad_image=skip`` (the annotation policy follows it) the run trains and reports
exactly what it left out, in its log and in ``bad_data.txt``; with the default ``error`` it stops
before training, naming every bad file and entry, and ``mmtx-train`` says so in one message.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mmtx.data.bad_data import REPORT_FILE, BadDataError
from tests.bad_inputs import DirtyCoco, write_dirty_coco
from tests.conftest import TINY_MODEL
from tests.helpers import train_in_process

# one epoch: 24 good images x 2 captions + the long one = 49 pairs, in 6 full batches of 8
STEPS = 49 // 8
RUN = [*TINY_MODEL, "data.image_size=32", "data.batch_size=8", "data.max_length=12", "data.num_workers=0",
       "logger=none", "trainer.max_epochs=1", "trainer.num_sanity_val_steps=0",
       "trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory) -> DirtyCoco:
    return write_dirty_coco(tmp_path_factory.mktemp("dirty"))


def test_skip_trains_and_reports_exactly_what_it_left_out(dirty: DirtyCoco, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mmtx"):
        metrics = train_in_process([*RUN, *dirty.overrides(), "data.on_bad_image=skip", f"paths.output_dir={tmp_path}"])
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == STEPS
    assert set(metrics) >= {"BLEU-4", "CIDEr"}

    rows = [line.split("\t") for line in (tmp_path / REPORT_FILE).read_text().splitlines()[1:]]
    assert {row[0] for row in rows} == {"train"}  # val is clean
    assert sorted(row[2] for row in rows if row[1] == "image") == sorted(dirty.bad_images)
    for row in rows:
        if row[1] == "image":
            assert dirty.bad_images[row[2]] in row[3]
    entries = [row[2] for row in rows if row[1] == "annotation"]
    assert len(entries) == len(dirty.bad_entries)
    for where, reason in dirty.bad_entries.items():
        assert sum(e.startswith(f"{where}:") and reason in e for e in entries) == 1, where
    assert [row[2] for row in rows if row[1] == "truncated"] == dirty.long_captions
    assert len(rows) == len(dirty.bad_images) + len(dirty.bad_entries) + len(dirty.long_captions)

    log = caplog.text
    assert f"train split: left out {len(dirty.bad_entries)} bad annotation entries (data.on_bad_annotation=skip)" in log
    assert f"train split: left out {len(dirty.bad_images)} bad image file(s) and their 4 caption(s)" in log
    assert "1 of " in log and "longer than data.max_length=12 tokens and are cut" in log
    assert f"everything left out is listed in {tmp_path / REPORT_FILE}" in log


def test_error_stops_before_training_naming_every_culprit(dirty: DirtyCoco, tmp_path: Path) -> None:
    with pytest.raises(BadDataError) as info:
        train_in_process([*RUN, *dirty.overrides(), f"paths.output_dir={tmp_path}"])
    message = str(info.value)
    for culprit in [*dirty.bad_images, *dirty.bad_entries]:
        assert f"\n  {culprit}:" in message, culprit
    assert f"{len(dirty.bad_entries)} bad annotation entries" in message
    assert f"{len(dirty.bad_images)} bad image file(s)" in message
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "tokenizer.json").exists()


def test_mmtx_train_prints_the_bad_data_in_one_message(cli, dirty: DirtyCoco, tmp_path: Path) -> None:
    result = cli.run(
        "mmtx-train", *RUN, *dirty.overrides(), f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, check=False
    )
    assert result.returncode == 1, cli.describe(result)
    assert "mmtx: bad data in the train split:" in result.stderr and "Traceback" not in result.stderr
    assert all(path in result.stderr for path in dirty.bad_images)
    assert not (tmp_path / "run" / "checkpoints").exists()
