"""What the machine can do and how long things take on it, for `bench.py`: memory bandwidth, the
matmul peak, FLOPs counted by torch (with the CPU flash-attention kernels its table lacks),
kernels sorted by kind, wall-clock timing with the device synchronised, peak memory."""

from __future__ import annotations

import re
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

# Dense bf16 tensor-core peaks (TFLOP/s) from NVIDIA's datasheets (half the "with sparsity" figure),
# matched in order against torch.cuda.get_device_name(); an SXM H100 calls itself "NVIDIA H100 80GB HBM3".
DATASHEET_BF16_TFLOPS = (
    ("H200 NVL", 835.5),
    ("H200", 989.4),
    ("H100 NVL", 835.5),
    ("H100 PCIe", 756.5),
    ("H100", 989.4),
)


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


def datasheet_peak_tflops(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((tflops for key, tflops in DATASHEET_BF16_TFLOPS if key in name), None)
