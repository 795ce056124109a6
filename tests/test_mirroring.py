"""Mirrored training images (``data.mirror_words``): the image flipped, its side words swapped,
the captions still true; validation never mirrored; the same mirroring for the same seed."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from mmtx.config_error import ArgumentError
from mmtx.data.captions import CaptionRecord, CocoCaptions
from mmtx.data.captions.datamodule import CaptionDataset
from mmtx.data.mirroring import Mirror
from mmtx.data.sampling import SeededDataset
from mmtx.data.synthetic.grid import GRID, GridScene, draw_grid_scene
from mmtx.data.synthetic.scoring import caption_is_correct
from mmtx.data.transforms import build_pixels
from tests.test_memory import write_images

SIDES = [["left", "right"]]


def mirrored_scene(scene: GridScene) -> GridScene:
    """The scene as its mirror image shows it: every shape's centre and cell reflected left to right."""
    shapes = tuple(dataclasses.replace(s, center=(scene.width - s.center[0], s.center[1])) for s in scene.shapes)
    cells = tuple((row, GRID - 1 - col) for row, col in scene.cells)
    return dataclasses.replace(scene, shapes=shapes, cells=cells)


def test_side_words_swap_as_whole_words_in_their_case() -> None:
    mirror = Mirror(SIDES)
    assert mirror.words("Left of the box, right? LEFT") == "Right of the box, left? RIGHT"
    assert mirror.words("the leftmost ball, upright") == "the leftmost ball, upright"  # not a whole word
    assert mirror.words(mirror.words("a ball left of a box")) == "a ball left of a box"


def test_mirrored_grid_captions_stay_true_and_unswapped_ones_do_not() -> None:
    """Every caption of a grid scene, its side words swapped, holds on the mirrored scene (the
    package's scorer); without the swap, those stating a side do not."""
    mirror, rng = Mirror(SIDES), random.Random(5)
    sided = 0
    for _ in range(80):
        _, captions, scene = draw_grid_scene(rng)
        mirrored = mirrored_scene(scene)
        for text in captions:
            assert caption_is_correct(mirror.words(text), mirrored), text
            if mirror.words(text) != text:
                sided += 1
                assert not caption_is_correct(text, mirrored), text
    assert sided > 20


def _dataset(tmp_path: Path, mirror: Mirror | None) -> CaptionDataset:
    records = [CaptionRecord(i + 1, p, (f"a ball left of a box {i}", f"a box right of a ball {i}"))
               for i, p in enumerate(write_images(tmp_path, 6))]  # fmt: skip
    dataset = CaptionDataset(records, build_pixels(32, train=False), pairs=True, mirror=mirror)
    dataset.keep_in_memory(32)
    return dataset


def test_half_the_training_examples_come_mirrored_and_the_same_for_the_same_seed(tmp_path: Path) -> None:
    plain, mirroring = _dataset(tmp_path, None), _dataset(tmp_path, Mirror(SIDES))
    assert not plain.draws_random and mirroring.draws_random  # the loader seeds each read
    seeded = SeededDataset(mirroring)
    flips = 0
    for seed in range(40):
        i = seed % len(plain)
        original, example = plain[i], seeded[(i, seed)]
        flipped = not torch.equal(example["image"], original["image"])
        if flipped:
            assert torch.equal(example["image"], original["image"].flip(-1))
            assert example["caption"] == Mirror(SIDES).words(original["caption"]) != original["caption"]
            assert example["references"] == [Mirror(SIDES).words(r) for r in original["references"]]
        else:
            assert example["caption"] == original["caption"] and example["references"] == original["references"]
        again = seeded[(i, seed)]
        assert torch.equal(again["image"], example["image"]) and again["caption"] == example["caption"]
        flips += flipped
    assert 10 <= flips <= 30


def test_only_training_examples_are_mirrored() -> None:
    module = CocoCaptions(image_size=32, mirror_words=SIDES, tokenizer=lambda texts: None)
    assert isinstance(module.make_dataset([], None, train=True).mirror, Mirror)
    assert module.make_dataset([], None, train=False).mirror is None
    assert CocoCaptions(image_size=32).make_dataset([], None, train=True).mirror is None


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["left", "right"], "must be pairs of words"),
        ([["left", "right", "up"]], "must be pairs of words"),
        ([["to the left", "right"]], "must be pairs of words"),
        ([["left", "Left"]], "names a word twice"),
        ([["left", "right"], ["right", "east"]], "names a word twice"),
        ([], "is empty; null mirrors nothing"),
    ],
)
def test_bad_mirror_words_are_refused(words: list, expected: str) -> None:
    with pytest.raises(ArgumentError, match=expected) as info:
        CocoCaptions(image_size=32, mirror_words=words)
    assert str(info.value).startswith("mirror_words=")


@pytest.mark.parametrize("data", ["shapes", "grid", "coco", "karpathy", "pairs", "webdataset"])
def test_every_caption_data_config_takes_mirror_words(data: str) -> None:
    """Each caption data group has the key, and its data module's signature takes it."""
    from mmtx.config_check import unknown_keys
    from tests.test_config_check import _train_cfg

    cfg = _train_cfg(f"data={data}", "data.mirror_words=[[left,right]]")
    assert list(cfg.data.mirror_words[0]) == ["left", "right"] and unknown_keys(cfg.data, "data") == []
