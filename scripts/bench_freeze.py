"""Step time and memory of a captioner's training step with parts of it frozen (``task.freeze``).
Prints one JSON object with a row per setting::

    python scripts/bench_freeze.py --model caption_small --image-size 64 --batch 32
    python scripts/bench_freeze.py --model caption_base --image-size 224 --batch 8 --steps 5

Each row is one setting of ``task.freeze`` (nothing; the image encoder; the image encoder but its
last two blocks): the median time of a whole optimizer step (forward, backward, AdamW) over
``--steps`` steps after ``--warmup``, the bytes autograd saves for the backward pass (weights
excluded, as ``scripts/bench_memory.py`` counts them), and the bytes of the gradients and of
AdamW's state, which frozen weights do not have.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

SETTINGS = {
    "none": None,
    "encoder": {"modules": ["model.encoder"]},
    "encoder_but_last_2_blocks": {"modules": ["model.encoder"], "train_last_blocks": 2},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench_memory import add_step_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser)
    parser.add_argument(
        "--steps", type=int, default=10, help="timed steps; the median is reported (default: %(default)s)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: %(default)s)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as trainer.precision=bf16-mixed")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def row(args: argparse.Namespace, freeze: dict | None) -> dict[str, Any]:
    import torch
    from bench_memory import build_captioner, saved_tensor_bytes
    from torch import nn

    from mmtx.tasks.freezing import Freeze, apply_freeze, eval_frozen

    torch.manual_seed(args.seed)
    holder = nn.Module()  # names relative to the task, as task.freeze gives them
    holder.model = build_captioner(args.model, args.image_size, args.text_len, args.vocab, []).train()
    frozen, total = apply_freeze(holder, Freeze.from_config(freeze))
    eval_frozen(holder)
    model = holder.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size)
    ids = torch.randint(3, args.vocab, (args.batch, args.text_len))
    ids[:, 0] = 1
    out: dict[str, Any] = {}

    def forward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            out["loss"] = model.loss(images, ids, pad_id=0)

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        forward()
        out["loss"].backward()
        optimizer.step()
        return time.perf_counter() - start

    for _ in range(args.warmup):
        step()
    times = [step() for _ in range(args.steps)]
    optimizer.zero_grad(set_to_none=True)
    saved = saved_tensor_bytes(forward, exclude=list(model.parameters()))
    out["loss"].backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    state = sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    )
    return {
        "freeze": freeze,
        "params": total,
        "frozen_params": frozen,
        "step_s_median": round(statistics.median(times), 4),
        "step_s_range": [round(min(times), 4), round(max(times), 4)],
        "saved_for_backward_bytes": saved,
        "grad_bytes": grads,
        "optimizer_state_bytes": state,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    rows = {name: row(args, freeze) for name, freeze in SETTINGS.items()}
    base = rows["none"]["step_s_median"]
    for r in rows.values():
        r["step_time_ratio"] = round(r["step_s_median"] / base, 3)
    return {
        "model": args.model,
        "image_size": args.image_size,
        "batch": args.batch,
        "text_len": args.text_len,
        "bf16": args.bf16,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rows": rows,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
