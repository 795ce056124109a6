"""The data set every image-text example is read through: its image decoded (or served from
memory), a failed decode replaced by the next example's and listed for the loader."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset, get_worker_info

from mmtx.data.bad_data import DECODE_HINT, FAILURES_KEY, Policy, check_policy
from mmtx.data.images import MAX_IMAGE_PIXELS, ImageLoadError, ImageSource, header_size, read_image
from mmtx.data.memory import ImagesInMemory, fits_in_memory

log = logging.getLogger(__name__)

SIZE_SAMPLE = 32  # training images whose headers `warn_if_enlarged` reads


class ImageTextDataset(Dataset):
    """Examples that each need an image: an image that fails to decode is replaced by the next
    example's, and listed in the example (``image_failures``) for the loader to count or raise.

    Under ``on_bad_image=error`` outside a loader worker the `ImageLoadError` is raised at once.
    An image of more than ``max_pixels`` pixels fails to decode, refused from its header.
    """

    def __init__(self, transform: Any, on_bad_image: Policy = "error", max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.transform = transform
        self.on_bad_image = check_policy(on_bad_image, "on_bad_image")
        self.max_pixels = max_pixels
        self.memory: ImagesInMemory | None = None  # set by `keep_in_memory`

    @property
    def draws_random(self) -> bool:
        """Whether reading an example draws random numbers, so that the loader seeds each read
        (`SeededDataset`): through the transform, unless the images are served from memory, where
        they are its fixed output. A subclass whose ``example`` draws must say True."""
        return self.memory is None

    def keep_in_memory(self, image_size: int, desc: str = "decoding images") -> ImagesInMemory:
        """Decode every image now, once, and serve them from memory from then on. Only for a
        deterministic ``transform`` (evaluation, or training without random crops): the stored
        images are its resized output."""
        self.memory = ImagesInMemory((self.image_path(i) for i in range(len(self))), image_size, desc, self.max_pixels)
        return self.memory

    def image(self, path: Path) -> Tensor:
        """The resized (or cropped) uint8 image (3, S, S), from memory or decoded from disk;
        batches are normalised on the training device (`on_after_batch_transfer`)."""
        if self.memory is not None:
            return self.memory[path]
        return self.transform(read_image(path, self.max_pixels))

    def record(self, i: int) -> Any:
        """Example ``i``'s record (anything with the image's ``path``): read once per example, as
        unpickling a packed record is a good share of a small model's loading time."""
        raise NotImplementedError

    def example(self, i: int, record: Any, image: Tensor) -> dict[str, Any]:
        """Example ``i`` from its `record` and its loaded image."""
        raise NotImplementedError

    def image_path(self, i: int) -> ImageSource:
        return self.record(i).path

    def __getitem__(self, i: int) -> dict[str, Any]:
        failures: list[tuple[str, str]] = []
        for step in range(len(self)):
            j = (i + step) % len(self)
            record = self.record(j)
            if any(record.path == Path(failed) for failed, _ in failures):
                continue  # another text of the same image
            try:
                image = self.image(record.path)
            except ImageLoadError as err:
                if self.on_bad_image == "error" and get_worker_info() is None:
                    raise ImageLoadError(err.path, f"{err.reason} ({DECODE_HINT})") from err
                failures.append((str(err.path), err.reason))
                continue
            return {**self.example(j, record, image), FAILURES_KEY: failures}
        raise ImageLoadError(self.image_path(i), "no image of this split can be loaded")


def keep_split_in_memory(
    dataset: ImageTextDataset, split: str, records: list[Any], *, in_memory: bool | str, image_size: int,
    random_crops: bool,
) -> None:  # fmt: skip
    """Decode the images of ``records`` (the split's, each with a ``path``) into memory now when
    ``in_memory`` says so: ``true``, or ``auto`` when they fit in `mmtx.data.memory.MAX_MEMORY_BYTES`;
    never for training with ``random_crops``, which need the original images. An image that fails
    to decode stops here under the data set's ``on_bad_image=error``; under ``skip`` it is
    replaced where it is read."""
    if in_memory is False:
        return
    if random_crops:
        if in_memory is True:
            log.warning("data.in_memory=true ignored for training: random crops need the original images")
        return
    if in_memory == "auto" and not fits_in_memory(len({r.path for r in records}), image_size):
        return
    memory = dataset.keep_in_memory(image_size, desc=f"decoding {split} images")
    log.info("%s split: %d images decoded into memory (%.0f MB)", split, len(memory), memory.nbytes / 1e6)
    if memory.failed and dataset.on_bad_image == "error":
        path, reason = next(iter(memory.failed.items()))
        raise ImageLoadError(path, f"{reason} ({DECODE_HINT})")


def warn_if_enlarged(dataset: ImageTextDataset, image_size: int) -> None:
    """Warn when each of up to `SIZE_SAMPLE` training images, spread over the split, is smaller
    on its longer side than ``image_size``: each is enlarged to it, which makes a step dearer
    (more patches) and shows the model no more detail. Small images given a data group made for
    natural ones meet this; the shapes presets train small images at their own size. Nothing is
    decoded: the sizes come from the files' headers."""
    n = len(dataset)
    sides: list[int] = []
    for path in dict.fromkeys(dataset.image_path(i) for i in range(0, n, max(1, -(-n // SIZE_SAMPLE)))):
        try:
            sides.append(max(header_size(path, dataset.max_pixels)))
        except ImageLoadError:  # reported by the scan or where it is decoded, by the data's policy
            continue
    if sides and max(sides) < image_size:
        log.warning(
            "data.image_size=%d enlarges the training images (the longest side among %d read: %d px): "
            "each step costs more for no more detail; a data.image_size of at most %d trains faster, "
            "as the shapes presets do",
            image_size, len(sides), max(sides), max(sides),
        )  # fmt: skip
