"""What a new user meets in the first hour: the progress bar of a time-budgeted run, the model
summary, a misspelt key, a wrong image folder, captioning a folder, the modes of written files."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from mmtx.callbacks import BudgetProgressBar, ModelSummary
from mmtx.cli.common import unknown_override_keys
from mmtx.commands.common import callbacks_for
from mmtx.data.annotations import atomic_write_json
from mmtx.data.captions import CocoCaptions
from mmtx.data.synthetic.build import build_once
from mmtx.data.tokenizer import Tokenizer
from mmtx.export import export_task
from tests.conftest import TINY_MODEL
from tests.helpers import compose_train
from tests.test_export import CAPTIONS, TINY_CAPTIONER, build_task


class Tiny(L.LightningModule):
    """A linear layer fitted to zero on 8 random rows, 2 a batch: a run of a few steps in a second."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=2)


def fit(tmp_path: Path, callbacks: list[L.Callback], **budget) -> tuple[L.Trainer, Tiny]:
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        callbacks=callbacks, **budget)  # fmt: skip
    module = Tiny()
    trainer.fit(module)
    return trainer, module


# ------------------------------------------------------------------ 1. the progress bar's budget


def test_progress_bar_counts_steps_and_time_left_with_no_epoch_limit(tmp_path: Path) -> None:
    bar = BudgetProgressBar()  # 4 batches an epoch
    trainer, module = fit(tmp_path, [bar], max_epochs=-1, max_steps=6)
    assert bar._get_train_description(3).strip() == "Epoch 3"  # Lightning's: "Epoch 3/-2"
    metrics = bar.get_metrics(trainer, module)
    assert metrics["step"] == "6/6" and "time left" not in metrics

    bar = BudgetProgressBar()
    trainer, module = fit(tmp_path, [bar], max_epochs=-1, max_steps=3, max_time={"hours": 1})
    metrics = bar.get_metrics(trainer, module)
    assert metrics["step"] == "3/3"
    hours, minutes, seconds = map(int, metrics["time left"].split(":"))  # H:MM:SS
    assert 50 * 60 < 3600 * hours + 60 * minutes + seconds <= 3600, metrics  # the hour less the seconds this took
    assert bar._get_train_description(0).strip() == "Epoch 0"

    bar = BudgetProgressBar()  # an epoch budget: Lightning's own description, nothing added
    trainer, module = fit(tmp_path, [bar], max_epochs=2)
    assert bar._get_train_description(1).strip() == "Epoch 1/1"
    assert not {"step", "time left"} & set(bar.get_metrics(trainer, module))


def test_progress_bar_reads_the_metrics_at_most_every_metrics_every_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[bool] = []  # whether each read of Lightning's metrics came while training
    lightnings = RichProgressBar.get_metrics

    def counted(self: RichProgressBar, trainer: L.Trainer, module: L.LightningModule) -> dict:
        reads.append(trainer.training)
        return lightnings(self, trainer, module)

    monkeypatch.setattr(RichProgressBar, "get_metrics", counted)
    fit(tmp_path, [BudgetProgressBar()], max_epochs=-1, max_steps=8)  # a second is more than this takes
    assert reads.count(True) == 1, reads  # a metric on a GPU is read once, not after every batch
    reads.clear()
    fit(tmp_path, [BudgetProgressBar(metrics_every=0)], max_epochs=-1, max_steps=8)
    assert reads.count(True) >= 8, reads


def test_mmtx_train_adds_progress_bar_and_summary_unless_trainer_disables() -> None:
    def kinds(*overrides: str) -> set[type]:
        cfg = compose_train(["paths.output_dir=/unused", *overrides])
        return {type(cb) for cb in callbacks_for(cfg.trainer, cfg.callbacks)}

    assert {BudgetProgressBar, ModelSummary} <= kinds()
    off = kinds("trainer.enable_progress_bar=false", "trainer.enable_model_summary=false")
    assert not {BudgetProgressBar, ModelSummary} & off and off  # the others stay


@pytest.mark.slow
def test_mmtx_train_shows_the_steps_left_and_no_flops(
    cli, tiny: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the console's width where it is no terminal: one line a bar
    result = cli.run("mmtx-train", *tiny, "trainer.enable_progress_bar=true", "trainer.max_epochs=-1",
                     "trainer.max_steps=3", "logger=none", f"hydra.run.dir={tmp_path}", cwd=tmp_path)  # fmt: skip
    out = " ".join(result.stdout.split())
    assert "Total params: " in out and "FLOPs" not in out, cli.describe(result)
    assert re.search(r"Epoch 0 .* step: 3/3", out) and "/-2" not in out, cli.describe(result)


# ------------------------------------------------------------------------- 2. the model summary


def test_model_summary_prints_no_flops_it_did_not_count(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fit(tmp_path, [ModelSummary()], max_steps=1, enable_progress_bar=False)
    out = capsys.readouterr().out
    assert "layer" in out and "Linear" in out and re.search(r"Total params: 3\b", out), out
    assert "FLOPs" not in out, out  # Lightning's: a FLOPs column of zeros and "Total FLOPs: 0"


# --------------------------------------------------------------------------- 3. a misspelt key


def test_a_misspelt_key_is_one_line_naming_the_closest_key(cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    typo, added = cli.run_many(
        ("mmtx-train", "data.batchsize=8", f"paths.data_dir={data}"),
        ("mmtx-train", "+data.batchsize=8", f"paths.data_dir={data}", f"hydra.run.dir={tmp_path / 'run'}"),
        cwd=tmp_path,
        check=False,
    )
    assert typo.returncode == 1, cli.describe(typo)
    # Hydra's own: "Could not override 'data.batchsize'. To append to your config use +data.batchsize=8"
    assert typo.stderr.strip() == "mmtx: data.batchsize is not a key of data (did you mean data.batch_size?)"
    assert added.returncode == 1, cli.describe(added)  # added with +: refused before the constructor gets it
    assert "  data.batchsize is not a key of data (did you mean data.batch_size?)" in added.stderr.splitlines()
    assert "Traceback" not in added.stderr and not data.exists()


def test_unknown_keys_are_found_in_the_config_group_chosen_on_the_cli() -> None:
    assert unknown_override_keys("train", ["data=coco", "data.train.imagess=x", "sed=1", "task.lr=1e-3"]) == [
        "data.train.imagess is not a key of data.train (did you mean data.train.images?)",
        "sed is not a key of the config (did you mean seed?)",
    ]
    assert unknown_override_keys("train", ["data=coco", "data.zzz=9"]) == ["data.zzz is not a key of data"]
    assert unknown_override_keys("train", ["data=coco", "data.test.images=x"]) == \
        ["data.test.images is not a key of data.test, which is null: give it whole, e.g. data.test={images:...}"]  # fmt: skip
    assert unknown_override_keys("caption", ["ckpt=x", "imgaes=[a.jpg]"]) == \
        ["imgaes is not a key of the config (did you mean images?)"]  # fmt: skip
    # what Hydra refuses for other reasons, it says itself: an unknown option, a sweep, --help
    for argv in (["data=nope"], ["-m", "seed=0,1"], ["--help", "data.batchsize=1"], ["+data.batchsize=8"]):
        assert unknown_override_keys("train", argv) == [], argv


# ------------------------------------------------------------------------ 4. a wrong image folder


def coco_file(path: Path, names: list[str]) -> Path:
    atomic_write_json(path, {
        "images": [{"id": i + 1, "file_name": name} for i, name in enumerate(names)],
        "annotations": [{"id": i + 1, "image_id": i + 1, "caption": "a red circle"} for i in range(len(names))],
    })  # fmt: skip
    return path


def test_images_smaller_than_the_training_size_are_named_as_enlarged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"{i}.png" for i in range(40)]
    for i, name in enumerate(names):  # the longest side at most 40 px, in two aspect ratios
        Image.new("RGB", (40, 24) if i % 2 else (30, 40), "red").save(tmp_path / name)
    split = {"annotations": str(coco_file(tmp_path / "c.json", names)), "images": str(tmp_path)}
    with caplog.at_level("WARNING", logger="mmtx"):
        CocoCaptions(train=split, image_size=48, in_memory=False).setup("fit")
    enlarged = [r.getMessage() for r in caplog.records if "enlarges" in r.getMessage()]
    assert enlarged == [
        "data.image_size=48 enlarges the training images (the longest side among 20 read: 40 px): each step "
        "costs more for no more detail; a data.image_size of at most 40 trains faster, as the shapes presets do"
    ]
    caplog.clear()
    Image.new("RGB", (48, 20), "red").save(
        tmp_path / names[20]
    )  # one of those read (every other) is as large as the training size
    with caplog.at_level("WARNING", logger="mmtx"):
        CocoCaptions(train=split, image_size=48, in_memory=False).setup("fit")
    assert not [r for r in caplog.records if "enlarges" in r.getMessage()]


def test_a_missing_image_folder_is_one_line(cli, tmp_path: Path) -> None:
    captions = coco_file(tmp_path / "captions.json", ["a.png", "b.png"])
    result = cli.run("mmtx-train", *TINY_MODEL, "data=coco", "data.image_size=32", "data.num_workers=0",
                     f"data.train.annotations={captions}", "data.train.images=/no/such/dir",
                     f"data.val.annotations={captions}", f"data.val.images={tmp_path}", "logger=none",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, check=False)  # fmt: skip
    assert result.returncode == 1, cli.describe(result)
    assert result.stderr.strip().splitlines()[-1] == "mmtx: data.train.images: folder /no/such/dir does not exist"
    assert result.stderr.count("/no/such/dir") == 1, cli.describe(result)


def test_image_folder_without_listed_images_is_one_line_not_advice_to_skip(tmp_path: Path) -> None:
    names = [f"COCO_train2014_{i:012d}.jpg" for i in range(1, 31)]
    folder = tmp_path / "val2014"  # another split's folder: none of these names is there
    folder.mkdir()
    data = CocoCaptions(train={"annotations": str(coco_file(tmp_path / "c.json", names)), "images": str(folder)})
    with pytest.raises(FileNotFoundError) as found:
        data.records("train")
    assert str(found.value) == (
        f"data.train.images: none of the first 20 images of the train split is in {folder} "
        f"(e.g. {names[0]}); is it the folder of these annotations' images?"
    )
    # some of the first are there: the missing ones are bad images, each named, as before
    Image.new("RGB", (8, 8)).save(folder / names[3])
    with pytest.raises(ValueError, match="29 bad image file"):
        CocoCaptions(train={"annotations": str(tmp_path / "c.json"), "images": str(folder)}).records("train")
    a_file = tmp_path / "c.json"
    with pytest.raises(FileNotFoundError, match=re.escape(f"data.train.images: {a_file} is a file, not a folder")):
        CocoCaptions(train={"annotations": str(a_file), "images": str(a_file)}).records("train")


# ------------------------------------------------------------------------- 5. caption a folder


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny captioner (untrained, its weights spread) as mmtx-export writes it."""
    task = build_task(TINY_CAPTIONER, Tokenizer.train(CAPTIONS * 5, vocab_size=60))
    return export_task(task, tmp_path_factory.mktemp("captioner") / "export")


def test_mmtx_caption_writes_coco_results_for_a_folder_skipping_non_images(
    cli, export_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "val2014"
    (folder / "sub").mkdir(parents=True)
    rng = torch.Generator().manual_seed(0)
    for name in ("COCO_val2014_000000000042.jpg", "7.png", "sub/3.png", ".hidden.png", "photo.png"):
        pixels = torch.randint(0, 256, (40, 40, 3), generator=rng, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / name)
    (folder / "COCO_val2014_000000000009.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # corrupt
    (folder / "notes.txt").write_text("not an image")
    results = tmp_path / "out" / "results.json"
    printed, written = cli.run_many(
        ("mmtx-caption", f"ckpt={export_dir}", f"images={folder}", "batch_size=2"),
        ("mmtx-caption", f"ckpt={export_dir}", f"images={folder}/", "batch_size=2", f"predictions={results}"),
        cwd=tmp_path,
    )
    # sorted by name, its subfolder and hidden files left out; what is no image skipped, one line each
    lines = [line.split("\t") for line in printed.stdout.splitlines()]
    assert [Path(path).name for path, _ in lines] == ["7.png", "COCO_val2014_000000000042.jpg", "photo.png"], \
        cli.describe(printed)  # fmt: skip
    skipped = printed.stderr.strip().splitlines()
    assert len(skipped) == 2 and all(line.startswith("skipped ") for line in skipped), cli.describe(printed)
    assert "COCO_val2014_000000000009.jpg" in skipped[0] and "notes.txt" in skipped[1]

    # the official results format, ids from the names; a file without one is left out, with a line
    captions = {Path(path).name: caption for path, caption in lines}
    assert json.loads(results.read_text()) == [
        {"image_id": 7, "caption": captions["7.png"]},
        {"image_id": 42, "caption": captions["COCO_val2014_000000000042.jpg"]},
    ]
    assert all(caption.strip() for caption in captions.values())
    lines = written.stderr.strip().splitlines()
    assert len(lines) == 3 and {line.split()[1].rstrip(":").rsplit("/", 1)[-1] for line in lines} == \
        {"COCO_val2014_000000000009.jpg", "notes.txt", "photo.png"}, cli.describe(written)  # fmt: skip
    assert written.stdout.strip() == f"captioned 2 of 5 files: {results}"


# ---------------------------------------------------------------------- 6. modes of written files


def test_files_written_through_a_temporary_file_get_the_mode_open_gives(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        task = build_task(TINY_CAPTIONER, Tokenizer.train(CAPTIONS * 5, vocab_size=60))
        export_task(task, tmp_path / "export")
        atomic_write_json(tmp_path / "captions.json", {"images": []})
        build_once(tmp_path / "drawn", {"format": "test"}, [], lambda staging, meta: (staging / "a").write_text("a"),
                   "test set")  # fmt: skip
    finally:
        os.umask(previous)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {
        "export": 0o755, "export/model.safetensors": 0o644, "export/config.json": 0o644,
        "export/tokenizer.json": 0o644, "captions.json": 0o644, "drawn": 0o755, "drawn/a": 0o644,
        "drawn/meta.json": 0o644,
    }  # fmt: skip
