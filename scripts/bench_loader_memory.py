"""Memory of the training loader's processes over a whole epoch of a COCO-sized captions file.

Prints ONE JSON line on stdout (progress goes to stderr)::

    python scripts/bench_loader_memory.py                     # 120k images x 5 captions, 2 workers
    python scripts/bench_loader_memory.py --images 20000 --workers 2

A COCO-format captions file of ``--images`` images with five captions each (600k captions by
default) is generated under ``--root``, its images cycling through a few small files so that
the epoch is quick to read: what is measured is the records' memory, not the decoding. The loader
is the one ``mmtx-train`` uses (``CocoCaptions.train_dataloader()``, forked workers). Every
``--every`` batches the main process and its workers are measured from ``/proc/PID/smaps_rollup``:

- ``rss_mb``: the processes' resident memory summed (shared pages counted in each process);
- ``pss_mb``: the same with each shared page divided among the processes that map it: the
  memory the loader really holds;
- ``private_mb``: the pages only one process holds, copies made after the fork included.

``growth`` is each figure's last sample over its first (taken after the first batches, once the
workers run): with records held as millions of Python objects, every page a worker reads is
copied into it (reference counts are written on read), and ``private_mb`` grows over the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch


def log(message: str) -> None:
    print(f"[bench_loader_memory] {message}", file=sys.stderr, flush=True)


def write_coco(root: Path, images: int, files: int = 64, size: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """A COCO captions file of ``images`` images x 5 captions, the images cycling through ``files`` PNGs."""
    from PIL import Image

    folder, annotations = root / "images", root / f"captions-{images}.json"
    if annotations.exists():
        return annotations, folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for k in range(files):
        Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3))).save(folder / f"{k}.png")
    nouns, colours = ["cat", "dog", "bus", "man", "table", "kite", "train", "plate"], ["red", "blue", "green", "white"]
    document = {
        "images": [{"id": i, "file_name": f"{i % files}.png"} for i in range(images)],
        "annotations": [
            {
                "id": 5 * i + k,
                "image_id": i,
                "caption": f"a {rng.choice(colours)} {rng.choice(nouns)} next to a {rng.choice(colours)} {rng.choice(nouns)}",
            }
            for i in range(images)
            for k in range(5)
        ],  # fmt: skip
    }
    annotations.write_text(json.dumps(document))
    return annotations, folder


def memory(pids: list[int]) -> dict[str, float]:
    """Summed rss / pss / private megabytes of ``pids`` (smaps_rollup, Linux)."""
    total = {"rss_mb": 0.0, "pss_mb": 0.0, "private_mb": 0.0}
    for pid in pids:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
        except (FileNotFoundError, ProcessLookupError):
            continue
        kb = {k: int(v.split()[0]) for k, v in fields.items()}
        total["rss_mb"] += kb["Rss"] / 1024
        total["pss_mb"] += kb["Pss"] / 1024
        total["private_mb"] += (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024
    return {k: round(v, 1) for k, v in total.items()}


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def run(args: argparse.Namespace) -> dict:
    from mmtx.data.captions import CocoCaptions
    from mmtx.data.tokenizer import Tokenizer

    annotations, images = write_coco(Path(args.root), args.images)
    files = {"annotations": str(annotations), "images": str(images)}
    tokenizer = Tokenizer.train(["a red cat next to a blue dog"] * 4, vocab_size=200)
    dm = CocoCaptions(train=files, image_size=32, batch_size=args.batch_size, num_workers=args.workers,
                      max_length=16, in_memory=False, tokenizer=tokenizer)  # fmt: skip
    start = time.perf_counter()
    dm.setup("fit")
    log(f"read {args.images} images x 5 captions in {time.perf_counter() - start:.1f} s")
    loader = dm.train_dataloader()
    samples, batches = [], 0
    start = time.perf_counter()
    for _batch in loader:
        batches += 1
        if batches == args.warmup or (batches > args.warmup and batches % args.every == 0):
            samples.append({"batch": batches, **memory([os.getpid(), *children(os.getpid())])})
            log(f"batch {batches}/{len(loader)}: {samples[-1]}")
    seconds = time.perf_counter() - start
    samples.append({"batch": batches, **memory([os.getpid(), *children(os.getpid())])})
    first, last = samples[0], samples[-1]
    return {
        "images": args.images, "captions": 5 * args.images, "workers": args.workers, "batch_size": args.batch_size,
        "batches": batches, "epoch_s": round(seconds, 1), "torch": torch.__version__,
        "first": first, "last": last, "growth": {k: round(last[k] / first[k] - 1, 4) for k in first if k != "batch"},
        "samples": samples,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=120_000, help="images (5 captions each)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--warmup", type=int, default=10, help="batches before the first sample")
    p.add_argument("--every", type=int, default=200, help="batches between samples")
    p.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "mmtx-bench-memory"))
    print(json.dumps(run(p.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
