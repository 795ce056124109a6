"""The inference commands end to end on the shared trained captioner: mmtx-caption's captions
(greedy, beam search, attention maps), an export directory read like the checkpoint, each
command's ``--help``, and mmtx-vqa refusing incomplete arguments before loading anything."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmtx.checkpoint import load_task
from mmtx.data.images import load_image
from mmtx.data.transforms import build_transforms
from tests.helpers import Run, copy_images


@pytest.mark.slow
def test_mmtx_caption_prints_one_caption_per_image(cli, trained: Run, val_records, tmp_path: Path) -> None:
    images = [tmp_path / "a.png", tmp_path / "b b.jpg", tmp_path / "c.png"]  # a space in a name, a JPEG
    copy_images([r.path for r in val_records[:3]], tmp_path, [p.name for p in images])
    listed = "images=[" + ",".join(f"'{p}'" for p in images) + "]"
    greedy, beam, mapped = cli.run_many(
        ("mmtx-caption", f"ckpt={trained.last}", listed),
        ("mmtx-caption", f"ckpt={trained.last}", listed, "generation.num_beams=3", "batch_size=2"),
        ("mmtx-caption", f"ckpt={trained.last}", listed, f"attention={tmp_path / 'maps'}", "batch_size=2"),
        cwd=tmp_path,
    )
    # with attention maps: the same captions, and a PNG per image (the image, then a panel per word)
    assert [line for line in mapped.stdout.splitlines() if "\t" in line] == \
        [line for line in greedy.stdout.splitlines() if "\t" in line]  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["a.png", "b b.png", "c.png"]
    assert Image.open(tmp_path / "maps" / "a.png").size[0] == 4 * 160
    printed = []
    for result in (greedy, beam):
        lines = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
        assert [path for path, _ in lines] == [str(p) for p in images], cli.describe(result)
        for _, caption in lines:
            assert caption.strip() and caption == " ".join(caption.split())  # words, single spaces
        printed.append([caption for _, caption in lines])

    # the command line's settings reach the decoder: the captions are what the checkpoint's model
    # generates greedily and with 3 beams (tested in test_generation to find likelier captions)
    task = load_task(trained.last).eval()
    batch = torch.stack([build_transforms(task.model.encoder.image_size, train=False)(load_image(p)) for p in images])
    with torch.no_grad():
        expected = [task.caption(batch, dataclasses.replace(task.generation, num_beams=beams)) for beams in (1, 3)]
    assert printed == expected
    assert expected[0] != expected[1], expected  # on these images beam search finds other captions


@pytest.mark.slow
def test_inference_commands_read_an_export_directory_like_the_checkpoint(
    cli, trained: Run, val_records, tmp_path: Path
) -> None:
    copy_images([r.path for r in val_records[:2]], tmp_path, ["a.png", "b.png"])
    listed = f"images=[{tmp_path / 'a.png'},{tmp_path / 'b.png'}]"
    export = tmp_path / "export"
    cli.run("mmtx-export", f"ckpt={trained.last}", f"out={export}", cwd=tmp_path)
    from_ckpt, from_export, evaluated = cli.run_many(
        ("mmtx-caption", f"ckpt={trained.last}", listed),
        ("mmtx-caption", f"ckpt={export}", listed),
        ("mmtx-eval", f"ckpt={export}"),  # an export records no data set: say so, in one line
        cwd=tmp_path,
        check=False,
    )
    captions = [line.split("\t") for line in from_export.stdout.splitlines() if "\t" in line]
    assert len(captions) == 2 and from_export.stdout == from_ckpt.stdout, cli.describe(from_export)
    assert evaluated.returncode == 1 and evaluated.stderr.strip() == (
        f"mmtx: {export} records no data set: choose one, e.g. data=coco data.val.annotations=..."
    ), cli.describe(evaluated)


@pytest.mark.parametrize("app", ["mmtx-eval", "mmtx-caption", "mmtx-vqa", "mmtx-export"])
def test_help_of_each_inference_command_says_what_it_does_with_examples(cli, app: str, tmp_path: Path) -> None:
    result = cli.run(app, "--help", cwd=tmp_path)
    first = result.stdout.lstrip().splitlines()[0]
    assert first.startswith(f"{app}: ") and len(first) > len(app) + 30, first
    examples = result.stdout.split("Examples:", 1)[1]
    assert f"{app} ckpt=" in examples
    assert "powered by Hydra" not in result.stdout and "Configuration groups" not in result.stdout
    assert "ckpt: ???" in result.stdout  # and its settings


def test_vqa_with_an_image_and_no_question_is_one_line_before_loading(cli, tmp_path: Path) -> None:
    result = cli.run("mmtx-vqa", "ckpt=missing.ckpt", "image=a.jpg", cwd=tmp_path, check=False)
    assert result.returncode == 1, cli.describe(result)
    assert (
        result.stderr.strip() == 'mmtx: give image=FILE question="..." or questions=FILE.json images=DIR (given: image)'
    )
