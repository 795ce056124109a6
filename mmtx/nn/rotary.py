"""Rotary position embedding (RoPE, Su et al. 2021), 1-D for text and axial 2-D for patches."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmtx.config_error import ArgumentError


class Rotary(nn.Module):
    """Produces the (cos, sin) tables that rotate query/key pairs by position-dependent angles.

    For ``ndim=1`` a position is a scalar (token index). For ``ndim=2`` it is (row, col), and the
    frequencies are split evenly between the two axes, so each half of the rotated pairs encodes
    one axis (axial 2-D RoPE).
    """

    def __init__(self, head_dim: int, ndim: int = 1, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % (2 * ndim) != 0:
            raise ArgumentError(
                f"{{pos_embed}} needs a head width (dim / num_heads = {head_dim}) divisible by {2 * ndim}",
                pos_embed="rope",
            )
        self.ndim = ndim
        axis_dim = head_dim // ndim
        inv_freq = 1.0 / base ** (torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (axis_dim / 2,)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``positions``: (T,) or (T, ndim). Returns cos, sin of shape (T, head_dim / 2)."""
        pos = positions.float().reshape(positions.shape[0], self.ndim)
        angles = (pos[:, :, None] * self.inv_freq[None, None, :]).flatten(1)  # (T, head_dim/2)
        return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (x1, x2) halves of the last dim of ``x`` (B, H, T, Dh) by the angles in cos/sin."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
