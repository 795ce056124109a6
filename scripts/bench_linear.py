"""Few-row linear layers: ``F.linear`` (x @ W.T) against ``mmtx.few_row_products`` on the CPU.

A decoding step multiplies every weight by one row per sequence. This script times

* the products of one decoder step at the comparison size (width 384: QKV, the attention
  projections, the MLP and an 8192-word head) for several row counts, fp32 and bf16, with weights
  cycled through a set larger than the caches (as in a real step, where each layer's weights come
  from memory): ``{dtype}_rows_{n}``;
* whole fp32 decoding loops of the comparison captioner (6 layers; 32 tokens; the images encoded
  beforehand) with generation's few-row layout on and off (``GenerationConfig.few_row_products``):
  ``decode_{images}x{beams}``.

Each pair is timed in turns (ABBA) in one process, so drift in the machine's load hits both
alike; figures are medians. Prints one JSON line.

    python scripts/bench_linear.py [--dim 384 --vocab 8192 --rows 1,4,16,64,128,256,512]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from bench_models import BOS_ID, EOS_ID, PAD_ID, BenchConfig, build_mmtx  # beside this file

from mmtx.few_row_products import linear_few_rows, pays


def paired_median_us(a, b, repeats: int) -> tuple[float, float]:
    """Median microseconds of ``a()`` and ``b()``, called in turns (ABBA) so that drift in the
    machine's load hits both alike."""
    for _ in range(3):
        a(), b()
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(repeats):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            fn = a if which == 0 else b
            start = time.perf_counter()
            fn()
            times[which].append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


def step_shapes(dim: int, vocab: int) -> list[tuple[int, int]]:
    """(in, out) of a decoder block's products and the LM head."""
    return [(dim, 3 * dim), (dim, dim), (dim, 4 * dim), (4 * dim, dim), (dim, vocab)]


def measure(dim: int, vocab: int, rows: int, dtype: torch.dtype, copies: int, repeats: int) -> dict[str, float]:
    plain = ours = 0.0
    for fan_in, fan_out in step_shapes(dim, vocab):
        layers = [torch.nn.Linear(fan_in, fan_out).to(dtype) for _ in range(copies)]
        x = torch.randn(rows, fan_in, dtype=dtype)
        turn = itertools.count()

        def run_plain() -> None:
            layer = layers[next(turn) % copies]
            F.linear(x, layer.weight, layer.bias)

        def run_ours() -> None:  # what generation's mode does: the few-row layout where it pays
            layer = layers[next(turn) % copies]
            (linear_few_rows if pays(x, layer.weight) else F.linear)(x, layer.weight, layer.bias)

        a, b = paired_median_us(run_plain, run_ours, repeats)
        plain, ours = plain + a, ours + b
    return {"f_linear_us": round(plain), "mmtx_linear_us": round(ours), "speedup": round(plain / ours, 2)}


def measure_decoding(
    model: torch.nn.Module, cfg: BenchConfig, images: int, beams: int, repeats: int
) -> dict[str, float]:
    """Decoding loop (ms) of ``model`` (the comparison captioner) with the few-row layout off and on."""
    from mmtx.generation import GenerationConfig, generate

    context = model.encode(torch.randn(images, 3, cfg.image, cfg.image))
    tokens: dict[bool, torch.Tensor] = {}

    def decode(few_rows: bool) -> None:
        config = GenerationConfig(max_new_tokens=cfg.new_tokens, min_new_tokens=cfg.new_tokens, num_beams=beams,
                                  few_row_products=few_rows)  # fmt: skip
        tokens[few_rows] = generate(model.decoder, context, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID, config=config)

    plain, ours = paired_median_us(lambda: decode(False), lambda: decode(True), repeats)
    if not torch.equal(tokens[False], tokens[True]):
        raise RuntimeError(f"{images}x{beams}: the two layouts decoded different tokens")
    return {
        "f_linear_ms": round(plain / 1e3, 1),
        "mmtx_linear_ms": round(ours / 1e3, 1),
        "speedup": round(plain / ours, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--dim", type=int, default=384, help="model width")
    p.add_argument("--vocab", type=int, default=8192, help="LM head size")
    p.add_argument("--rows", default="1,4,16,64,128,256,512", help="comma-separated row counts")
    p.add_argument("--copies", type=int, default=32, help="weights cycled per shape (more than the caches hold)")
    p.add_argument("--repeats", type=int, default=100, help="timed calls per product figure (the median is reported)")
    p.add_argument("--decode-repeats", type=int, default=8, help="timed decoding loops per figure (0: skip them)")
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    out: dict[str, object] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "dim": args.dim}
    with torch.no_grad():
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for r in rows:
                print(f"[bench_linear] {name}, {r} rows", file=sys.stderr, flush=True)
                out[f"{name}_rows_{r}"] = measure(args.dim, args.vocab, r, dtype, args.copies, args.repeats)
        if args.decode_repeats:
            torch.manual_seed(0)
            cfg = BenchConfig()
            model = build_mmtx(cfg).eval()  # built once for every decoding figure
            for images, beams in ((1, 1), (1, 3), (16, 1), (16, 4)):
                print(f"[bench_linear] decoding {images} images x {beams} beams", file=sys.stderr, flush=True)
                out[f"decode_{images}x{beams}"] = measure_decoding(model, cfg, images, beams, args.decode_repeats)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
