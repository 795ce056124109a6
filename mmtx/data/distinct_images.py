"""A batch's images stacked once each, for batches that hold several texts per image (an image's
questions, or its captions): the model encodes each image once and each text reads its row."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import default_collate


class DistinctImages(NamedTuple):
    """A batch's images, each once, and where each example's image is among them."""

    images: torch.Tensor  # (U, 3, H, W): each distinct image of the batch once
    image_index: torch.Tensor  # (B,): the row of `images` each example's image is
    ids: list[Hashable]  # (U,): each row's image id


def stack_distinct_images(examples: Sequence[dict[str, Any]]) -> DistinctImages:
    """The examples' ``image`` tensors stacked once per distinct image: the same ``image_id`` and
    the same pixels (an image cropped or mirrored otherwise for another example is a row of its
    own), found by id first so that only an id's own rows are compared."""
    images: list[torch.Tensor] = []
    rows: dict[Any, list[int]] = {}  # image id -> its rows in `images`
    image_index, ids = [], []
    for e in examples:
        same = rows.setdefault(e["image_id"], [])
        row = next((r for r in same if torch.equal(images[r], e["image"])), len(images))
        if row == len(images):
            same.append(row)
            images.append(e["image"])
            ids.append(e["image_id"])
        image_index.append(row)
    # default_collate: in a loader worker, straight into shared memory
    return DistinctImages(default_collate(images), torch.tensor(image_index), ids)
