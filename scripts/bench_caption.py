"""Captioning time of a trained checkpoint as the CLIs and the demo call it (``CaptionTask.caption``).

Prints one line: the median seconds over ``--repeats`` calls (after a warm-up) of greedy
captioning of ``--images`` random images at the checkpoint's size, the spread, tokens per second
and the first caption. Run it under two versions of mmtx (a worktree on PYTHONPATH) to compare::

    python scripts/bench_caption.py RUN/checkpoints/last.ckpt
    PYTHONPATH=/tmp/before python scripts/bench_caption.py RUN/checkpoints/last.ckpt

Measure with nothing else running, alternating the versions, and quote the range over runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mmtx.checkpoint import load_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ckpt", help="a captioner checkpoint (or an mmtx-export directory)")
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    task = load_task(args.ckpt)
    size = (task.data_config or {}).get("image_size") or task.model.encoder.image_size
    torch.manual_seed(0)
    images = torch.randn(args.images, 3, size, size)
    with torch.no_grad():
        task.caption(images)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            captions = task.caption(images)
            times.append(time.perf_counter() - start)
    ids, _ = task.tokenizer.encode_batch(captions, task.model.decoder.max_length)
    tokens = int((ids != task.tokenizer.pad_id).sum()) - len(captions)  # words and [EOS], no [BOS]
    median = statistics.median(times)
    print(
        f"median {median:.3f} s (min {min(times):.3f}, max {max(times):.3f}); ~{tokens / median:.0f} tokens/s; "
        f"{captions[0]!r}"
    )


if __name__ == "__main__":
    main()
