"""Memory of one training step (forward + backward) of a captioner, with and without activation
checkpointing (``activation_checkpointing=true`` in mmtx-train). Prints one JSON object::

    python scripts/bench_memory.py --model caption_base --image-size 224 --batch 8
    python scripts/bench_memory.py --model caption_small --batch 256 --set model.decoder.depth=2
    python scripts/bench_memory.py --model caption_base --device cuda --bf16 --batch 64

What is measured:

- on CUDA, ``torch.cuda.max_memory_allocated`` over the step (the allocator's peak: weights,
  gradients, activations and temporaries);
- on the CPU, which keeps no such count, the bytes of the tensors saved for the backward pass
  (each storage once, the weights not counted: the activation memory checkpointing trades away)
  plus the bytes of the parameters and of their gradients. The transient memory of the backward
  pass (one block's recomputed activations, gradient buffers) is not included.

The optimizer's state is not part of the step measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """The captioner and the batch of the step measured (shared with ``bench_freeze.py``)."""
    parser.add_argument(
        "--model", default="caption_small", help="a captioner config of conf/model (default: %(default)s)"
    )
    parser.add_argument("--image-size", type=int, default=64, help="image side in pixels (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="images (and captions) per step (default: %(default)s)")
    parser.add_argument(
        "--text-len", type=int, default=24, help="caption tokens, [BOS] and [EOS] included (default: %(default)s)"
    )
    parser.add_argument("--vocab", type=int, default=1000, help="vocabulary size (default: %(default)s)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as trainer.precision=bf16-mixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        dest="overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more mmtx-train overrides of the model, e.g. model.encoder.depth=4",
    )
    return parser.parse_args(argv)


def build_captioner(name: str, image_size: int, text_len: int, vocab: int, overrides: list[str]) -> Any:
    """The captioner of ``conf/model/<name>.yaml`` as mmtx-train builds it, with random weights."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf, open_dict

    from mmtx.cli.common import CONFIG_DIR
    from mmtx.models import ImageCaptioner

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[
                f"model={name}",
                f"data.image_size={image_size}",
                f"data.max_length={text_len}",
                *overrides,
            ],
        )
    model_cfg = cfg.model
    if model_cfg.get("_target_") != "mmtx.models.captioner.ImageCaptioner":
        raise SystemExit(f"--model={name}: not a captioner (model._target_={model_cfg.get('_target_')})")
    with open_dict(model_cfg):
        model_cfg.decoder.vocab_size = vocab
    model = instantiate(OmegaConf.to_container(model_cfg, resolve=True))
    assert isinstance(model, ImageCaptioner)
    return model


def saved_tensor_bytes(step: Any, exclude: Any = ()) -> int:
    """Run ``step()`` and return the bytes of the tensors autograd saves for the backward pass
    while it runs: each storage counted once, those of ``exclude`` (the weights) not at all.
    Saves a checkpointed region makes are dropped by ``torch.utils.checkpoint`` and not seen;
    the inputs it keeps to recompute from are."""
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values())


def measure(model: Any, images: Any, ids: Any, device: str, bf16: bool) -> dict[str, int]:
    """One forward + backward of ``model``'s captioning loss on (``images``, ``ids``); bytes."""
    import torch

    params = list(model.parameters())
    for p in params:
        p.grad = None
    out: dict[str, Any] = {}

    def forward() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            out["loss"] = model.loss(images, ids, pad_id=0)

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        forward()
        out["loss"].backward()
        torch.cuda.synchronize()
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(), "allocated_before_bytes": start}
    saved = saved_tensor_bytes(forward, exclude=params)
    out["loss"].backward()
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    return {
        "saved_for_backward_bytes": saved,
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "total_bytes": saved + param_bytes + grad_bytes,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    from mmtx.activation_checkpointing import checkpoint_blocks

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible")
    torch.manual_seed(args.seed)
    model = (
        build_captioner(args.model, args.image_size, args.text_len, args.vocab, args.overrides).to(args.device).train()
    )
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=args.device)
    ids = torch.randint(3, args.vocab, (args.batch, args.text_len), device=args.device)
    ids[:, 0] = 1
    if args.device == "cuda":  # kernels and workspaces set up before the peaks are taken
        measure(model, images, ids, args.device, args.bf16)
    plain = measure(model, images, ids, args.device, args.bf16)
    blocks = checkpoint_blocks(model)
    checkpointed = measure(model, images, ids, args.device, args.bf16)
    key = "peak_allocated_bytes" if args.device == "cuda" else "total_bytes"
    result = {
        "model": args.model,
        "overrides": args.overrides,
        "image_size": args.image_size,
        "batch": args.batch,
        "text_len": args.text_len,
        "vocab": args.vocab,
        "device": args.device,
        "bf16": args.bf16,
        "params": sum(p.numel() for p in model.parameters()),
        "checkpointed_blocks": blocks,
        "measures": (
            "torch.cuda.max_memory_allocated over the step"
            if args.device == "cuda"
            else "bytes saved for backward (weights excluded) + parameter bytes + gradient bytes"
        ),
        "torch": torch.__version__,
        "plain": plain,
        "checkpointed": checkpointed,
        "ratio": round(checkpointed[key] / plain[key], 4),
    }
    if args.device == "cpu":
        result["saved_ratio"] = round(checkpointed["saved_for_backward_bytes"] / plain["saved_for_backward_bytes"], 4)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
