"""Data-loading throughput of mmtx's caption loaders with 0, 1 and 2 worker processes.

Prints ONE JSON line on stdout (progress goes to stderr)::

    python scripts/bench_data.py                      # shapes + a synthetic COCO-like set, folder and shards
    python scripts/bench_data.py --sources coco \\
        --coco-annotations annotations/captions_val2014.json --coco-images val2014

How the figures are measured
----------------------------
* The loader is the one ``mmtx-train`` uses: the data module's ``train_dataloader()`` (seeded
  shuffling, image decoding and the transforms inside the dataset, tokenization and stacking in
  the collator — all of it in the worker processes when ``num_workers > 0``). Its batches hold
  uint8 images: ``mmtx-train`` normalises them on the training device, outside the loader.
* For each worker count, the first batch is timed on its own (``first_batch_s``: worker start-up
  included) and not counted; ``images_per_s`` is the next ``--batches`` batches' images over their
  wall time, read as fast as the loader delivers them (nothing else runs in the main process).
* ``shapes``: the default procedurally drawn data set (PNG, ``--shapes-size`` px), generated under
  ``--root`` on first use and reused afterwards.
* ``coco``: official COCO caption files when ``--coco-annotations``/``--coco-images`` are given;
  otherwise a synthetic stand-in in the same format — smooth random JPEGs of COCO's usual 640x480
  (quality 90, so files and decode times are COCO-like), five captions each — resized to
  ``--coco-size`` px as ``data=coco`` does.
* ``coco_shards``: the same images and captions written by mmtx-shards' writer as WebDataset
  shards, each image re-encoded as a JPEG at ``--shard-image-size`` px (shorter side), read by
  ``data=webdataset`` and resized to ``--coco-size`` px: what converting a folder once buys.
* On a machine with fewer cores than workers + 1 the workers compete with the main process; the
  figures say how fast the loader alone can go, not how much a training step is slowed.
* ``--stages``: per image on one thread (what each loader worker has), the median over three
  passes of the milliseconds of reading + decoding the file (`read_image`) and of the resize to
  the model's size, each distinct image once, and of a whole example (the data set's item, the
  collator's share included, over the first batches); ``bound_vs_coco`` is the
  folder's whole example over this loader's decode + resize alone: the most any cut of the
  Python around them could bring the loader's speed-up over the folder to.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def log(message: str) -> None:
    print(f"[bench_data] {message}", file=sys.stderr, flush=True)


def synthetic_coco(root: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """Write (or reuse) ``count`` COCO-like JPEGs and a captions file under ``root``."""
    import numpy as np
    from PIL import Image

    from mmtx.data.captions import CaptionRecord, write_coco_captions

    images, annotations = root / "images", root / "captions.json"
    if annotations.exists() and len(list(images.glob("*.jpg"))) == count:
        return annotations, images
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = random.Random(seed)
    nouns, colors = ["cat", "dog", "bus", "man", "table", "kite", "train"], ["red", "blue", "green", "white"]
    records = []
    for i in range(count):
        coarse = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)  # low-frequency content
        img = Image.fromarray(coarse).resize((640, 480), Image.BICUBIC)
        pixels = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (480, 640, 3))  # texture
        path = images / f"{i:012d}.jpg"
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        captions = tuple(
            f"a {words.choice(colors)} {words.choice(nouns)} next to a {words.choice(nouns)}" for _ in range(5)
        )
        records.append(CaptionRecord(image_id=i + 1, path=path, captions=captions))
    write_coco_captions(records, annotations, images)
    return annotations, images


def make_datamodule(source: str, args: argparse.Namespace, workers: int, tokenizer: Any = None) -> Any:
    from mmtx.data.captions import CocoCaptions
    from mmtx.data.shards import ShardCaptions
    from mmtx.data.synthetic import ShapesCaptions

    # decoded by the loader every epoch (not held in memory): what this script measures
    common = dict(batch_size=args.batch_size, num_workers=workers, max_length=32, tokenizer=tokenizer, in_memory=False)
    if source == "shapes":
        root = Path(args.root) / f"shapes-{args.shapes_size}px-{args.shapes_count}"
        return ShapesCaptions(
            root=str(root), num_train=args.shapes_count, num_val=0, image_size=args.shapes_size, **common
        )
    if args.coco_annotations and args.coco_images:
        files = {"annotations": args.coco_annotations, "images": args.coco_images}
    else:
        root = Path(args.root) / f"coco-synthetic-{args.coco_count}"
        annotations, images = synthetic_coco(root, args.coco_count)
        files = {"annotations": str(annotations), "images": str(images)}
    folder = CocoCaptions(train=files, image_size=args.coco_size, **common)
    if source == "coco":
        return folder
    shards = Path(args.root) / f"coco-shards-{args.coco_count}-{args.shard_image_size}px"
    if not (shards / "done").exists():
        from mmtx.data.shards.write import caption_samples, write_shards

        written = write_shards(
            caption_samples(folder.records("train")), shards, "train", image_size=args.shard_image_size
        )
        (shards / "done").write_text(" ".join(written["shards"]))
    names = (shards / "done").read_text().split()
    return ShardCaptions(train={"shards": [str(shards / n) for n in names]}, image_size=args.coco_size, **common)


def measure(source: str, args: argparse.Namespace, tokenizer: Any, workers: int) -> dict[str, float]:
    dm = make_datamodule(source, args, workers, tokenizer)
    dm.prepare_data()
    loader = dm.train_dataloader()
    batches = iter(loader)
    start = time.perf_counter()
    next(batches)
    first = time.perf_counter() - start
    images = 0
    start = time.perf_counter()
    for _ in range(args.batches):
        try:
            batch = next(batches)
        except StopIteration:
            break
        images += batch["images"].shape[0]
    seconds = time.perf_counter() - start
    del batches, loader  # stops the worker processes
    gc.collect()
    if images < args.batches * args.batch_size:
        log(f"{source}: only {images} images after the first batch; use more images or fewer --batches")
    return {"images_per_s": round(images / seconds, 1), "first_batch_s": round(first, 2), "images": images}


def stages(source: str, args: argparse.Namespace, tokenizer: Any) -> dict[str, float]:
    """Median ms per image of decoding, resizing and a whole example, on one thread."""
    import statistics

    from mmtx.data.images import read_image

    dm = make_datamodule(source, args, 0, tokenizer)
    dm.prepare_data()
    loader = dm.train_dataloader()
    seeded, collate = loader.dataset, loader.collate_fn  # the loader's items are (index, seed) pairs
    examples = seeded.dataset  # one example per (image, caption) pair: each image several times over
    batches = max(1, min(len(examples), args.batches * args.batch_size) // args.batch_size)
    paths = list(dict.fromkeys(examples.image_path(i) for i in range(len(examples))))  # each image once
    paths = paths[: batches * args.batch_size]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def per_image() -> tuple[float, float]:
        """One pass over ``paths``: seconds decoding, seconds resizing (no decoded image is kept)."""
        decode = resize = 0.0
        for path in paths:
            start = time.perf_counter()
            pixels = read_image(path)
            decoded = time.perf_counter()
            examples.transform(pixels)
            decode, resize = decode + decoded - start, resize + time.perf_counter() - decoded
        return decode, resize

    def whole() -> float:
        start = time.perf_counter()
        for b in range(batches):
            collate([seeded[(b * args.batch_size + j, 0)] for j in range(args.batch_size)])
        return time.perf_counter() - start

    def ms(seconds: list[float], items: int) -> float:
        return round(statistics.median(seconds) / items * 1e3, 3)

    try:
        passes = [per_image() for _ in range(3)]
        return {
            "images": len(paths),
            "decode_ms": ms([d for d, _ in passes], len(paths)),
            "resize_ms": ms([r for _, r in passes], len(paths)),
            "example_ms": ms([whole() for _ in range(3)], batches * args.batch_size),
        }
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mmtx.data.tokenizer import Tokenizer

    result: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "batches": args.batches,
    }
    for source in args.sources:
        log(f"{source}: preparing")
        dm = make_datamodule(source, args, 0)
        dm.prepare_data()
        tokenizer = Tokenizer.train(dm.texts("train"), vocab_size=1000)
        entry: dict[str, Any] = {
            "image_size": args.shapes_size if source == "shapes" else args.coco_size,
            "files": "official" if source != "shapes" and args.coco_annotations else "generated",
        }
        if args.stages:
            log(f"{source}: stages, one thread")
            entry["stages"] = stages(source, args, tokenizer)
        for workers in args.workers:
            log(f"{source}: {workers} worker(s)")
            entry[f"workers_{workers}"] = measure(source, args, tokenizer, workers)
        result[source] = entry
    folder, shards = (result.get(source, {}).get("stages") for source in ("coco", "coco_shards"))
    if folder and shards:
        shards["bound_vs_coco"] = round(folder["example_ms"] / (shards["decode_ms"] + shards["resize_ms"]), 2)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Images/s of mmtx's training data loaders (decode, transforms, tokenize, collate) "
        "for several worker counts; prints one JSON line.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--sources",
        type=lambda s: s.split(","),
        default=["shapes", "coco", "coco_shards"],
        help="comma-separated: shapes, coco, coco_shards",
    )
    p.add_argument(
        "--workers",
        type=lambda s: [int(w) for w in s.split(",")],
        default=[0, 1, 2],
        help="comma-separated worker counts",
    )
    p.add_argument(
        "--stages", action="store_true", help="also time decoding, resizing and a whole example per image on one thread"
    )
    p.add_argument("--batch-size", type=int, default=32, help="images per batch")
    p.add_argument("--batches", type=int, default=20, help="timed batches per worker count (after the first)")
    p.add_argument(
        "--root",
        default=str(Path(tempfile.gettempdir()) / "mmtx-bench-data"),
        help="where generated data sets are written (and reused)",
    )
    p.add_argument("--shapes-size", type=int, default=64, help="shapes image side (data=shapes default)")
    p.add_argument("--shapes-count", type=int, default=1024, help="shapes training images to generate")
    p.add_argument("--coco-size", type=int, default=224, help="side the COCO images are resized to")
    p.add_argument("--coco-count", type=int, default=768, help="synthetic COCO-like images to generate")
    p.add_argument(
        "--shard-image-size", type=int, default=256, help="coco_shards: the shards' image size (shorter side)"
    )
    p.add_argument("--coco-annotations", default=None, help="an official captions_*.json (else synthetic)")
    p.add_argument("--coco-images", default=None, help="the folder of those annotations' images")
    args = p.parse_args(argv)
    unknown = set(args.sources) - {"shapes", "coco", "coco_shards"}
    if unknown:
        p.error(f"unknown source(s): {', '.join(sorted(unknown))}")
    if bool(args.coco_annotations) != bool(args.coco_images):
        p.error("give both --coco-annotations and --coco-images, or neither")
    if min(args.workers) < 0 or args.batch_size < 1 or args.batches < 1:
        p.error("--workers must be >= 0, --batch-size and --batches >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(run(parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
