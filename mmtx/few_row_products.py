"""A CPU speed-up for decoding: linear layers fed few rows computed as ``(W @ x.T).T``.

A decoding step feeds one token per sequence, so each of its products has as many rows as there
are sequences (one per beam when captioning one image). For such shapes MKL's fp32 GEMM is
faster with the weight as the left operand, and its matrix-vector kernel (one row) is slower than
the same product on two rows. The models keep plain ``nn.Linear``; :func:`few_row_products` is a
``TorchFunctionMode`` that generation enters, rerouting only the ``F.linear`` calls it pays for
(fp32 on the CPU, outside autocast, at most ``MAX_ROWS`` rows) and leaving every other call alone.
The result is the same product; ``scripts/bench_linear.py`` measures what it gains (docs/cpu.md).

Whether it pays depends on the CPU: it does where torch runs AVX-512 kernels; where it runs AVX2
ones, the 1-row products and the mode's per-call dispatch cost more than the few-row products
gain (docs/cpu.md, "Few-row products", has the CPUs and the command). `pays_on_this_cpu` is that
rule, generation's default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

MAX_ROWS = 64  # the largest row count rerouted: past it the two layouts are equally fast


def linear_few_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T`` (one row is done as two)."""
    rows = x.numel() // x.shape[-1]
    x2 = x.reshape(rows, x.shape[-1])
    if rows == 1:  # as two rows: MKL's matrix-vector product is the slower kernel
        x2 = x2.repeat(2, 1)
    y = weight @ x2.t() if bias is None else torch.addmm(bias[:, None], weight, x2.t())  # (out, rows)
    return y[:, :rows].t().contiguous().view(*x.shape[:-1], weight.shape[0])


def pays_on_this_cpu() -> bool:
    """Whether torch runs AVX-512 kernels here: the CPUs where the few-row layout was measured to pay."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def pays(x: Tensor, weight: Tensor) -> bool:
    """Whether ``F.linear(x, weight)`` is one of the products the few-row layout speeds up."""
    return (
        x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
        and x.shape[-1] > 0
        and 0 < x.numel() // x.shape[-1] <= MAX_ROWS
        and not torch.is_autocast_enabled("cpu")
    )


class few_row_products(TorchFunctionMode):  # noqa: N801 (used as a context manager, like torch.no_grad)
    """Within this context, fp32 CPU ``F.linear`` calls of few rows use :func:`linear_few_rows`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.linear:  # F.linear(input, weight, bias=None), positional or by name
            x, weight, bias = (*args, *(kwargs.get(k) for k in ("input", "weight", "bias")[len(args) :]))[:3]
            if pays(x, weight):
                return linear_few_rows(x, weight, bias)
        return func(*args, **kwargs)
