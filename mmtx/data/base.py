"""The data module every image-text data set shares: splits of records, images, batching."""

from __future__ import annotations

from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset

from mmtx.data.tokenizer import Tokenizer
from mmtx.data.transforms import build_transforms

SPLITS = ("train", "val", "test")


def split_files(splits: dict[str, dict | None], split: str, needed: tuple[str, ...]) -> dict:
    """The files config ``data.<split>`` with every key of ``needed`` set, else a clear error."""
    files = splits.get(split) or {}
    missing = [k for k in needed if not files.get(k)]
    if missing:
        raise ValueError(f"data.{split}.{missing[0]} is not set (needed to read the {split} split)")
    return files


class ImageTextDataModule(L.LightningDataModule):
    """Batches of images with text, read from per-split records.

    Subclasses say where the records come from (``load_records``), how a split becomes a data
    set (``make_dataset``) and how examples are batched (``make_collator``).

    Args:
        image_size: side of the square images the model sees.
        batch_size: training batch size; ``eval_batch_size`` for validation/test (default: same).
        num_workers: processes that decode and transform images.
        max_length: longest text in tokens, [BOS] and [EOS] included (longer ones are cut).
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
        self.datasets: dict[str, Dataset] = {}
        self._records: dict[str, list[Any]] = {}

    # --- what a source provides -------------------------------------------------------------
    def load_records(self, split: str) -> list[Any]:
        raise NotImplementedError

    def make_dataset(self, records: list[Any], transform: Any, train: bool) -> Dataset:
        raise NotImplementedError

    def make_collator(self) -> Any:
        raise NotImplementedError

    def texts(self, split: str = "train") -> list[str]:
        """The split's text, to learn a tokenizer's vocabulary from."""
        raise NotImplementedError

    def has_split(self, split: str) -> bool:
        return True

    def records(self, split: str) -> list[Any]:
        """The split's records, read once."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if split not in self._records:
            self._records[split] = self.load_records(split)
        return self._records[split]

    # --- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage or "fit", ())
        for split in wanted:
            if split not in self.datasets and self.has_split(split):
                train = split == "train"
                transform = build_transforms(self.image_size, train=train, crop_scale=self.crop_scale)
                self.datasets[split] = self.make_dataset(self.records(split), transform, train)

    def _loader(self, split: str, train: bool) -> DataLoader:
        if self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.tokenizer must be set before making data loaders")
        self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.make_collator(),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)
