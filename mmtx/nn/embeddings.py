"""Patch and token embeddings, and the absolute position encodings the towers choose from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtx.config_error import ArgumentError

PositionKind = Literal["learned", "sinusoidal", "rope"]
POSITION_KINDS = ("learned", "sinusoidal", "rope")


def check_position_kind(kind: str, key: str = "pos_embed") -> str:
    if kind not in POSITION_KINDS:
        raise ArgumentError(f"{{{key}!r}} is not one of {', '.join(POSITION_KINDS)}", **{key: kind})
    return kind


class PatchEmbed(nn.Module):
    """Image (B, C, H, W) -> patch tokens (B, N, dim) by a strided convolution."""

    def __init__(
        self,
        patch_size: int,
        in_chans: int,
        dim: int,
        stem: str = "patch",
        stem_norm: str = "batch",
        stem_channels: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if stem not in STEMS:
            raise ArgumentError(f"{{stem!r}} must be one of {', '.join(STEMS)}", stem=stem)
        if stem_norm not in STEM_NORMS:
            raise ArgumentError(f"{{stem_norm!r}} must be one of {', '.join(STEM_NORMS)}", stem_norm=stem_norm)
        self.patch_size = patch_size
        if stem == "patch":  # ViT: one linear map of each patch's pixels
            if stem_channels is not None:
                raise ArgumentError(
                    "{stem_channels} are the conv stem's; {stem!r} has none", stem_channels=stem_channels, stem=stem
                )
            self.stem = nn.Identity()
            self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
        else:  # Xiao et al. 2021, "Early convolutions help transformers see better"
            self.stem, width = conv_stem(patch_size, in_chans, dim, stem_norm, stem_channels)
            self.proj = nn.Conv2d(width, dim, kernel_size=1)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        p = self.patch_size
        if height < p or width < p or height % p or width % p:
            raise ValueError(f"image size {height}x{width} is not a positive multiple of patch_size={p}")
        return height // p, width // p

    def forward(self, images: Tensor) -> Tensor:
        self.grid(images.shape[-2], images.shape[-1])
        return self.proj(self.stem(images)).flatten(2).transpose(1, 2)  # (B, N, dim)


STEMS = ("patch", "conv")


# What normalises each stem convolution's output: ``batch``, statistics of the batch (Xiao et al.;
# under data parallelism each process's own, and running averages at evaluation), or ``group``,
# statistics of each image alone over its channels and positions (GroupNorm with one group): the
# same at any batch size, in training and evaluation, on any number of processes.
STEM_NORMS = {
    "batch": nn.BatchNorm2d,
    "group": lambda channels: nn.GroupNorm(1, channels),
}


def conv_stem(
    patch_size: int, in_chans: int, dim: int, norm: str = "batch", channels: Sequence[int] | None = None
) -> tuple[nn.Sequential, int]:
    """3x3 stride-2 convolutions, each followed by a normalisation (``STEM_NORMS``) and GELU, down
    to the patch grid, channels doubling up to ``dim / 2`` (Xiao et al. 2021) unless ``channels``
    names each layer's: local edges and corners are seen before attention, which makes a small ViT
    learn shapes from little data faster than a linear patch map. He-initialised and normalised, so
    the image reaches the transformer at full strength (PyTorch's default init shrinks it about
    tenfold over three layers). Returns (stem, out channels)."""
    steps = patch_size.bit_length() - 1
    if patch_size < 2 or 2**steps != patch_size:
        raise ArgumentError(
            "{stem} needs a power-of-two patch_size, got {patch_size}", stem="conv", patch_size=patch_size
        )
    if channels is None:
        widths = [max(8, dim // 2 ** (steps - i)) for i in range(steps)]  # ..., dim/4, dim/2
    else:
        widths = list(channels) if isinstance(channels, Sequence) and not isinstance(channels, str) else []
        if len(widths) != steps or not all(type(c) is int and c > 0 for c in widths):
            raise ArgumentError(
                f"{{stem_channels!k}} takes {steps} positive ints at {{patch_size}} "
                "(one per stride-2 layer), got {stem_channels!v}",
                stem_channels=channels,
                patch_size=patch_size,
            )
    layers: list[nn.Module] = []
    for c_in, c_out in zip([in_chans, *widths[:-1]], widths):
        conv = nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1, bias=False)
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
        layers += [conv, STEM_NORMS[norm](c_out), nn.GELU()]
    return nn.Sequential(*layers), widths[-1]


def check_sinusoidal_width(dim: int, axes: int) -> None:
    """Fixed positions over ``axes`` axes take sin/cos pairs of width ``dim / axes``."""
    if dim % (2 * axes):
        raise ArgumentError(
            f"{{pos_embed}} needs dim divisible by {2 * axes}, got {{dim}}", pos_embed="sinusoidal", dim=dim
        )


def sinusoidal_1d(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """The original transformer's fixed encoding: (T,) positions -> (T, dim), sin and cos interleaved."""
    check_sinusoidal_width(dim, axes=1)
    inv_freq = torch.exp(-math.log(base) * torch.arange(0, dim, 2, device=positions.device) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, dim/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def sinusoidal_2d(grid_h: int, grid_w: int, dim: int, device: torch.device | None = None) -> Tensor:
    """Fixed 2-D encoding (as in MAE): half the width encodes the row, half the column -> (h*w, dim)."""
    check_sinusoidal_width(dim, axes=2)
    rows, cols = grid_positions(grid_h, grid_w, device).unbind(1)
    return torch.cat([sinusoidal_1d(rows, dim // 2), sinusoidal_1d(cols, dim // 2)], dim=1)


def grid_positions(grid_h: int, grid_w: int, device: torch.device | None = None) -> Tensor:
    """(row, col) of each patch in row-major order -> (h*w, 2)."""
    rows = torch.arange(grid_h, device=device).repeat_interleave(grid_w)
    cols = torch.arange(grid_w, device=device).repeat(grid_h)
    return torch.stack([rows, cols], dim=1)


def resample_positions(
    pos: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], antialias: bool = False
) -> Tensor:
    """Bicubically resize a learned patch-position table (1, h*w, D) to another grid size.

    This is how a ViT trained at one image size runs at another (Dosovitskiy et al. 2020, 3.2).
    """
    if tuple(old_grid) == tuple(new_grid):
        return pos
    D = pos.shape[-1]
    grid = pos.reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.float(), size=new_grid, mode="bicubic", align_corners=False, antialias=antialias)
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(pos.dtype)
