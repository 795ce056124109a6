"""What masked patch modelling predicts for a masked patch (pluggable through config).

ViLBERT predicts a detector's class distribution for a masked region; with raw patches and no
detector, mmtx regresses the patch's pixels instead, normalised per patch as in MAE (He et al.
2022), which makes the target about local structure rather than brightness.
"""

from __future__ import annotations

from torch import Tensor

from mmtx.nn.pixels import IMAGENET_MEAN, IMAGENET_STD


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) -> (B, N, patch_size**2 * C), patches in row-major order like PatchEmbed."""
    B, C, H, W = images.shape
    p = patch_size
    x = images.reshape(B, C, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)


class NormalizedPixels:
    """Each patch's pixels, standardised by that patch's own mean and variance (MAE's target)."""

    def __init__(self, patch_size: int, in_chans: int = 3, eps: float = 1e-6) -> None:
        self.patch_size, self.dim, self.eps = patch_size, patch_size * patch_size * in_chans, eps

    def __call__(self, images: Tensor) -> Tensor:
        x = patchify(images.float(), self.patch_size)
        return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + self.eps).sqrt()


class MeanColor:
    """Each patch's mean RGB colour in [0, 1]: a coarse target that is easy on tiny models."""

    def __init__(self, patch_size: int, in_chans: int = 3) -> None:
        self.patch_size, self.dim, self.in_chans = patch_size, in_chans, in_chans

    def __call__(self, images: Tensor) -> Tensor:
        mean = images.new_tensor(IMAGENET_MEAN)[:, None, None]
        std = images.new_tensor(IMAGENET_STD)[:, None, None]
        x = patchify((images.float() * std + mean), self.patch_size)  # back to [0, 1] pixels
        return x.reshape(*x.shape[:2], -1, self.in_chans).mean(2)
