"""ViT patch encoder (Dosovitskiy et al. 2020): image -> CLS + patch tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.nn.attention import head_width
from mmtx.nn.blocks import TransformerBlock
from mmtx.nn.embeddings import (
    PatchEmbed,
    PositionKind,
    check_position_kind,
    check_sinusoidal_width,
    grid_positions,
    resample_positions,
    sinusoidal_2d,
)
from mmtx.nn.init import init_weights
from mmtx.nn.rotary import Rotary


class VisionEncoder(nn.Module):
    """Conv patch embedding, a CLS token, positions, and a stack of transformer blocks.

    Args:
        image_size: the training image size; learned positions are stored for its grid and
            resampled bicubically when an image of another size comes in.
        patch_size: side of the square patches.
        dim, depth, num_heads, mlp_ratio: the transformer's width, blocks, heads, MLP expansion.
        pos_embed: ``learned`` (ViT), ``sinusoidal`` (fixed 2-D) or ``rope`` (axial 2-D rotary).
        norm_first: pre-norm blocks and a final norm (ViT); False: post-norm blocks, no final norm.
        activation: the MLP activation (``gelu``, ``gelu_tanh``, ``relu``).
        pos_antialias: antialias the bicubic resampling of learned positions when the grid
            shrinks (timm does; Hugging Face's ViT does not).
        stem: ``patch`` (ViT's linear patch map) or ``conv`` (strided 3x3 convolutions, normalised, down
            to the patch grid, then a 1x1 map: `mmtx.nn.embeddings.conv_stem`).
        stem_norm: the conv stem's normalisation: ``batch`` (BatchNorm: statistics of the batch,
            per process under data parallelism) or ``group`` (each image's own: GroupNorm).
        stem_channels: the conv stem's channels, one per stride-2 layer; None: doubling up to
            ``dim / 2``.
        attention: ``full`` (every head reads every token) or ``axial`` (half the heads read
            along the query's row of patches, the others along its column, all of them the
            CLS token: Ho et al. 2019's axial attention within each block): two patches on one
            line of the image meet undiluted by the rest of it, and two blocks still connect
            any two patches.
    """

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        pos_embed: PositionKind = "learned",
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_eps: float = 1e-6,
        norm_first: bool = True,
        activation: str = "gelu",
        pos_antialias: bool = False,
        stem: str = "patch",
        stem_norm: str = "batch",
        stem_channels: Sequence[int] | None = None,
        attention: str = "full",
    ) -> None:
        super().__init__()
        self.pos_kind = check_position_kind(pos_embed)
        head_dim = head_width(dim, num_heads)
        if attention not in ("full", "axial"):
            raise ArgumentError("{attention!r} is not one of full, axial", attention=attention)
        if attention == "axial" and num_heads < 2:
            raise ArgumentError(
                "{attention!r} needs at least 2 heads (rows and columns), got {num_heads}",
                attention=attention,
                num_heads=num_heads,
            )
        if pos_embed == "sinusoidal":
            check_sinusoidal_width(dim, axes=2)
        if image_size < patch_size or image_size % patch_size:
            relation = "smaller than" if image_size < patch_size else "not a multiple of"
            raise ArgumentError(
                f"{{image_size}} is {relation} {{patch_size}} "
                f"(allowed: a multiple of {patch_size}: {patch_size}, {2 * patch_size}, {3 * patch_size}, ...)",
                image_size=image_size,
                patch_size=patch_size,
            )
        self.dim, self.num_heads, self.image_size, self.attention = dim, num_heads, image_size, attention
        self.norm_first, self.pos_antialias = norm_first, pos_antialias
        self.patch_embed = PatchEmbed(patch_size, in_chans, dim, stem, stem_norm, stem_channels)
        self.grid_size = self.patch_embed.grid(image_size, image_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        num_patches = self.grid_size[0] * self.grid_size[1]
        # learned: one vector per patch of the training grid plus one for CLS (timm layout)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + num_patches, dim) * 0.02) if pos_embed == "learned" else None
        self.rotary = Rotary(head_dim, ndim=2) if pos_embed == "rope" else None
        self.pos_drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim,
                num_heads,
                mlp_ratio,
                qkv_bias=qkv_bias,
                dropout=dropout,
                attn_dropout=attn_dropout,
                norm_eps=norm_eps,
                norm_first=norm_first,
                activation=activation,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if norm_first else nn.Identity()
        self.apply(init_weights)
        nn.init.normal_(self.cls_token, std=0.02)

    def positions(self, grid: tuple[int, int]) -> Tensor:
        """Additive position table (1, 1 + h*w, dim) for a grid of patches."""
        if self.pos_kind == "learned":
            cls_pos, patch_pos = self.pos_embed[:, :1], self.pos_embed[:, 1:]
            patch_pos = resample_positions(patch_pos, self.grid_size, grid, antialias=self.pos_antialias)
            return torch.cat([cls_pos, patch_pos], dim=1)
        table = sinusoidal_2d(*grid, self.dim, device=self.cls_token.device)
        return torch.cat([table.new_zeros(1, self.dim), table])[None].to(self.cls_token.dtype)

    def head_mask(self, grid: tuple[int, int], device: torch.device) -> Tensor | None:
        """What each head reads (H, 1 + N, 1 + N), True where it may, for a grid of patches;
        None for full attention."""
        return axial_head_mask(grid, self.num_heads, device) if self.attention == "axial" else None

    def embed(
        self, images: Tensor, masked: Tensor | None = None, mask_token: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Patch tokens with CLS and positions (B, 1 + N, dim), and the rotary tables if any.

        ``masked`` (B, N) marks patches whose embedding is replaced by ``mask_token`` (dim,)
        before positions are added (masked patch modelling).
        """
        grid = self.patch_embed.grid(images.shape[-2], images.shape[-1])
        x = self.patch_embed(images)
        if masked is not None:
            x = torch.where(masked[..., None], mask_token.to(x.dtype), x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        rope = None
        if self.rotary is not None:
            # CLS sits at (0, 0) (no rotation); patches at (row + 1, col + 1)
            pos = torch.cat([x.new_zeros(1, 2), grid_positions(*grid, device=x.device) + 1])
            rope = self.rotary(pos)
        else:
            x = x + self.positions(grid)
        return self.pos_drop(x), rope

    def forward(self, images: Tensor) -> Tensor:
        """``images`` (B, 3, H, W) -> tokens (B, 1 + N, dim), CLS first, after the final norm."""
        x, rope = self.embed(images)
        head_mask = self.head_mask(self.patch_embed.grid(images.shape[-2], images.shape[-1]), x.device)
        for block in self.blocks:
            x = block(x, rope=rope, head_mask=head_mask)
        return self.norm(x)


def axial_head_mask(grid: tuple[int, int], num_heads: int, device: torch.device | None = None) -> Tensor:
    """Axial attention over CLS + a (rows, cols) grid of patches, row-major: (H, 1 + N, 1 + N),
    True where a head's query may read a key. The first ``num_heads // 2`` heads read along
    the query's row, the others along its column; every head reads and is read by CLS."""
    rows, cols = grid
    row, col = torch.cartesian_prod(torch.arange(rows, device=device), torch.arange(cols, device=device)).unbind(1)
    lines = torch.stack([row[:, None] == row[None, :], col[:, None] == col[None, :]])  # (2, N, N)
    mask = torch.ones(2, 1 + rows * cols, 1 + rows * cols, dtype=torch.bool, device=device)
    mask[:, 1:, 1:] = lines
    return mask[(torch.arange(num_heads, device=device) >= num_heads // 2).long()]
