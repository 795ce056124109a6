"""Benchmark mmtx's image captioner, side by side with Hugging Face's VisionEncoderDecoderModel.

Prints ONE JSON line on stdout (progress goes to stderr). At the default (comparison) size::

    python scripts/bench.py            # add --loss-curve 50 for the bf16-vs-fp32 loss check

How the figures are measured
----------------------------
* Each model lives in its own worker process (spawned, so nothing is shared: its own threads,
  allocator and peak RSS). The parent sends "run one training step" / "generate once" to the
  workers in turn, alternating which goes first (ABBA), so slow drift in machine load — other
  jobs on a shared CPU — hits both models alike. Only one worker computes at a time.
* ``train_step_ms``: one training step on a fixed random batch — forward, next-token cross-entropy
  (computed identically for both models, from the logits), backward and a fused AdamW step (Hugging
  Face Trainer's default optimiser, used for both) — wall clock, the device synchronised at both
  ends. ``--warmup`` steps are discarded; the figure is the median of ``--steps``. ``_bf16`` runs
  the forward under ``torch.autocast(bfloat16)`` (fp32 master weights, as in mixed precision).
  ``train_images_per_s`` = ``batch`` / that time.
* ``*_tokens_per_s``: ``gen_batch * new_tokens`` / wall time of one call that encodes the images
  and decodes; ``min_new_tokens = max_new_tokens`` so every sequence generates exactly
  ``--new-tokens`` tokens (checked on every call). Greedy and beam search (``--beams``), no sampling,
  KV cache on, fp32 and under bf16 autocast. Median of ``--steps`` after ``--warmup`` calls.
* ``encode_ms``: encoding the generation batch's images alone (median, as above), the part of
  generation both models spend on the same ViT; ``greedy_step_ms``/``beam_step_ms`` = (generation
  time - ``encode_ms``) / ``new_tokens``: what one decoding step costs.
* ``memory_bandwidth_gbs``: the best copy of a 256 MiB buffer (bytes read + written per second).
  ``greedy_step_floor_ms``/``beam_step_floor_ms``: the least an fp32 decoding step can take on this
  machine, the larger of its memory traffic (decoder weights, the images' cross-attention K/V, the
  self-attention cache) at that bandwidth and its FLOPs at the matmul peak;
  ``*_step_floor_fraction`` = floor / measured step (1 would be at the hardware's limit).
* ``train_gflops``: model FLOPs of one training step counted analytically from the shapes (every
  matmul: patch embedding, attention projections, attention scores and values over the full
  square — causal masking not subtracted —, MLPs, LM head; backward = 2x forward, so x3), and
  cross-checked by ``torch.utils.flop_counter.FlopCounterMode`` on a real forward+backward
  (``train_gflops_counted``; it skips the patch embedding's unneeded input gradient and counts
  flash attention's backward as five products, since the kernel recomputes the scores).
* ``matmul_peak_gflops_fp32/_bf16``: the best of a few large square matmuls on this machine, the
  practical ceiling; ``mfu_fp32/_bf16`` = ``train_gflops / train_step_s / peak`` (``ref_mfu_*``
  from the reference's counted FLOPs). ``torch_threads`` is left at PyTorch's default. On CUDA the bf16
  MFU is also given against the datasheet peak (``--peak-tflops``, or looked up for H100/H200).
* ``*_host_syncs`` (CUDA): how often one generation call (greedy, beam; in the last of
  ``--precisions``) makes the host wait for the GPU, counted by
  ``torch.cuda.set_sync_debug_mode("warn")`` (tensor operations only: a lower bound); a loop that
  checked on the device every step would count at least ``--new-tokens``.
* ``peak_rss_mb``: the worker process's peak resident memory (``ru_maxrss``) after all timed
  runs; on CUDA also ``peak_gpu_mem_mb``.
* ``--profile N``: N more mmtx training steps (in the last of ``--precisions``) under
  ``torch.profiler``; ``profile_ms_by_kind`` splits one step's device time (kernels on CUDA, the
  operators' own time on a CPU) into matmul, attention, optimizer (AdamW, and any other
  ``multi_tensor``/``_foreach`` kernel) and other (elementwise, norms, softmax, copies, fused
  compiled kernels) by the kernels' names; ``profile_busy`` is that time over the step's wall clock
  (on CUDA, below 1: the GPU waited for the host; on a CPU, the rest is Python and dispatch
  outside the operators); ``profile_top`` lists the costliest kernels, ms per step. Where the
  step's time goes when MFU is low.
* ``ref_*``: the same for the reference; ``speedup_*`` = reference time / mmtx time (> 1 means
  mmtx is faster); ``speedup_train_bf16_vs_ref_fp32`` compares mmtx in bf16 with the reference in
  fp32.
* ``--loss-curve N`` trains fresh mmtx models N steps on fixed random data in fp32 and in bf16
  from the same initialisation, and once more in fp32 from another seed: the gap between the two
  fp32 runs is the noise level the bf16 gap is judged against.

The reference is Hugging Face ``VisionEncoderDecoderModel`` with a ``ViTConfig`` encoder and a
``BertConfig(is_decoder=True, add_cross_attention=True)`` decoder of the same width, depth, heads,
MLP width, vocabulary and position table, with its default attention implementation (SDPA) and its
dropout set to 0 (mmtx's bench model has none: both then compute the same function). mmtx's
model is a pre-norm ViT + cross-attending decoder with tied input/output embeddings (BERT ties them
too) and learned positions; their parameter counts are reported side by side (``params_ratio``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

import torch

# beside this file (python scripts/bench.py puts its folder first on sys.path)
from bench_hardware import (
    counted_flops,
    datasheet_peak_tflops,
    kernel_kind,
    matmul_peak_gflops,
    memory_bandwidth_gbs,
    peak_rss_mb,
    synchronize,
    timed,
)
from bench_models import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Adapter,
    BenchConfig,
    MmtxAdapter,
    ReferenceAdapter,
    analytic_train_flops,
    build_mmtx,
    caption_loss,
    decode_step_floor_ms,
)


def make_optimizer(model: torch.nn.Module, lr: float = 1e-4) -> torch.optim.Optimizer:
    """AdamW with PyTorch's fused kernel (CPU and CUDA), for both models: Hugging Face's Trainer
    defaults to it (``optim="adamw_torch_fused"``), and it is 3-4x faster than the per-tensor
    ``foreach`` implementation on a CPU."""
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)


class ModelBench:
    """A model with its optimiser and fixed random inputs; each method is one measurement."""

    def __init__(self, adapter: Adapter, cfg: BenchConfig) -> None:
        self.cfg, self.adapter = cfg, adapter
        self.model = adapter.model.to(cfg.device)
        self.optimizer = make_optimizer(self.model)
        g = torch.Generator().manual_seed(cfg.seed)
        self.images = torch.randn(cfg.batch, 3, cfg.image, cfg.image, generator=g).to(cfg.device)
        ids = torch.randint(EOS_ID + 1, cfg.vocab, (cfg.batch, cfg.text_len), generator=g)
        ids[:, 0] = BOS_ID
        self.ids = ids.to(cfg.device)
        self.gen_images = torch.randn(cfg.gen_batch, 3, cfg.image, cfg.image, generator=g).to(cfg.device)

    def _autocast(self, precision: str) -> torch.autocast:
        return torch.autocast(self.cfg.device, dtype=torch.bfloat16, enabled=precision == "bf16")

    def _train_step(self, precision: str = "fp32") -> None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast(precision):
            loss = self.adapter.loss(self.images, self.ids)
        loss.backward()
        self.optimizer.step()

    def describe(self) -> dict[str, Any]:
        """Parameter count, threads, and the FLOPs counted on one real fp32 training step."""

        def forward_backward() -> None:
            self.model.train()
            self.adapter.loss(self.images, self.ids, eager=True).backward()
            self.model.zero_grad(set_to_none=True)

        return {
            "params": sum(p.numel() for p in self.model.parameters()),
            "threads": torch.get_num_threads(),
            "train_flops_counted": counted_flops(forward_backward),
        }

    def train_step(self, precision: str) -> float:
        return timed(lambda: self._train_step(precision), self.cfg.device)

    def train_step_peak_mb(self, precision: str) -> float:
        """The device memory one training step peaks at (weights, gradients, the optimizer's
        state, activations), from a step taken after the timed ones."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._train_step(precision)
        torch.cuda.synchronize()
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)

    def profile(self, steps: int, precision: str, top: int = 15) -> dict[str, Any]:
        """Device time of ``steps`` training steps by kind of kernel (see the module docstring)."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        cuda = self.cfg.device == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._train_step(precision)  # warm, outside the trace
        synchronize(self.cfg.device)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                self._train_step(precision)
            synchronize(self.cfg.device)
            wall_ms = (time.perf_counter() - start) * 1e3 / steps
        # CUDA: each kernel's duration; CPU: each operator's own time (nested calls not counted twice)
        own: dict[str, float] = {}
        if cuda:
            for e in prof.events():  # kernels and copies; not the record_function ranges mirrored there
                if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
                    own[e.name] = own.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / steps
        else:
            own = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
        own = {name: ms for name, ms in own.items() if ms > 0}
        by_kind: dict[str, float] = defaultdict(float)
        for name, ms in own.items():
            by_kind[kernel_kind(name)] += ms
        total = sum(by_kind.values())
        ranked = sorted(own.items(), key=lambda kv: -kv[1])[:top]
        return {
            "profile_step_ms": round(wall_ms, 2),
            "profile_busy": round(total / wall_ms, 3),
            "profile_ms_by_kind": {k: round(v, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "profile_top": [[name[:120], round(ms, 3)] for name, ms in ranked],
        }

    @torch.no_grad()
    def generate(self, beams: int, precision: str) -> float:
        self.model.eval()
        out: list[torch.Tensor] = []

        def run() -> None:
            with self._autocast(precision):
                out.append(self.adapter.generate(self.gen_images, self.cfg.new_tokens, beams))

        seconds = timed(run, self.cfg.device)
        tokens = out[0]
        expected = (self.cfg.gen_batch, self.cfg.new_tokens)
        if tuple(tokens.shape) != expected or bool(((tokens == PAD_ID) | (tokens == EOS_ID)).any()):
            raise RuntimeError(
                f"{self.adapter.name}: generated {tuple(tokens.shape)} with EOS/padding, wanted {expected} real tokens"
            )
        return seconds

    @torch.no_grad()
    def host_syncs(self, beams: int, precision: str) -> int:
        """How many times one generation call makes the host wait for the GPU (CUDA only):
        PyTorch's sync debug mode warns at every synchronising tensor operation (an explicit
        event or stream synchronisation is not counted: a lower bound)."""
        import warnings

        self.model.eval()
        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught, self._autocast(precision):
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                self.adapter.generate(self.gen_images, self.cfg.new_tokens, beams)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        return sum("synchronizing" in str(w.message) for w in caught)

    @torch.no_grad()
    def encode(self, precision: str) -> float:
        """Seconds to encode the generation batch's images (the part of generation both models
        spend identically, whatever their decoding loops do)."""
        self.model.eval()

        def run() -> None:
            with self._autocast(precision):
                self.adapter.encode(self.gen_images)

        return timed(run, self.cfg.device)

    def memory(self) -> dict[str, float]:
        mem = {"peak_rss_mb": round(peak_rss_mb(), 1)}
        if self.cfg.device == "cuda":
            mem["peak_gpu_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        return mem

    def loss_curve(self, steps: int, lr: float = 5e-4) -> dict[str, list[float]]:
        """Train fresh models ``steps`` steps on 4 fixed random batches: fp32 and bf16 from seed 0,
        fp32 from seed 1 (the noise level). Returns the three loss curves."""
        g = torch.Generator().manual_seed(1234)
        data = []
        for _ in range(4):
            ids = torch.randint(EOS_ID + 1, self.cfg.vocab, (self.cfg.batch, self.cfg.text_len), generator=g)
            ids[:, 0] = BOS_ID
            images = torch.randn(self.cfg.batch, 3, self.cfg.image, self.cfg.image, generator=g)
            data.append((images.to(self.cfg.device), ids.to(self.cfg.device)))
        curves = {}
        for name, seed, precision in (("fp32", 0, "fp32"), ("bf16", 0, "bf16"), ("fp32_seed1", 1, "fp32")):
            torch.manual_seed(seed)
            model = build_mmtx(self.cfg).to(self.cfg.device).train()
            optimizer = make_optimizer(model, lr)
            losses = []
            for step in range(steps):
                images, ids = data[step % len(data)]
                optimizer.zero_grad(set_to_none=True)
                with self._autocast(precision):
                    loss = caption_loss(model(images, ids[:, :-1]), ids[:, 1:])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            curves[name] = losses
        return curves


ADAPTERS: dict[str, type[Adapter]] = {"mmtx": MmtxAdapter, "ref": ReferenceAdapter}


def _serve(kind: str, cfg: BenchConfig, conn: Connection) -> None:
    """Worker process: build one model, then answer ``(method, kwargs)`` requests until ``None``."""
    try:
        torch.manual_seed(cfg.seed)
        bench = ModelBench(ADAPTERS[kind](cfg), cfg)
        conn.send(("ok", None))
        while (request := conn.recv()) is not None:
            method, kwargs = request
            conn.send(("ok", getattr(bench, method)(**kwargs)))
    except BaseException:  # report anything, including KeyboardInterrupt, to the parent
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class Worker:
    """Parent-side handle of a worker process."""

    def __init__(self, kind: str, cfg: BenchConfig) -> None:
        self.kind = kind
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(kind, cfg, child), name=f"bench-{kind}", daemon=True)
        self.process.start()
        child.close()
        self._answer()  # built

    def _answer(self) -> Any:
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"{self.kind} worker failed:\n{value}")
        return value

    def call(self, method: str, **kwargs: Any) -> Any:
        self.conn.send((method, kwargs))
        return self._answer()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=30)


def interleaved(workers: list[Worker], cfg: BenchConfig, method: str, **kwargs: Any) -> dict[str, float]:
    """Median seconds of ``method`` per worker over ``cfg.steps`` runs after ``cfg.warmup``,
    the workers taking turns in ABBA order."""
    times: dict[str, list[float]] = {w.kind: [] for w in workers}
    for i in range(cfg.warmup + cfg.steps):
        for w in workers if i % 2 == 0 else workers[::-1]:
            seconds = w.call(method, **kwargs)
            if i >= cfg.warmup:
                times[w.kind].append(seconds)
    return {kind: statistics.median(ts) for kind, ts in times.items()}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
SUFFIXES = {"fp32": "", "bf16": "_bf16"}  # precision -> suffix of its JSON fields


def precisions(cfg: BenchConfig) -> list[tuple[str, str]]:
    """(precision, suffix) of every precision measured."""
    return [(p, SUFFIXES[p]) for p in cfg.precisions]


def prefix(kind: str) -> str:
    """JSON field prefix of a worker's figures: none for mmtx, ``ref_`` for the reference."""
    return "" if kind == "mmtx" else "ref_"


def measure_speed(workers: list[Worker], cfg: BenchConfig) -> dict[str, float]:
    """Training step (ms) and generation (tokens/s) of every worker, in fp32 and in bf16."""
    out: dict[str, float] = {}
    tokens = cfg.gen_batch * cfg.new_tokens
    for precision, suffix in precisions(cfg):
        log(f"training step, {precision}")
        for kind, seconds in interleaved(workers, cfg, "train_step", precision=precision).items():
            out[f"{prefix(kind)}train_step_ms{suffix}"] = round(seconds * 1e3, 1)
            out[f"{prefix(kind)}train_images_per_s{suffix}"] = round(cfg.batch / seconds, 1)
        if cfg.device == "cuda":
            for w in workers:
                out[f"{prefix(w.kind)}train_step_peak_gpu_mem_mb{suffix}"] = w.call(
                    "train_step_peak_mb", precision=precision
                )
        log(f"image encoding, {precision}")
        encode = interleaved(workers, cfg, "encode", precision=precision)
        for kind, seconds in encode.items():
            out[f"{prefix(kind)}encode_ms{suffix}"] = round(seconds * 1e3, 1)
        for mode, beams in (("greedy", 1), ("beam", cfg.beams)):
            log(f"{mode} generation, {precision}")
            per_kind = interleaved(workers, cfg, "generate", beams=beams, precision=precision)
            for kind, seconds in per_kind.items():
                out[f"{prefix(kind)}{mode}_tokens_per_s{suffix}"] = round(tokens / seconds, 1)
                # what decoding adds to encoding, per generated position
                step = (seconds - encode[kind]) / cfg.new_tokens
                out[f"{prefix(kind)}{mode}_step_ms{suffix}"] = round(step * 1e3, 2)
    return out


def speedups(r: dict[str, Any], cfg: BenchConfig) -> dict[str, float]:
    """Reference time / mmtx time for every figure (> 1: mmtx is faster)."""
    out = {f"speedup_train_{p}": r[f"ref_train_step_ms{s}"] / r[f"train_step_ms{s}"] for p, s in precisions(cfg)}
    if set(cfg.precisions) == {"fp32", "bf16"}:
        out["speedup_train_bf16_vs_ref_fp32"] = r["ref_train_step_ms"] / r["train_step_ms_bf16"]
    for mode in ("greedy", "beam"):
        for precision, suffix in precisions(cfg):
            field = f"{mode}_tokens_per_s{suffix}"
            out[f"speedup_{mode}_{precision}"] = r[field] / r[f"ref_{field}"]
    return {k: round(v, 2) for k, v in out.items()}


def utilisation(
    r: dict[str, Any], flops: dict[str, float], cfg: BenchConfig, peak_tflops: float | None
) -> dict[str, Any]:
    """Measured matmul peaks and the fraction of them a training step reaches (MFU); the memory
    bandwidth and how close a decoding step comes to its floor (fp32)."""
    device = cfg.device
    log("matmul peak")
    out: dict[str, Any] = {}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for precision, suffix in precisions(cfg):
        peak = matmul_peak_gflops(dtypes[precision], device)
        achieved = flops["mmtx"] / (r[f"train_step_ms{suffix}"] / 1e3) / 1e9
        out[f"matmul_peak_gflops_{precision}"] = round(peak, 1)
        out[f"train_gflops_per_s_{precision}"] = round(achieved, 1)
        out[f"mfu_{precision}"] = round(achieved / peak, 3)
        if "ref" in flops:
            ref_achieved = flops["ref"] / (r[f"ref_train_step_ms{suffix}"] / 1e3) / 1e9
            out[f"ref_mfu_{precision}"] = round(ref_achieved / peak, 3)
    # decoding is bound by memory traffic (greedy) or matmul throughput (beams): its floors
    log("memory bandwidth")
    bandwidth = memory_bandwidth_gbs(device)
    out["memory_bandwidth_gbs"] = round(bandwidth, 1)
    fp32_floors = (("greedy", cfg.gen_batch), ("beam", cfg.gen_batch * cfg.beams)) if "fp32" in cfg.precisions else ()
    for mode, rows in fp32_floors:
        floor = decode_step_floor_ms(cfg, rows, bandwidth, out["matmul_peak_gflops_fp32"])
        out[f"{mode}_step_floor_ms"] = round(floor, 2)
        step = r[f"{mode}_step_ms"]  # a difference of two medians: noise can make a tiny model's <= 0
        out[f"{mode}_step_floor_fraction"] = round(floor / step, 3) if step > 0 else None
    datasheet = peak_tflops or datasheet_peak_tflops(device)
    if datasheet and "bf16" in cfg.precisions:
        out["peak_tflops_datasheet_bf16"] = datasheet
        out["mfu_bf16_datasheet"] = round(out["train_gflops_per_s_bf16"] / (datasheet * 1e3), 3)
    return out


def run(
    cfg: BenchConfig, reference: bool, loss_curve: int, peak_tflops: float | None, profile: int = 0
) -> dict[str, Any]:
    """Every measurement, as the flat dict that is printed."""
    result: dict[str, Any] = {
        **{k: v for k, v in asdict(cfg).items() if k != "seed"},
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "optimizer": "AdamW(fused=True)",
    }
    if cfg.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()

    log("starting workers" + (" (mmtx, reference)" if reference else " (mmtx)"))
    workers = [Worker("mmtx", cfg)] + ([Worker("ref", cfg)] if reference else [])
    try:
        info = {w.kind: w.call("describe") for w in workers}
        parts = analytic_train_flops(cfg)
        flops = {"mmtx": sum(parts.values())}  # analytic for mmtx; counted for the reference
        result |= {
            "torch_threads": info["mmtx"]["threads"],
            "params": info["mmtx"]["params"],
            "train_gflops": round(flops["mmtx"] / 1e9, 2),
            "train_gflops_counted": round(info["mmtx"]["train_flops_counted"] / 1e9, 2),
            "train_gflops_by_part": {k: round(v / 1e9, 2) for k, v in parts.items()},
        }
        if reference:
            flops["ref"] = info["ref"]["train_flops_counted"]
            result |= {
                "ref_params": info["ref"]["params"],
                "params_ratio": round(info["mmtx"]["params"] / info["ref"]["params"], 4),
                "ref_train_gflops_counted": round(flops["ref"] / 1e9, 2),
            }

        result |= measure_speed(workers, cfg)
        for w in workers:
            result |= {prefix(w.kind) + k: v for k, v in w.call("memory").items()}
        if cfg.device == "cuda":
            log("host synchronisations per generation call")
            precision = cfg.precisions[-1]
            for w in workers:
                for mode, beams in (("greedy", 1), ("beam", cfg.beams)):
                    result[f"{prefix(w.kind)}{mode}_host_syncs"] = w.call(
                        "host_syncs", beams=beams, precision=precision
                    )
        if reference:
            result |= speedups(result, cfg)
        result |= utilisation(result, flops, cfg, peak_tflops)

        if profile:
            log(f"profiler, {profile} training steps")
            result |= workers[0].call("profile", steps=profile, precision=cfg.precisions[-1])
        if loss_curve:
            log(f"loss curves, {loss_curve} steps x 3 runs")
            result |= loss_curve_summary(workers[0].call("loss_curve", steps=loss_curve))
    finally:
        for w in workers:
            w.close()
    return result


def loss_curve_summary(curves: dict[str, list[float]]) -> dict[str, Any]:
    def max_rel_gap(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) / abs(y) for x, y in zip(a, b))

    fp32, bf16, other = curves["fp32"], curves["bf16"], curves["fp32_seed1"]
    gap, noise = max_rel_gap(bf16, fp32), max_rel_gap(other, fp32)
    return {
        "loss_curve_steps": len(fp32),
        "loss_first": round(fp32[0], 4),
        "loss_final_fp32": round(fp32[-1], 4),
        "loss_final_bf16": round(bf16[-1], 4),
        "loss_final_rel_gap": round(abs(bf16[-1] - fp32[-1]) / fp32[-1], 4),
        "loss_curve_max_rel_gap": round(gap, 4),
        "loss_curve_noise_max_rel_gap": round(noise, 4),  # fp32 vs fp32 from another seed
        "loss_curve_within_noise": gap <= noise,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "Time mmtx's captioner (training step, greedy and beam generation, fp32 and bf16) "
            "against Hugging Face's VisionEncoderDecoderModel at the same size; print one JSON line."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = BenchConfig()
    size = p.add_argument_group("model size (both models)")
    size.add_argument("--image", type=int, default=d.image, help="image side in pixels")
    size.add_argument("--patch", type=int, default=d.patch, help="ViT patch side")
    size.add_argument("--dim", type=int, default=d.dim, help="width of encoder and decoder")
    size.add_argument("--heads", type=int, default=d.heads, help="attention heads")
    size.add_argument("--enc-layers", type=int, default=d.enc_layers, help="ViT blocks")
    size.add_argument("--dec-layers", type=int, default=d.dec_layers, help="decoder blocks")
    size.add_argument("--vocab", type=int, default=d.vocab, help="vocabulary size")
    work = p.add_argument_group("workload")
    work.add_argument("--text-len", type=int, default=d.text_len, help="caption tokens per training example")
    work.add_argument("--batch", type=int, default=d.batch, help="training batch size")
    work.add_argument("--steps", type=int, default=d.steps, help="timed repetitions (the median is reported)")
    work.add_argument("--warmup", type=int, default=d.warmup, help="untimed repetitions first")
    work.add_argument("--gen-batch", type=int, default=d.gen_batch, help="images per generation call")
    work.add_argument("--new-tokens", type=int, default=d.new_tokens, help="tokens every sequence generates")
    work.add_argument("--beams", type=int, default=d.beams, help="beam width for beam search")
    run_ = p.add_argument_group("run")
    run_.add_argument("--device", choices=("cpu", "cuda"), default=d.device, help="where to run")
    run_.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure Hugging Face's VisionEncoderDecoderModel (default: when transformers is importable)",
    )
    run_.add_argument(
        "--precisions",
        type=lambda s: tuple(dict.fromkeys(s.split(","))),
        default=d.precisions,
        help="comma-separated: fp32, bf16 (autocast)",
    )
    run_.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile mmtx's model for the training step and its image encoder for generation",
    )
    run_.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute mmtx's blocks' activations in the backward pass (activation_checkpointing=true)",
    )
    run_.add_argument(
        "--loss-curve",
        type=int,
        default=0,
        metavar="N",
        help="also train N steps in fp32 and bf16 on fixed random data and compare the losses",
    )
    run_.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile N mmtx training steps: device time by kind of kernel, GPU busy fraction",
    )
    run_.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak for MFU (default: looked up for H100/H200)",
    )
    args = p.parse_args(argv)
    for name in (
        "image",
        "patch",
        "dim",
        "heads",
        "enc_layers",
        "dec_layers",
        "vocab",
        "batch",
        "steps",
        "gen_batch",
        "new_tokens",
        "beams",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.precisions or set(args.precisions) - set(SUFFIXES):
        p.error(f"--precisions: a comma-separated list of {', '.join(SUFFIXES)}")
    if args.image % args.patch or args.dim % args.heads or args.text_len < 2 or args.warmup < 0:
        p.error("need --image divisible by --patch, --dim by --heads, --text-len >= 2, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        reason = "--device cuda: no CUDA device available"
        log(f"skipped: {reason}")
        print(json.dumps({"device": "cuda", "skipped": reason}))
        return 0
    reference = args.reference
    if reference is None or reference:
        try:
            import transformers  # noqa: F401
        except ImportError:
            if reference:
                print("--reference needs transformers: pip install -e '.[bench]'", file=sys.stderr)
                return 2
            reference = False
        else:
            reference = True
    cfg = BenchConfig(
        image=args.image,
        patch=args.patch,
        dim=args.dim,
        heads=args.heads,
        enc_layers=args.enc_layers,
        dec_layers=args.dec_layers,
        vocab=args.vocab,
        text_len=args.text_len,
        batch=args.batch,
        steps=args.steps,
        warmup=args.warmup,
        gen_batch=args.gen_batch,
        new_tokens=args.new_tokens,
        beams=args.beams,
        device=args.device,
        compile=args.compile,
        activation_checkpointing=args.activation_checkpointing,
        precisions=args.precisions,
    )
    result = run(cfg, reference, args.loss_curve, args.peak_tflops, args.profile)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
