"""Cross-attention that also says where it read, for image tokens laid out on a square grid.

A caption's relation word ("left of", "above") depends on where the shapes it names stand. Plain
cross-attention returns what its heads read: the values of the image tokens, which hold a shape's
place only as far as the encoder's position embeddings passed it on. `WhereCrossAttention` adds
each head's attention-weighted mean of the tokens' coordinates, so a query that singles out a
shape holds that shape's place as such. The coordinates ride along with the values through the
same attention, so the weights are computed once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmtx.nn.attention import Attention, sdpa


def grid_coordinates(num_tokens: int, device: torch.device | None = None) -> Tensor:
    """(num_tokens, 3) coordinates of a CLS token followed by a square grid of patches, row by row
    from the top left: each patch's centre (x, y) in [-1, 1] and a flag that is 1 on CLS only
    (which stands at (0, 0))."""
    side = math.isqrt(max(num_tokens - 1, 0))
    if num_tokens < 2 or side * side != num_tokens - 1:
        raise ValueError(
            f"reading where needs a CLS token and a square grid of patch tokens, got {num_tokens} tokens "
            "(images are squashed to a square before the encoder)"
        )
    centres = (torch.arange(side, device=device) + 0.5) / side * 2 - 1
    y, x = torch.meshgrid(centres, centres, indexing="ij")
    coords = torch.zeros(num_tokens, 3, device=device)  # built where it is used: no copy from the host
    coords[1:, 0], coords[1:, 1] = x.flatten(), y.flatten()
    coords[0, 2] = 1.0  # CLS, at (0, 0)
    return coords


class WhereCrossAttention(Attention):
    """Cross-attention whose heads also return where they read (see the module's docstring).

    Arguments as `Attention`'s (``context_dim`` required). The context must be a CLS token
    followed by a square grid of patch tokens, row by row (`grid_coordinates`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        context_dim: int,
        qkv_bias: bool = True,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
    ) -> None:
        super().__init__(
            dim,
            num_heads,
            context_dim=context_dim,
            qkv_bias=qkv_bias,
            attn_dropout=attn_dropout,
            proj_dropout=proj_dropout,
        )
        self.where = nn.Linear(3 * num_heads, dim)  # the heads' mean places -> the stream

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, shape: torch.Size
    ) -> Tensor:
        coords = grid_coordinates(v.shape[2], v.device).to(v.dtype).expand(*v.shape[:3], 3)  # (B, H, S, 3)
        dropout = self.attn_dropout if self.training else 0.0
        y = sdpa(q, k, torch.cat([v, coords], -1), attn_mask=mask, is_causal=is_causal, dropout_p=dropout)
        read, where = y.split((self.head_dim, 3), -1)  # (B, H, T, Dh), (B, H, T, 3)
        joined = self.proj(read.transpose(1, 2).reshape(shape))  # (B, T, dim), as Attention joins them
        places = self.where(where.transpose(1, 2).reshape(*shape[:2], -1))  # (B, T, dim)
        return self.proj_dropout(joined + places)
