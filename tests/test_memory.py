"""Images decoded once into memory: the same tensors as decoding from disk, and the same bad-image policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmtx.data.bad_data import FAILURES_KEY, BadDataReport, DecodeFailures
from mmtx.data.captions import CaptionRecord
from mmtx.data.captions.datamodule import CaptionDataset
from mmtx.data.images import ImageLoadError
from mmtx.data.memory import ImagesInMemory, fits_in_memory
from mmtx.data.transforms import build_pixels, build_transforms, normalize_images


def write_images(folder: Path, count: int, size: int = 40) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (size, size + 8 * i, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def dataset(paths: list[Path], policy: str = "error") -> CaptionDataset:
    records = [CaptionRecord(i + 1, p, (f"caption {i}", f"other {i}")) for i, p in enumerate(paths)]
    return CaptionDataset(records, build_pixels(32, train=False), pairs=True, on_bad_image=policy)


def test_examples_from_memory_equal_examples_from_disk(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 4)
    from_disk, in_memory = dataset(paths), dataset(paths)
    memory = in_memory.keep_in_memory(32)
    assert len(memory) == 4 and memory.pixels.dtype == torch.uint8 and memory.nbytes == 4 * 3 * 32 * 32
    for i in range(len(from_disk)):  # two captions per image: each image decoded once, served twice
        a, b = from_disk[i], in_memory[i]
        assert torch.equal(a["image"], b["image"]) and a["caption"] == b["caption"]


def test_a_bad_image_in_memory_follows_the_policy(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 3)
    paths[1].write_bytes(b"not an image")
    memory = ImagesInMemory(paths, 32)
    assert set(memory.failed) == {paths[1]} and len(memory) == 2
    with pytest.raises(ImageLoadError, match="1.png"):
        memory[paths[1]]
    skipping = dataset(paths, policy="skip")
    skipping.keep_in_memory(32)
    example = skipping[2]  # the bad image's first caption: replaced by the next image's example
    assert example["image_id"] == 3 and [Path(p) for p, _ in example[FAILURES_KEY]] == [paths[1]]
    report = BadDataReport()
    DecodeFailures("train", "skip", report)(example[FAILURES_KEY])
    assert report.count("decode", "train") == 1
    strict = dataset(paths, policy="error")
    strict.keep_in_memory(32)
    with pytest.raises(ImageLoadError, match="1.png"):
        strict[2]


def test_auto_holds_only_what_fits() -> None:
    assert fits_in_memory(1000, 64) and not fits_in_memory(200_000, 224)


def test_uint8_batches_normalised_on_the_device_equal_the_whole_pipeline(tmp_path: Path) -> None:
    """Loader workers pass uint8 images; the data module normalises the batch once Lightning has
    moved it (on_after_batch_transfer): the same numbers as the one-image pipeline of the CLIs."""
    from mmtx.data.captions import CocoCaptions
    from mmtx.data.images import read_image

    paths = write_images(tmp_path, 3)
    pixels = torch.stack([build_pixels(32, train=False)(read_image(p)) for p in paths])
    assert pixels.dtype == torch.uint8
    expected = torch.stack([build_transforms(32, train=False)(read_image(p)) for p in paths])
    assert torch.equal(normalize_images(pixels), expected)
    module = CocoCaptions(image_size=32, tokenizer=lambda texts: None)
    batch = module.on_after_batch_transfer({"images": pixels.clone(), "input_ids": torch.zeros(3, 4)}, 0)
    assert torch.equal(batch["images"], expected)


def test_training_batches_only_are_shifted(tmp_path: Path) -> None:
    """``shift_px`` moves the images of training batches; validation sees them as they are."""
    from types import SimpleNamespace

    from mmtx.data.captions import CocoCaptions

    pixels = torch.stack([build_pixels(32, train=False)(Image.open(p)) for p in write_images(tmp_path, 3)])
    module = CocoCaptions(image_size=32, shift_px=3, tokenizer=lambda texts: None)
    module._train_sampler = SimpleNamespace(epoch=0)  # the training loader's sampler: the epoch it serves
    for training in (True, False):
        module.trainer = SimpleNamespace(training=training)  # what the hook reads of a Trainer
        torch.manual_seed(0)
        batch = module.on_after_batch_transfer({"images": pixels.clone()}, 0)
        assert torch.equal(batch["images"], normalize_images(pixels)) is not training
    module.trainer = SimpleNamespace(training=True)
    by_epoch = []
    for epoch in (0, 1, 1):  # each image's shift comes from (seed, epoch, image id)
        module._train_sampler.epoch = epoch
        batch = {"images": pixels.clone(), "image_ids": torch.arange(3)}
        by_epoch.append(module.on_after_batch_transfer(batch, 0)["images"])
    assert not torch.equal(by_epoch[0], by_epoch[1]) and torch.equal(by_epoch[1], by_epoch[2])
    with pytest.raises(ValueError, match=r"^shift_px=16 must be an integer from 0 to image_size/2 - 1"):
        CocoCaptions(image_size=32, shift_px=16)


def test_only_the_batchs_tensors_are_moved() -> None:
    """The data module moves a batch's tensors and leaves its lists of strings as they are (not
    walked string by string, as Lightning's default does)."""
    from mmtx.data.captions import CocoCaptions

    module = CocoCaptions(image_size=32, tokenizer=lambda texts: None)
    answers = [["yes"] * 10, ["2"] * 10]
    batch = {"images": torch.zeros(2, 3, 32, 32, dtype=torch.uint8), "input_ids": torch.ones(2, 5), "answers": answers}
    moved = module.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved["images"].device.type == "meta" and moved["input_ids"].device.type == "meta"
    assert moved["answers"] is answers
    nested = module.transfer_batch_to_device({"pair": (torch.ones(1), torch.ones(2))}, torch.device("meta"), 0)
    assert all(t.device.type == "meta" for t in nested["pair"])  # anything else: Lightning's way


def test_examples_served_from_memory_are_read_without_reseeding(tmp_path: Path) -> None:
    """Images from memory are the fixed output of the transform: the loader reads them without
    forking and seeding the generator per example, and the examples are the same."""
    from mmtx.data.sampling import SeededDataset

    paths = write_images(tmp_path, 3)
    in_memory = dataset(paths)
    assert in_memory.draws_random  # decoded and transformed at each read
    in_memory.keep_in_memory(32)
    assert not in_memory.draws_random  # what the loader reads it with: SeededDataset(reseed=False)
    reseeded, plain = SeededDataset(in_memory), SeededDataset(in_memory, reseed=False)
    state = torch.random.get_rng_state()
    for i in range(len(in_memory)):
        a, b = reseeded[(i, 100 + i)], plain[(i, 100 + i)]
        assert torch.equal(a["image"], b["image"]) and a["caption"] == b["caption"]
    assert torch.equal(torch.random.get_rng_state(), state)  # neither path moved the caller's generator
