"""Tiny models shared by the tests."""

import torch

from mmtx.models import CaptionDecoder, ImageCaptioner, VisionEncoder


def tiny_captioner(pos_embed: str = "learned", vocab: int = 40, seed: int = 0, spread: float = 0.3) -> ImageCaptioner:
    """A 2+2-layer captioner on 32-px images whose random weights are spread enough that
    generated tokens vary (a freshly initialised model repeats one token)."""
    torch.manual_seed(seed)
    enc = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=2, num_heads=4, pos_embed=pos_embed)
    dec = CaptionDecoder(vocab, context_dim=32, dim=48, depth=2, num_heads=4, max_length=24, pos_embed=pos_embed)
    model = ImageCaptioner(enc, dec).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0, spread)
    return model
