"""Caption data sets as Lightning data modules: shapes scenes, COCO captions, Karpathy splits.

Every source reads into :class:`CaptionRecord` lists; one data module class per source says only
where its records come from, and the base class does the rest (datasets, batching, tokenizing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from mmtx.data.captions import CaptionRecord, read_coco_captions, read_karpathy
from mmtx.data.images import load_image
from mmtx.data.shapes import generate_shapes
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.transforms import build_transforms

SPLITS = ("train", "val", "test")


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


class CaptionDataModule(L.LightningDataModule):
    """Batches of images and captions; subclasses say where the records come from.

    Args:
        image_size: side of the square images the model sees.
        batch_size: training batch size; ``eval_batch_size`` for validation/test (default: same).
        num_workers: processes that decode and transform images.
        max_length: longest caption in tokens, [BOS] and [EOS] included (longer ones are cut).
        crop_scale: ``[min, max]`` area for random resized crops in training; ``None``: no crop.
    """

    def __init__(
        self,
        image_size: int = 224,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        max_length: int = 32,
        crop_scale: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        if image_size <= 0 or batch_size <= 0 or max_length < 3:
            raise ValueError(
                f"data: image_size={image_size}, batch_size={batch_size} must be positive and "
                f"max_length={max_length} at least 3"
            )
        self.image_size, self.batch_size = image_size, batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers, self.max_length = num_workers, max_length
        self.crop_scale = tuple(crop_scale) if crop_scale else None
        self.tokenizer: Tokenizer | None = None  # set by the caller (trained or loaded)
        self.datasets: dict[str, CaptionDataset] = {}
        self._records: dict[str, list[CaptionRecord]] = {}

    # --- what a source provides -------------------------------------------------------------
    def load_records(self, split: str) -> list[CaptionRecord]:
        raise NotImplementedError

    def has_split(self, split: str) -> bool:
        return True

    def records(self, split: str) -> list[CaptionRecord]:
        """The split's records, read once."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if split not in self._records:
            self._records[split] = self.load_records(split)
        return self._records[split]

    def references(self, split: str) -> dict[int, list[str]]:
        return {r.image_id: list(r.captions) for r in self.records(split) if r.captions}

    # --- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage or "fit", ())
        for split in wanted:
            if split not in self.datasets and self.has_split(split):
                train = split == "train"
                transform = build_transforms(self.image_size, train=train, crop_scale=self.crop_scale)
                self.datasets[split] = CaptionDataset(self.records(split), transform, pairs=train)

    def _loader(self, split: str, train: bool) -> DataLoader:
        if self.tokenizer is None:
            raise RuntimeError("CaptionDataModule.tokenizer must be set before making data loaders")
        self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=CaptionCollator(self.tokenizer, self.max_length),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)


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
        files = self.splits.get(split) or {}
        missing = [k for k in ("annotations", "images") if not files.get(k)]
        if missing:
            raise ValueError(f"data.{split}.{missing[0]} is not set (needed to read the {split} split)")
        return read_coco_captions(files["annotations"], files["images"])


class KarpathyCaptions(CaptionDataModule):
    """One Karpathy-split file (``dataset_coco.json`` style) with a ``split`` per image."""

    def __init__(self, annotations: str, images: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.annotations, self.images = annotations, images

    def load_records(self, split: str) -> list[CaptionRecord]:
        return read_karpathy(self.annotations, self.images, split)
