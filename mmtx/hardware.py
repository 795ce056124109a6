"""What the machine can do fast, detected rather than assumed."""

from __future__ import annotations

import os

import torch


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX).

    Where it does, bf16 matrix products run several times faster than fp32; where it does not,
    PyTorch emulates them and a bf16-autocast training step is several times *slower* than fp32.
    """
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cpu_precision() -> str:
    """Lightning's ``precision`` for training on this CPU: bf16 autocast where it is native, else fp32."""
    return "bf16-mixed" if cpu_has_native_bf16() else "32-true"


def training_precision(accelerator: str) -> str:
    """Lightning's ``precision`` for an accelerator: bf16 autocast on GPUs, :func:`cpu_precision`
    on the CPU (``auto``: whichever Lightning will pick), fp32 elsewhere. One rule for every
    trainer preset, so that ``trainer=ddp trainer.accelerator=cpu`` computes as ``trainer=cpu``."""
    if accelerator == "auto":
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator in ("gpu", "cuda"):
        return "bf16-mixed"
    return cpu_precision() if accelerator == "cpu" else "32-true"


def loader_workers(most: int = 4) -> int:
    """Data-loader worker processes for this machine: up to ``most``, leaving one core to the
    training process (0 on a single core: load in the main process)."""
    return max(0, min(int(most), (os.cpu_count() or 1) - 1))
