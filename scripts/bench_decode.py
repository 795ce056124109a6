"""Decoding an image file into the model's input: Pillow (`mmtx.data.images.load_image`) against
TorchCodec (`mmtx.data.images.read_image`'s fast path) and torchvision.io (deprecated for it).

Times decode + resize to the model's size (+ EXIF orientation) per image, one thread, for
COCO-like JPEGs and for small PNGs like the shapes scenes, and prints a JSON line per case
with the median over repeats. Run it with nothing else on the machine::

    python scripts/bench_decode.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mmtx.data.images import load_image, read_image
from mmtx.data.transforms import build_transforms


def write_images(folder: Path, count: int, size: tuple[int, int], suffix: str) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        # smooth content (a photo-like gradient plus noise) so JPEG sizes are realistic
        h, w = size[1], size[0]
        base = np.linspace(0, 255, w)[None, :, None] * np.linspace(0.3, 1, h)[:, None, None]
        pixels = np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        path = folder / f"{i}{suffix}"
        Image.fromarray(pixels).save(path, quality=90) if suffix == ".jpg" else Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def pillow(size: int) -> Callable[[Path], torch.Tensor]:
    transform = build_transforms(size, train=False)
    return lambda path: transform(load_image(path))


def torchcodec(size: int) -> Callable[[Path], torch.Tensor]:
    transform = build_transforms(size, train=False)  # the same v2 pipeline, on a uint8 tensor
    return lambda path: transform(read_image(path))


def torchvision_io(size: int) -> Callable[[Path], torch.Tensor]:
    import warnings

    from torchvision.io import ImageReadMode, decode_image, read_file

    warnings.filterwarnings("ignore", message=".*image decoding and encoding capabilities of TorchVision")
    transform = build_transforms(size, train=False)
    return lambda path: transform(
        decode_image(read_file(str(path)), mode=ImageReadMode.RGB, apply_exif_orientation=True)
    )


def time_per_image(fn: Callable[[Path], torch.Tensor], paths: list[Path], repeats: int) -> float:
    fn(paths[0])  # warm-up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for path in paths:
            fn(path)
        runs.append((time.perf_counter() - start) / len(paths))
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--count", type=int, default=50, help="images per case")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one loader worker's view
    cases = [
        ("COCO-like 640x480 JPEG -> 224", (640, 480), ".jpg", 224),
        ("shapes-like 64 px PNG -> 64", (64, 64), ".png", 64),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, size, suffix, out in cases:
            folder = Path(tmp) / suffix.strip(".")
            folder.mkdir()
            paths = write_images(folder, args.count, size, suffix)
            ms = {f"{decoder.__name__}_ms": round(time_per_image(decoder(out), paths, args.repeats) * 1e3, 3)
                  for decoder in (pillow, torchcodec, torchvision_io)}  # fmt: skip
            print(
                json.dumps(
                    {"case": name, **ms, "pillow_over_torchcodec": round(ms["pillow_ms"] / ms["torchcodec_ms"], 2)}
                )
            )


if __name__ == "__main__":
    main()
