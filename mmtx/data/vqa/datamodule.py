"""VQA data sets as Lightning data modules: the official VQA v2 files."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from mmtx.data.annotations import TextLimit
from mmtx.data.bad_data import FAILURES_KEY, Policy
from mmtx.data.base import ImageTextDataModule
from mmtx.data.dataset import ImageTextDataset
from mmtx.data.distinct_images import stack_distinct_images
from mmtx.data.images import MAX_IMAGE_PIXELS
from mmtx.data.packed import PackedList
from mmtx.data.splits import FileSplits, split_files
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.vqa.files import VqaRecord, read_vqa


class VqaDataset(ImageTextDataset):
    """One example per question: the image, the question and its ten annotator answers (an
    image that fails to decode is handled as `ImageTextDataset` says)."""

    def __init__(self, records: list[VqaRecord], transform: Any, on_bad_image: Policy = "error",
                 max_pixels: int = MAX_IMAGE_PIXELS) -> None:  # fmt: skip
        super().__init__(transform, on_bad_image, max_pixels)
        self.records = PackedList(records)  # read by loader workers without copying (see PackedList)

    def __len__(self) -> int:
        return len(self.records)

    def record(self, i: int) -> VqaRecord:
        return self.records[i]

    def example(self, i: int, rec: VqaRecord, image: torch.Tensor) -> dict[str, Any]:
        return {
            "image": image,
            "question": rec.question,
            "answers": list(rec.answers),
            "answer_type": rec.answer_type,
            "question_id": rec.question_id,
            "image_id": rec.image_id,
        }


class VqaCollator:
    """Stacks images and tokenizes questions; answers stay strings (the task maps them to targets).

    ``images`` (U, 3, H, W) holds each distinct image of the batch once (same id and same pixels;
    an image cropped otherwise for another question is a row of its own) and ``image_index``
    (B,) the row of each question's image, so an image with several questions in the batch is
    passed to the device and encoded once, with no search for duplicates there.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self.tokenizer, self.max_length = tokenizer, max_length

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids, mask = self.tokenizer.encode_batch([e["question"] for e in examples], self.max_length)
        distinct = stack_distinct_images(examples)
        return {
            "images": distinct.images,
            "image_index": distinct.image_index,
            "image_ids": distinct.ids,  # each row's image id
            "input_ids": input_ids,
            "attention_mask": mask,
            "question_ids": torch.tensor([e["question_id"] for e in examples]),
            "answers": [e["answers"] for e in examples],
            "answer_types": [e["answer_type"] for e in examples],
            FAILURES_KEY: [f for e in examples for f in e.get(FAILURES_KEY, ())],
        }


class VqaDataModule(ImageTextDataModule):
    """Questions about images with ten answers each; subclasses say where the records come from.

    Args:
        group_by_image: shuffle images rather than questions in training, each image's
            questions one after another, so a batch holds all the questions of fewer images and
            the model encodes each of them once (`VqaCollator`).
        **kwargs: see `ImageTextDataModule`.
    """

    def __init__(self, *args: Any, group_by_image: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group_by_image = group_by_image

    def example_groups(self, split: str) -> list[int] | None:
        if not self.group_by_image:
            return None
        return [r.image_id for r in self.datasets[split].records]  # type: ignore[attr-defined]

    def make_dataset(self, records: list[VqaRecord], transform: Any, train: bool) -> Dataset:
        if train:
            records = [r for r in records if r.answers]
        return VqaDataset(records, transform, self.on_bad_image, self.max_image_pixels)

    def make_collator(self, train: bool) -> VqaCollator:
        return VqaCollator(self.tokenizer, self.max_length)

    def texts(self, split: str = "train") -> list[str]:
        return [t for r in self.records(split) for t in (r.question, *dict.fromkeys(r.answers))]

    def describe(self, records: list[VqaRecord]) -> str:
        return f"their {len(records)} question(s)"

    def input_texts(self, split: str) -> list[tuple[str, str]]:
        return [(f"question {r.question_id}", r.question) for r in self.records(split)]

    def answers(self, split: str = "train") -> list[list[str]]:
        """Each question's annotator answers (to build the answer vocabulary from)."""
        return [list(r.answers) for r in self.records(split) if r.answers]


class VqaV2(FileSplits, VqaDataModule):
    """Official VQA v2 files: ``{split: {questions, annotations, images}}`` (test: no annotations)."""

    index_file = "questions"

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[VqaRecord]:
        needed = ("questions", "images") if split == "test" else ("questions", "annotations", "images")
        files = split_files(self.splits, split, needed)
        return read_vqa(files["questions"], files.get("annotations"), files["images"], skipped=skipped, limit=limit)
