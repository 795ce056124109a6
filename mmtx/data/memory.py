"""A split's images decoded once and kept in memory, for data sets small enough to hold.

Decoding the same PNGs or JPEGs every epoch costs a small model on a CPU more than its training
step, and a loader worker to hide it takes one of few cores. Each image is decoded and resized
once (the evaluation pipeline's deterministic half, `build_resize`) into one uint8 tensor; the
float conversion and normalisation stay per batch. One tensor, not a list of objects, so forked
loader workers share its pages instead of copying them as they touch reference counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from mmtx.data.images import MAX_IMAGE_PIXELS, FileSlice, ImageLoadError, ImageSource, map_images, read_image
from mmtx.data.transforms import build_resize

MAX_MEMORY_BYTES = 1024**3  # `in_memory: auto` holds a split whose resized images fit in this


def fits_in_memory(num_images: int, image_size: int, limit: int = MAX_MEMORY_BYTES) -> bool:
    """Whether ``num_images`` resized RGB images of side ``image_size`` fit in ``limit`` bytes."""
    return num_images * 3 * image_size * image_size <= limit


class ImagesInMemory:
    """Every image of ``paths`` as a uint8 (3, S, S) tensor, decoded once (with a progress bar).

    An image that fails to decode (or has more than ``max_pixels`` pixels: `read_image`) is
    remembered with its reason and raises `ImageLoadError` when asked for, as decoding it from
    disk would: the data set's ``on_bad_image`` policy applies.
    """

    def __init__(self, paths: Iterable[ImageSource], image_size: int, desc: str = "decoding images",
                 max_pixels: int = MAX_IMAGE_PIXELS) -> None:  # fmt: skip
        unique = list(dict.fromkeys(map(_key, paths)))
        self.pixels = torch.empty(len(unique), 3, image_size, image_size, dtype=torch.uint8)  # (N, 3, S, S)
        self.slots: dict[Path | FileSlice, int] = {}
        self.failed: dict[Path | FileSlice, str] = {}
        resize = build_resize(image_size)

        def decode(path: Path | FileSlice) -> Tensor | str:
            try:
                return resize(read_image(path, max_pixels))
            except ImageLoadError as err:
                return err.reason

        # 4 threads: Pillow and the resize release the GIL while they work
        for path, result in zip(unique, map_images(decode, unique, 4, desc)):
            if isinstance(result, str):
                self.failed[path] = result
            else:
                self.pixels[len(self.slots)] = result
                self.slots[path] = len(self.slots)
        self.pixels = self.pixels[: len(self.slots)]

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def nbytes(self) -> int:
        return self.pixels.numel()

    def __getitem__(self, path: ImageSource) -> Tensor:
        """The image's uint8 (3, S, S) pixels; `ImageLoadError` if it failed to decode."""
        slot = self.slots.get(_key(path))
        if slot is None:
            raise ImageLoadError(path, self.failed.get(_key(path), "not among the images decoded into memory"))
        return self.pixels[slot]


def _key(source: ImageSource) -> Path | FileSlice:
    return source if isinstance(source, (FileSlice, Path)) else Path(source)
