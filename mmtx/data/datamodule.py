"""Caption data sets as Lightning data modules: shapes scenes, COCO captions, Karpathy splits.

Every source reads into :class:`CaptionRecord` lists; one data module class per source says only
where its records come from, and the base classes do the rest (datasets, batching, tokenizing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from mmtx.data.base import ImageTextDataModule, split_files
from mmtx.data.captions import CaptionRecord, read_coco_captions, read_karpathy
from mmtx.data.images import load_image
from mmtx.data.shapes import generate_shapes
from mmtx.data.tokenizer import Tokenizer


class CaptionDataset(Dataset):
    """Images with their reference captions.

    ``pairs=True`` (training) yields one example per (image, caption) pair, as is usual on COCO;
    ``pairs=False`` (evaluation) yields one example per image with all its references.
    """

    def __init__(self, records: list[CaptionRecord], transform: Any, pairs: bool) -> None:
        self.records, self.transform = records, transform
        self.index = (
            [(r, c) for r, rec in enumerate(records) for c in range(len(rec.captions))]
            if pairs
            else [(r, 0) for r in range(len(records))]
        )

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r, c = self.index[i]
        rec = self.records[r]
        return {
            "image": self.transform(load_image(rec.path)),
            "caption": rec.captions[c] if rec.captions else "",
            "references": list(rec.captions),
            "image_id": rec.image_id,
        }


class CaptionCollator:
    """Stacks images and tokenizes the batch's captions in one call to the fast tokenizer."""

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self.tokenizer, self.max_length = tokenizer, max_length

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids, mask = self.tokenizer.encode_batch([e["caption"] for e in examples], self.max_length)
        return {
            "images": torch.stack([e["image"] for e in examples]),  # (B, 3, H, W)
            "input_ids": input_ids,  # (B, T): [BOS] caption [EOS] [PAD]...
            "attention_mask": mask,
            "image_ids": torch.tensor([e["image_id"] for e in examples]),
            "references": [e["references"] for e in examples],
        }


class CaptionDataModule(ImageTextDataModule):
    """Images and their captions (training: one example per pair; evaluation: per image)."""

    def make_dataset(self, records: list[CaptionRecord], transform: Any, train: bool) -> Dataset:
        return CaptionDataset(records, transform, pairs=train)

    def make_collator(self) -> CaptionCollator:
        return CaptionCollator(self.tokenizer, self.max_length)

    def texts(self, split: str = "train") -> list[str]:
        return [c for r in self.records(split) for c in r.captions]

    def references(self, split: str) -> dict[int, list[str]]:
        return {r.image_id: list(r.captions) for r in self.records(split) if r.captions}


class ShapesCaptions(CaptionDataModule):
    """The embedded default: procedurally drawn shapes scenes, generated under ``root`` on first use."""

    def __init__(
        self, root: str, num_train: int = 8000, num_val: int = 500, seed: int = 0,
        captions_per_image: int = 5, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.root = Path(root)
        self.spec = dict(num_train=num_train, num_val=num_val, seed=seed, captions_per_image=captions_per_image)
        self._files: dict[str, tuple[Path, Path]] | None = None

    def prepare_data(self) -> None:
        self.files()

    def files(self) -> dict[str, tuple[Path, Path]]:
        """Annotation file and image folder per split, generating the data set if needed."""
        if self._files is None:
            self._files = generate_shapes(self.root, image_size=self.image_size, **self.spec)
        return self._files

    def has_split(self, split: str) -> bool:
        return split in ("train", "val")

    def load_records(self, split: str) -> list[CaptionRecord]:
        if split == "test":
            raise ValueError("the shapes data set has train and val splits only")
        return read_coco_captions(*self.files()[split])


class CocoCaptions(CaptionDataModule):
    """Official COCO captions files: ``{split: {annotations: captions_*.json, images: folder}}``."""

    def __init__(
        self, train: dict | None = None, val: dict | None = None, test: dict | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.splits = {"train": train, "val": val, "test": test}

    def has_split(self, split: str) -> bool:
        files = self.splits.get(split)
        return bool(files and files.get("annotations"))

    def load_records(self, split: str) -> list[CaptionRecord]:
        files = split_files(self.splits, split, ("annotations", "images"))
        return read_coco_captions(files["annotations"], files["images"])


class KarpathyCaptions(CaptionDataModule):
    """One Karpathy-split file (``dataset_coco.json`` style) with a ``split`` per image."""

    def __init__(self, annotations: str, images: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.annotations, self.images = annotations, images

    def load_records(self, split: str) -> list[CaptionRecord]:
        return read_karpathy(self.annotations, self.images, split)
