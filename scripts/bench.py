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
import re
import resource
import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.nn.functional as F

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MLP_RATIO = 4

# Dense bf16 tensor-core peaks (TFLOP/s) from NVIDIA's datasheets (half the "with sparsity" figure),
# matched in order against torch.cuda.get_device_name(); an SXM H100 calls itself "NVIDIA H100 80GB HBM3".
DATASHEET_BF16_TFLOPS = (
    ("H200 NVL", 835.5),
    ("H200", 989.4),
    ("H100 NVL", 835.5),
    ("H100 PCIe", 756.5),
    ("H100", 989.4),
)


@dataclass(frozen=True)
class BenchConfig:
    """Model shapes and workload, shared by both models (see ``parse_args`` for each field)."""

    image: int = 224
    patch: int = 16
    dim: int = 384
    heads: int = 6
    enc_layers: int = 6
    dec_layers: int = 6
    vocab: int = 8192
    text_len: int = 32
    batch: int = 16
    steps: int = 5
    warmup: int = 2
    gen_batch: int = 16
    new_tokens: int = 32
    beams: int = 4
    device: str = "cpu"
    compile: bool = False
    precisions: tuple[str, ...] = ("fp32", "bf16")
    seed: int = 0

    @property
    def max_positions(self) -> int:
        """Position-table size: the training text, or BOS plus the generated tokens."""
        return max(self.text_len, 1 + self.new_tokens)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def build_mmtx(cfg: BenchConfig) -> torch.nn.Module:
    from mmtx.models import CaptionDecoder, ImageCaptioner, VisionEncoder

    encoder = VisionEncoder(
        image_size=cfg.image,
        patch_size=cfg.patch,
        dim=cfg.dim,
        depth=cfg.enc_layers,
        num_heads=cfg.heads,
        mlp_ratio=MLP_RATIO,
    )
    decoder = CaptionDecoder(
        cfg.vocab,
        context_dim=cfg.dim,
        dim=cfg.dim,
        depth=cfg.dec_layers,
        num_heads=cfg.heads,
        mlp_ratio=MLP_RATIO,
        max_length=cfg.max_positions,
        tie_embeddings=True,
        pad_id=PAD_ID,
    )
    return ImageCaptioner(encoder, decoder)


def build_reference(cfg: BenchConfig) -> torch.nn.Module:
    from transformers import BertConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    encoder = ViTConfig(
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.enc_layers,
        num_attention_heads=cfg.heads,
        intermediate_size=MLP_RATIO * cfg.dim,
        image_size=cfg.image,
        patch_size=cfg.patch,
    )
    decoder = BertConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.dec_layers,
        num_attention_heads=cfg.heads,
        intermediate_size=MLP_RATIO * cfg.dim,
        max_position_embeddings=cfg.max_positions,
        is_decoder=True,
        add_cross_attention=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,  # mmtx's bench model has none either
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = BOS_ID, PAD_ID, EOS_ID
    return VisionEncoderDecoderModel(config=config)


def caption_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in fp32, padding ignored (what ``ImageCaptioner.loss`` computes)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=PAD_ID)


class Adapter:
    """One model behind a common face: a training loss and fixed-length generation."""

    name: str
    model: torch.nn.Module

    def loss(self, images: torch.Tensor, ids: torch.Tensor, eager: bool = False) -> torch.Tensor:
        """Training loss; ``eager`` bypasses ``torch.compile`` (for counting FLOPs)."""
        raise NotImplementedError

    def generate(self, images: torch.Tensor, new_tokens: int, beams: int) -> torch.Tensor:
        """Generated ids (B, new_tokens), without the start token."""
        raise NotImplementedError

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """The image tokens the decoder reads (what generation computes first)."""
        raise NotImplementedError


class MmtxAdapter(Adapter):
    name = "mmtx"

    def __init__(self, cfg: BenchConfig) -> None:
        self.model = build_mmtx(cfg)
        self.compiled = torch.compile(self.model) if cfg.compile else None
        self._encode = torch.compile(self.model.encode) if cfg.compile else self.model.encode

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self._encode(images)

    def loss(self, images: torch.Tensor, ids: torch.Tensor, eager: bool = False) -> torch.Tensor:
        forward = self.model if eager or self.compiled is None else self.compiled
        return caption_loss(forward(images, ids[:, :-1]), ids[:, 1:])

    def generate(self, images: torch.Tensor, new_tokens: int, beams: int) -> torch.Tensor:
        from mmtx.generation import GenerationConfig, generate

        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=beams)
        context = self.encode(images)
        return generate(self.model.decoder, context, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID, config=config)


class ReferenceAdapter(Adapter):
    name = "ref"

    def __init__(self, cfg: BenchConfig) -> None:
        self.model = build_reference(cfg)

    def loss(self, images: torch.Tensor, ids: torch.Tensor, eager: bool = False) -> torch.Tensor:
        logits = self.model(pixel_values=images, decoder_input_ids=ids[:, :-1]).logits
        return caption_loss(logits, ids[:, 1:])

    def generate(self, images: torch.Tensor, new_tokens: int, beams: int) -> torch.Tensor:
        out = self.model.generate(
            pixel_values=images,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            num_beams=beams,
            do_sample=False,
            early_stopping=True,
            length_penalty=1.0,
            decoder_start_token_id=BOS_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )
        return out[:, 1:]  # drop the decoder start token

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(pixel_values=images).last_hidden_state


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------
def analytic_train_flops(cfg: BenchConfig) -> dict[str, float]:
    """Matmul FLOPs of one training step (forward x3), by component. A multiply-add is 2 FLOPs."""
    B, d, V, Le, Ld = cfg.batch, cfg.dim, cfg.vocab, cfg.enc_layers, cfg.dec_layers
    P = (cfg.image // cfg.patch) ** 2  # patches
    N = P + 1  # image tokens with CLS
    T = cfg.text_len - 1  # decoder inputs (the caption minus its last token)
    h = MLP_RATIO * d
    forward = {
        "patch_embed": 2 * B * P * (3 * cfg.patch**2) * d,
        "enc_attn_proj": Le * 2 * B * N * d * 4 * d,  # fused QKV + output
        "enc_attn_scores": Le * 2 * (2 * B * N * N * d),  # QK^T and (softmax)V
        "enc_mlp": Le * 2 * B * N * 2 * d * h,
        "dec_self_proj": Ld * 2 * B * T * d * 4 * d,
        "dec_self_scores": Ld * 2 * (2 * B * T * T * d),
        "dec_cross_proj": Ld * (2 * B * T * d * 2 * d + 2 * B * N * d * 2 * d),  # Q + output; K, V of the image
        "dec_cross_scores": Ld * 2 * (2 * B * T * N * d),
        "dec_mlp": Ld * 2 * B * T * 2 * d * h,
        "lm_head": 2 * B * T * d * V,
    }
    return {k: 3.0 * v for k, v in forward.items()}


def decode_step_floor_ms(cfg: BenchConfig, rows: int, bandwidth_gbs: float, peak_gflops: float) -> float:
    """Lower bound (ms) on one fp32 decoding step of ``rows`` sequences: the larger of the bytes it
    must read at the measured memory bandwidth and the FLOPs it must do at the measured matmul peak.

    Bytes: every decoder weight used per step (self-attention QKV and output, cross-attention Q and
    output, MLP, LM head; the cross-attention K/V projections ran once, before the loop), the
    images' cross-attention keys/values (once per image: the beams of an image may share them) and
    the self-attention cache at its mean length. FLOPs: 2 per multiply-add of the same products.
    """
    d, Ld, V = cfg.dim, cfg.dec_layers, cfg.vocab
    N = (cfg.image // cfg.patch) ** 2 + 1
    t = 1 + cfg.new_tokens / 2  # mean self-attention length
    weights = Ld * (4 * d * d + 2 * d * d + 2 * MLP_RATIO * d * d) + V * d
    cross_kv = cfg.gen_batch * N * 2 * d * Ld
    self_kv = rows * t * 2 * d * Ld
    seconds_memory = 4 * (weights + cross_kv + self_kv) / (bandwidth_gbs * 1e9)
    flops = 2 * rows * weights + rows * Ld * 4 * d * (t + N)
    seconds_compute = flops / (peak_gflops * 1e9)
    return 1e3 * max(seconds_memory, seconds_compute)


def memory_bandwidth_gbs(device: str, mib: int = 256, repeats: int = 5) -> float:
    """Best copy bandwidth (bytes read + written per second) of a buffer far larger than caches."""
    src = torch.empty(mib * 2**20 // 4, device=device).uniform_()
    dst = torch.empty_like(src)
    best = min(timed(lambda: dst.copy_(src), device) for _ in range(repeats + 1))
    return 2 * src.numel() * 4 / best / 1e9


# FlopCounterMode passes formulas the shapes of the op's arguments.
def _cpu_flash_attention_flops(
    query: torch.Size, key: torch.Size, value: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _cpu_flash_attention_backward_flops(
    grad_out: torch.Size,
    query: torch.Size,
    key: torch.Size,
    value: torch.Size,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, query, key, value)


def cpu_flash_attention_flops() -> dict[Any, Callable[..., int]]:
    """``FlopCounterMode``'s ``custom_mapping`` for the CPU flash attention kernels its table lacks."""
    aten = torch.ops.aten
    mapping: dict[Any, Callable[..., int]] = {}
    for op, fn in (
        ("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash_attention_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_flash_attention_backward_flops),
    ):
        if hasattr(aten, op):
            mapping[getattr(aten, op)] = fn
    return mapping


def counted_flops(step: Callable[[], None]) -> float:
    """FLOPs that ``FlopCounterMode`` sees in ``step`` (its table lacks the CPU flash kernel: added)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=cpu_flash_attention_flops()) as counter:
        step()
    return float(counter.get_total_flops())


def matmul_peak_gflops(dtype: torch.dtype, device: str, repeats: int = 5, budget_s: float = 3.0) -> float:
    """Best throughput of a large square matmul: the practical ceiling for MFU. On a CPU the size
    shrinks from 2048 until one product takes about a second (one without native bf16 would take
    minutes at 2048 in bf16); repeats stop after ``budget_s`` (at least two products)."""
    n = 8192 if device == "cuda" else 2048
    if device != "cuda":
        probe = torch.randn(256, 256).to(dtype)
        timed(lambda: probe @ probe, device)
        seconds = timed(lambda: probe @ probe, device)
        while n > 256 and seconds * (n / 256) ** 3 > 1.0:
            n //= 2
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times: list[float] = []
    while len(times) < repeats + 1 and (len(times) < 2 or sum(times) < budget_s):
        times.append(timed(lambda: a @ b, device))
    return 2 * n**3 / min(times) / 1e9


# --------------------------------------------------------------------------------------------
# Worker: one model, measured on request
# --------------------------------------------------------------------------------------------
KERNEL_KINDS = (  # first match wins; CUDA kernel names (cuBLAS, cuDNN, flash, Triton) and CPU operators
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|cudnn::fusion::compute_dot_do_o", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor", re.I)),
    (
        "matmul",
        re.compile(
            r"gemm|nvjet|xmma|cutlass|cublas|aten::(mm|addmm|bmm|baddbmm|linear|matmul|convolution|convolution_backward|mkldnn_convolution)$|_mm_",
            re.I,
        ),
    ),
)


def kernel_kind(name: str) -> str:
    """matmul, attention, optimizer or other, from a kernel's or operator's name."""
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Wall-clock seconds of ``fn()``, the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


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
def datasheet_peak_tflops(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((tflops for key, tflops in DATASHEET_BF16_TFLOPS if key in name), None)


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
        precisions=args.precisions,
    )
    result = run(cfg, reference, args.loss_curve, args.peak_tflops, args.profile)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
