"""Caption data sets as Lightning data modules: COCO captions files, Karpathy splits.

Every source reads into :class:`CaptionRecord` lists; one data module class per source says only
where its records come from, and the base classes do the rest (datasets, batching, tokenizing).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from mmtx.data.annotations import TextLimit
from mmtx.data.bad_data import FAILURES_KEY, Policy
from mmtx.data.base import ImageTextDataModule
from mmtx.data.captions.files import CaptionRecord, read_coco_captions, read_karpathy, read_pairs
from mmtx.data.dataset import ImageTextDataset
from mmtx.data.distinct_images import stack_distinct_images
from mmtx.data.images import MAX_IMAGE_PIXELS
from mmtx.data.mirroring import Mirror, build_mirror
from mmtx.data.packed import PackedList
from mmtx.data.splits import FileSplits, split_files
from mmtx.data.tokenizer import Tokenizer


class CaptionDataset(ImageTextDataset):
    """Images with their reference captions.

    ``pairs=True`` (training) yields one example per (image, caption) pair, as is usual on COCO;
    ``pairs=False`` (evaluation) yields one example per image with all its references. An image
    that fails to decode is handled as `ImageTextDataset` says. The records are packed
    (`PackedList`), so that loader workers reading them do not copy them. With a ``mirror``,
    half the examples come mirrored left to right, their captions' side words swapped.
    """

    def __init__(self, records: list[CaptionRecord], transform: Any, pairs: bool,
                 on_bad_image: Policy = "error", max_pixels: int = MAX_IMAGE_PIXELS,
                 mirror: Mirror | None = None) -> None:  # fmt: skip
        super().__init__(transform, on_bad_image, max_pixels)
        self.mirror = mirror
        self.records = PackedList(records)
        counts = np.array([len(rec.captions) for rec in records] if pairs else [1] * len(records), dtype=np.int64)
        record = np.repeat(np.arange(len(records)), counts)  # (N,) the record of each example
        caption = np.arange(len(record)) - np.repeat(np.cumsum(counts) - counts, counts)  # (N,) its caption
        self.index = np.stack([record, caption], axis=1)  # (N, 2)

    def __len__(self) -> int:
        return len(self.index)

    def record(self, i: int) -> CaptionRecord:
        return self.records[int(self.index[i, 0])]

    def example_image_ids(self) -> list[int]:
        """Each example's image id (each record unpacked once, not once per caption)."""
        ids = [rec.image_id for rec in self.records]
        return [ids[r] for r in self.index[:, 0].tolist()]

    @property
    def draws_random(self) -> bool:
        return self.mirror is not None or super().draws_random

    def example(self, i: int, rec: CaptionRecord, image: torch.Tensor) -> dict[str, Any]:
        c = int(self.index[i, 1])
        captions = list(rec.captions)
        if self.mirror is not None:
            image, captions = self.mirror(image, captions)
        return {
            "image": image,
            "caption": captions[c] if captions else "",
            "references": captions,
            "image_id": rec.image_id,
        }


class CaptionCollator:
    """Stacks images and tokenizes the batch's captions in one call to the fast tokenizer.

    With ``distinct_images``, ``images`` (U, 3, H, W) holds each distinct image of the batch once
    and ``image_index`` (B,) the row of each caption's image (`stack_distinct_images`), so an
    image with several captions in the batch is encoded once; ``image_ids`` then names the rows.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, distinct_images: bool = False) -> None:
        self.tokenizer, self.max_length, self.distinct_images = tokenizer, max_length, distinct_images

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids, mask = self.tokenizer.encode_batch([e["caption"] for e in examples], self.max_length)
        if self.distinct_images:
            distinct = stack_distinct_images(examples)
            images: dict[str, Any] = {
                "images": distinct.images,
                "image_index": distinct.image_index,
                "image_ids": torch.tensor(distinct.ids),
            }
        else:  # in a worker, default_collate stacks straight into shared memory
            images = {
                "images": default_collate([e["image"] for e in examples]),  # (B, 3, H, W)
                "image_ids": torch.tensor([e["image_id"] for e in examples]),
            }
        return {
            **images,
            "input_ids": input_ids,  # (B, T): [BOS] caption [EOS] [PAD]...
            "attention_mask": mask,
            "references": [e["references"] for e in examples],
            FAILURES_KEY: [f for e in examples for f in e.get(FAILURES_KEY, ())],
        }


class CaptionDataModule(ImageTextDataModule):
    """Images and their captions (training: one example per pair; evaluation: per image).

    ``mirror_words``: pairs of words (``[[left, right]]``) that name a side; given, each training
    image is mirrored left to right with probability one half and those words swapped in its
    captions (`mmtx.data.mirroring`). None: no image is mirrored.

    ``group_by_image``: training shuffles images rather than captions and lists each image's
    captions one after another, augmented alike, so a batch holds all the captions of fewer
    images and the captioner encodes each of them once (as captioners trained on COCO read its
    five captions per image). Off: every batch holds the captions of as many images.
    """

    def __init__(
        self, *, mirror_words: list[list[str]] | None = None, group_by_image: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.mirror = build_mirror(mirror_words)
        self.group_by_image = group_by_image

    def example_groups(self, split: str) -> list[int] | None:
        """Each example's image id when grouping by image (None: no groups)."""
        if not self.group_by_image:
            return None
        return self.datasets[split].example_image_ids()  # type: ignore[attr-defined]

    def make_dataset(self, records: list[CaptionRecord], transform: Any, train: bool) -> Dataset:
        return CaptionDataset(
            records, transform, pairs=train, on_bad_image=self.on_bad_image, max_pixels=self.max_image_pixels,
            mirror=self.mirror if train else None,
        )  # fmt: skip

    def make_collator(self, train: bool) -> CaptionCollator:
        return CaptionCollator(self.tokenizer, self.max_length, distinct_images=train and self.group_by_image)

    def texts(self, split: str = "train") -> list[str]:
        return [c for r in self.records(split) for c in r.captions]

    def references(self, split: str) -> dict[int, list[str]]:
        return {r.image_id: list(r.captions) for r in self.records(split) if r.captions}

    def score_captions(self, split: str, predictions: dict[int, str]) -> dict[str, float]:
        """Metrics beyond the COCO ones that this data set can compute for generated captions
        (e.g. correctness against a known scene); none by default."""
        return {}

    def describe(self, records: list[CaptionRecord]) -> str:
        return f"their {sum(len(r.captions) for r in records)} caption(s)"

    def input_texts(self, split: str) -> list[tuple[str, str]]:
        return [(f"image {r.image_id} caption {k}", c) for r in self.records(split) for k, c in enumerate(r.captions)]


class CocoCaptions(FileSplits, CaptionDataModule):
    """Official COCO captions files: ``{split: {annotations: captions_*.json, images: folder}}``."""

    index_file = "annotations"

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[CaptionRecord]:
        files = split_files(self.splits, split, ("annotations", "images"))
        return read_coco_captions(files["annotations"], files["images"], skipped=skipped, limit=limit)


class PairsCaptions(FileSplits, CaptionDataModule):
    """Your own pairs: ``{split: {file: a .jsonl or .csv of image + caption rows, images: folder}}``."""

    index_file = "file"

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[CaptionRecord]:
        files = split_files(self.splits, split, ("file", "images"))
        return read_pairs(files["file"], files["images"], skipped=skipped, limit=limit)


class KarpathyCaptions(CaptionDataModule):
    """One Karpathy-split file (``dataset_coco.json`` style) with a ``split`` per image."""

    def __init__(self, annotations: str, images: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.annotations, self.images = annotations, images

    def image_folder(self, split: str) -> tuple[str, str] | None:
        return ("data.images", self.images) if self.images else None

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[CaptionRecord]:
        return read_karpathy(self.annotations, self.images, split, skipped=skipped, limit=limit)
