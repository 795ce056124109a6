"""The data module every image-text data set shares: a thin LightningDataModule over parts with
one job each. A subclass says where a split's records come from (``load_records``) and how
they become examples and batches (``make_dataset``, ``make_collator``); the module reads and
screens them (`mmtx.data.reading`), keeps a split's images in memory where asked
(`mmtx.data.memory`), serves resumable batches in the same order on any number of processes
(`mmtx.data.sampling`) and prepares them on the training device (`mmtx.data.transforms.prepare_on_device`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from mmtx.config_error import ConfigError
from mmtx.data.annotations import MAX_TEXT_CHARS, TextLimit
from mmtx.data.bad_data import REPORT_FILE, BadDataReport, DecodeFailures, Policy, check_policy
from mmtx.data.dataset import ImageTextDataset, keep_split_in_memory, warn_if_enlarged
from mmtx.data.images import MAX_IMAGE_PIXELS
from mmtx.data.reading import read_split, report_long_texts
from mmtx.data.sampling import ShardedBatchSampler, position_in_epoch, serve
from mmtx.data.settings import check_settings
from mmtx.data.splits import SPLITS
from mmtx.data.tokenizer import Tokenizer, TokenizerError
from mmtx.data.transforms import build_pixels, prepare_on_device

log = logging.getLogger(__name__)


class ImageTextDataModule(L.LightningDataModule, ABC):
    """Batches of images with text, read from per-split records. A batch's images are uint8
    until Lightning has moved the batch to the training device, where they are normalised
    (`on_after_batch_transfer`); a loader read outside a Trainer gives them as uint8.

    Subclasses say where the records come from (``load_records``), how a split becomes a data
    set (``make_dataset``) and how examples are batched (``make_collator``); ``preflight_scan``
    whether image files are checked before training (`mmtx.data.reading`).

    Args:
        image_size: side of the square images the model sees.
        batch_size: training batch size; ``eval_batch_size`` for validation/test (default: same).
        num_workers: processes that decode and transform images.
        max_length: longest text in tokens, [BOS] and [EOS] included (longer ones are cut,
            counted and reported).
        max_text_chars: the most characters a caption, question or answer keeps as it is read
            (longer ones are cut, counted and reported), which bounds what one entry of an
            untrusted file costs each time it is tokenized or scored.
        crop_scale: ``[min, max]`` area for random resized crops in training; ``None``: no crop.
        shift_px: move each training image by a random offset of up to this many pixels each
            way (`mmtx.data.transforms.random_shift`), on the training device; 0: none.
        on_bad_image: ``error`` (stop before training, naming the bad files) or ``skip`` (leave
            them and their texts out; replace an image that fails to decode later).
        on_bad_annotation: the same for malformed annotation entries (default: ``on_bad_image``).
        max_image_pixels: the most pixels (width x height) an image file may have: one with more
            is a bad image, refused from its header before it is decoded (`mmtx.data.images`).
            Pillow's own limit, twice ``PIL.Image.MAX_IMAGE_PIXELS``, still applies above it.
        in_memory: decode each split's images once, before training, and keep them in memory
            (`mmtx.data.memory`): ``true``, ``false``, or ``auto`` (when the resized images fit in
            ``MAX_MEMORY_BYTES``). Never for training with random crops.
        shuffle_seed: the run's seed (the configs take ``seed``), from which each epoch's order
            of training examples and their augmentation come.
        tokenizer: what encodes the texts, or a function that learns it from the training texts
            (``texts("train")``), called by ``setup("fit")``: every process learns the same
            vocabulary from the same text, so none has to wait for another's file.
        val_split: the split that validation reads (``mmtx-eval split=test`` chooses another).
    """

    preflight_scan = True

    def __init__(
        self,
        image_size: int = 224,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        max_length: int = 32,
        max_text_chars: int = MAX_TEXT_CHARS,
        crop_scale: tuple[float, float] | None = None,
        shift_px: int = 0,
        on_bad_image: Policy = "error",
        on_bad_annotation: Policy | None = None,
        max_image_pixels: int = MAX_IMAGE_PIXELS,
        in_memory: bool | str = "auto",
        shuffle_seed: int = 0,
        tokenizer: Tokenizer | Callable[[list[str]], Tokenizer] | None = None,
        val_split: str = "val",
    ) -> None:
        super().__init__()
        check_settings(
            image_size=image_size,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            max_length=max_length,
            max_text_chars=max_text_chars,
            crop_scale=crop_scale,
            shift_px=shift_px,
            max_image_pixels=max_image_pixels,
            in_memory=in_memory,
        )
        self.in_memory = in_memory
        self.image_size, self.batch_size = image_size, batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers, self.max_length = num_workers, max_length
        self.max_text_chars = max_text_chars
        self.crop_scale = tuple(crop_scale) if crop_scale else None
        self.shift_px = shift_px
        self.on_bad_image = check_policy(on_bad_image, "on_bad_image")
        self.on_bad_annotation = check_policy(on_bad_annotation or on_bad_image, "on_bad_annotation")
        self.max_image_pixels = max_image_pixels
        if not (tokenizer is None or isinstance(tokenizer, Tokenizer) or callable(tokenizer)):
            raise TypeError(
                f"tokenizer must be a Tokenizer or a function that learns one, got {type(tokenizer).__name__}"
            )
        self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else None
        self._learn_tokenizer = None if isinstance(tokenizer, Tokenizer) else tokenizer
        self.datasets: dict[str, Dataset] = {}
        self.report = BadDataReport()  # what was left out or cut; bad_data.txt in the run directory
        self._records: dict[str, list[Any]] = {}
        self._lengths_checked: set[str] = set()
        self.seed = shuffle_seed  # the run's seed: the order and augmentation of training examples
        self.val_split = val_split
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint
        self._train_sampler: ShardedBatchSampler | None = None  # the epoch it serves: resumes, shifts

    # --- what a source provides -------------------------------------------------------------
    @abstractmethod
    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[Any]:
        """The split's records (each with a ``path``); bad annotation entries are left out and
        described in ``skipped``; texts longer than ``limit.max_chars`` are cut and listed in
        ``limit.cut`` (pass both to the reader)."""

    @abstractmethod
    def make_dataset(self, records: list[Any], transform: Any, train: bool) -> Dataset:
        """The split's data set of ``records``, read through ``transform`` (training: ``train``)."""

    def describe(self, records: list[Any]) -> str:
        """What leaving ``records`` out drops, e.g. "their 12 caption(s)"."""
        return f"{len(records)} record(s)"

    def input_texts(self, split: str) -> list[tuple[str, str]]:
        """(what, text) for each text the collator tokenizes, to report those cut at max_length."""
        return []

    @abstractmethod
    def make_collator(self, train: bool) -> Callable[[list[Any]], Any]:
        """What turns a list of examples into a batch (tokenizing its texts), for training or
        evaluation (``train``)."""

    @abstractmethod
    def texts(self, split: str = "train") -> list[str]:
        """The split's text, to learn a tokenizer's vocabulary from."""

    def has_split(self, split: str) -> bool:
        return True

    def image_folder(self, split: str) -> tuple[str, str] | None:
        """(its config key, the folder) of the split's image folder, for a source that reads one."""
        return None

    def records(self, split: str) -> list[Any]:
        """The split's records, read and screened once (`mmtx.data.reading.read_split`)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if split not in self._records:
            self._records[split] = read_split(
                split,
                self.load_records,
                folder=self.image_folder(split),
                scan=self.preflight_scan,
                max_text_chars=self.max_text_chars,
                on_bad_image=self.on_bad_image,
                on_bad_annotation=self.on_bad_annotation,
                max_pixels=self.max_image_pixels,
                report=self.report,
                describe=self.describe,
            )
        return self._records[split]

    # --- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """Read, screen and (where asked) decode the stage's splits; for ``fit``, learn the
        tokenizer first when the module was given a function to learn it."""
        stage = stage or "fit"
        if stage == "fit" and self.tokenizer is None and self._learn_tokenizer is not None:
            texts = self.texts("train")
            if not texts:
                raise TokenizerError("the training split has no text to learn a vocabulary from; set tokenizer.path")
            self.tokenizer = self._learn_tokenizer(texts)
        # (split, built for training): only fit trains; mmtx-eval split=train evaluates the split as it is
        wanted = {"fit": (("train", True), (self.val_split, False)), "validate": ((self.val_split, False),),
                  "test": (("test", False),)}.get(stage, ())  # fmt: skip
        for split, train in wanted:
            if split not in self.datasets and self.has_split(split):
                transform = build_pixels(self.image_size, train=train, crop_scale=self.crop_scale)
                records = self.records(split)
                dataset = self.datasets[split] = self.make_dataset(records, transform, train)
                if isinstance(dataset, ImageTextDataset):
                    if train:
                        warn_if_enlarged(dataset, self.image_size)
                    random_crops = train and self.crop_scale is not None
                    keep_split_in_memory(
                        dataset, split, records, in_memory=self.in_memory, image_size=self.image_size,
                        random_crops=random_crops,
                    )  # fmt: skip
        trainer = self.trainer  # attached by Trainer.fit/validate(datamodule=...)
        if trainer is not None and trainer.is_global_zero and self.report.path is None:
            written = self.report.write(Path(trainer.default_root_dir) / REPORT_FILE)
            if written is not None:
                log.warning("bad data: everything left out is listed in %s", written)

    def _loader(self, split: str, train: bool) -> DataLoader:
        self.setup("fit" if train else "test" if split == "test" else "validate")
        if self.tokenizer is None:
            raise RuntimeError(
                f"{type(self).__name__} has no tokenizer: give it one (tokenizer=...), or a function "
                "that learns one and call setup('fit') first"
            )
        self._report_long_texts(split)
        dataset = self.datasets[split]
        examples = len(dataset)  # type: ignore[arg-type]
        trainer = self.trainer  # None outside a Trainer
        sampler = ShardedBatchSampler(
            examples,
            self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            drop_last=train,
            seed=self.seed,
            rank=trainer.global_rank if trainer else 0,
            world_size=trainer.world_size if trainer else 1,
            groups=self.example_groups(split) if train else None,
        )
        if train:
            self._check_full_batch(sampler, examples)
            if self._resume_at is not None:
                sampler.resume(*self._resume_at)
                self._resume_at = None
            self._train_sampler = sampler
        return serve(
            dataset,
            sampler,
            collate=self.make_collator(train),
            failures=DecodeFailures(split, self.on_bad_image, self.report),
            num_workers=self.num_workers,
            seed=self.seed,
            reseed=getattr(dataset, "draws_random", True),
        )

    def _check_full_batch(self, sampler: ShardedBatchSampler, examples: int) -> None:
        """Refuse a training split too small for one full batch: it would train 0 steps and look done."""
        if len(sampler) > 0:
            return
        processes = f" per process ({sampler.world_size} processes)" if sampler.world_size > 1 else ""
        raise ConfigError(
            f"data.batch_size={self.batch_size}: the training split has {examples} examples, not one full "
            f"batch{processes} (incomplete batches are dropped), so training would take no step; set "
            f"data.batch_size={max(1, examples // sampler.world_size)} or less"
        )

    def example_groups(self, split: str) -> list[int] | None:
        """A group id per example of ``split``, to batch each group's examples together (None: no groups)."""
        return None

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """A flat dict's tensors to ``device``, its other values (lists of answers, references,
        skipped files: no tensors in them, as the collators build them) left as they are:
        Lightning's default walks every string of them, which cost a small model's step more than
        moving its tensors. Any other batch goes the default way."""
        if not isinstance(batch, dict) or any(isinstance(v, (dict, tuple)) for v in batch.values()):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        return {k: move_data_to_device(v, device) if isinstance(v, Tensor) else v for k, v in batch.items()}

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning's hook once a batch is on the training device: its images prepared there
        (`mmtx.data.transforms.prepare_on_device`: shifted at random in training, normalised)."""
        trainer, sampler = self.trainer, self._train_sampler
        training = trainer is not None and trainer.training and sampler is not None
        return prepare_on_device(batch, self.shift_px, self.seed, sampler.epoch if training else None)

    # --- resuming mid-epoch ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """Where training is in its epoch; Lightning stores it in every checkpoint."""
        return position_in_epoch(self.trainer, self._train_sampler)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """A resumed run's first training epoch starts after the batches it had already taken."""
        if state:
            self._resume_at = (state["epoch"], state["batches_done"])

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_split, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def _report_long_texts(self, split: str) -> None:
        """Count (once per split) the texts longer than ``max_length`` tokens: cut, and reported."""
        if split not in self._lengths_checked:
            self._lengths_checked.add(split)
            report_long_texts(split, self.input_texts(split), self.tokenizer, self.max_length, self.report)
