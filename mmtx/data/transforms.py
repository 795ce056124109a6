"""Image preprocessing: RGB pixels in (a uint8 (3, H, W) tensor from `read_image`, or a PIL
image), a normalised (3, S, S) float tensor out. Tensors and PIL images are resized by different
bicubic kernels (torch's antialiased one, Pillow's), so training and inference both read tensors.

The data modules split the pipeline in two: loader workers resize to uint8 (`build_pixels`) and
batches are normalised where they arrive, on the training device (`normalize_images`): a uint8
batch is a quarter of the bytes to pass between processes and to the GPU.

There is deliberately no plain horizontal flip, even for training: captions and questions talk
about "left of" and "right of", and a flip would silently make them false. Caption data mirrors
with those words swapped instead (`mmtx.data.mirroring`, ``data.mirror_words``).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

import torch
from torchvision.transforms import InterpolationMode, v2

from mmtx.nn.pixels import IMAGENET_MEAN, IMAGENET_STD


def build_transforms(
    image_size: int,
    train: bool,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    crop_scale: tuple[float, float] | None = None,
) -> v2.Compose:
    """Build the pipeline RGB pixels -> float32 tensor (3, image_size, image_size), normalised.

    The image is squashed to a square (no aspect-preserving crop, so nothing a caption
    mentions is cut away). With `train=True` and a `crop_scale=(lo, hi)`, a
    RandomResizedCrop keeping `lo`..`hi` of the area replaces the squash; `train=True`
    without `crop_scale` is the same deterministic pipeline as evaluation.
    """
    mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std need 3 values (RGB), got mean={mean} std={std}")
    if min(std) <= 0:
        raise ValueError(f"std must be positive, got {std}")

    return v2.Compose([build_pixels(image_size, train, crop_scale), build_normalize(mean, std)])


def build_pixels(image_size: int, train: bool, crop_scale: tuple[float, float] | None = None) -> v2.Compose:
    """The first half of `build_transforms`: RGB pixels -> uint8 (3, image_size, image_size)."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    if not (train and crop_scale is not None):
        return build_resize(image_size)
    lo, hi = crop_scale
    if not 0.0 < lo <= hi <= 1.0:
        raise ValueError(f"crop_scale must satisfy 0 < lo <= hi <= 1, got {crop_scale}")
    crop = v2.RandomResizedCrop(
        (image_size, image_size), scale=(lo, hi), interpolation=InterpolationMode.BICUBIC, antialias=True
    )
    return v2.Compose([crop, v2.PILToTensor()])


def build_resize(image_size: int) -> v2.Compose:
    """The deterministic first half of the evaluation pipeline: RGB pixels -> uint8 (3, S, S).

    Together with `build_normalize` it gives exactly ``build_transforms(image_size, train=False)``;
    a data set that keeps its images in memory stores this half's output.
    """
    size = (image_size, image_size)
    return v2.Compose([v2.Resize(size, interpolation=InterpolationMode.BICUBIC, antialias=True), v2.PILToTensor()])


def build_normalize(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> v2.Compose:
    """uint8 (3, S, S) -> float32 in [0, 1] -> normalised by ``mean``/``std``."""
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=list(mean), std=list(std))])


def normalize_images(images: torch.Tensor) -> torch.Tensor:
    """A uint8 batch (B, 3, S, S) normalised as `build_normalize` does one image, on its device."""
    mean, std = _mean_std(images.device)
    return v2.functional.to_dtype(images, torch.float32, scale=True).sub(mean).div_(std)


@functools.cache
def _mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ImageNet's mean and std as (3, 1, 1) float32 tensors on ``device``, copied there once:
    a copy from the host for every batch would make it wait for the device."""
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(3, 1, 1)
    return mean, std


def random_shift(images: torch.Tensor, max_px: int, seeds: list[int] | None = None) -> torch.Tensor:
    """Move each image of a batch (B, C, H, W) by its own random whole-pixel offset, up to
    ``max_px`` each way, the edge pixels repeated into the uncovered border. Left stays left and
    a small ``max_px`` cuts at most a sliver off an object at the border: answers and captions
    about position, count and colour stay true, and the model cannot learn where on the patch
    grid a shape falls.
    (torchvision's ``RandomCrop(padding_mode="edge")`` on a batch draws one offset for all.) The
    offsets come from the CPU generator, so a batch on an accelerator costs no synchronisation;
    with ``seeds`` (one per image), image i's offset comes from its own seed, whichever process
    and batch it falls in."""
    if max_px <= 0:
        return images
    B, C, H, W = images.shape
    padded = torch.nn.functional.pad(images, (max_px,) * 4, mode="replicate")
    if seeds is None:
        offsets = torch.randint(0, 2 * max_px + 1, (B, 2)).tolist()
    else:
        offsets = [
            torch.randint(0, 2 * max_px + 1, (2,), generator=torch.Generator().manual_seed(s)).tolist() for s in seeds
        ]
    return torch.stack([padded[i, :, y : y + H, x : x + W] for i, (y, x) in enumerate(offsets)])


def image_seeds(seed: int, epoch: int, image_ids: torch.Tensor | list[Any]) -> list[int]:
    """A `random_shift` seed per image from the run's seed, the epoch and the image's id (an int,
    or a string's CRC: Python's string hash differs between processes), so an image moves the
    same way on any number of processes."""
    ids = image_ids.tolist() if isinstance(image_ids, torch.Tensor) else image_ids
    return [hash((seed, epoch, i if isinstance(i, int) else zlib.crc32(str(i).encode()))) for i in ids]


def prepare_on_device(
    batch: dict[str, Any], shift_px: int = 0, seed: int = 0, epoch: int | None = None
) -> dict[str, Any]:
    """``batch`` with its uint8 ``images`` prepared on the training device: in a training
    ``epoch`` (None: not training), each image moved by up to ``shift_px`` pixels each way
    (`random_shift`; a quarter of the bytes to move while still uint8) by an offset drawn from
    the run's ``seed``, the epoch and its image id, the same on any number of processes; then
    normalised (`normalize_images`)."""
    if shift_px and epoch is not None:
        ids = batch.get("image_ids")  # one per row of images
        seeds = None if ids is None else image_seeds(seed, epoch, ids)
        batch["images"] = random_shift(batch["images"], shift_px, seeds)
    batch["images"] = normalize_images(batch["images"])
    return batch
