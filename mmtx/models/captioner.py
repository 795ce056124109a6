"""Image captioner: a ViT encoder composed with a cross-attending text decoder."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.vit import VisionEncoder


class ImageCaptioner(nn.Module):
    """``encoder`` turns images into tokens; ``decoder`` predicts the caption from them.

    The encoder width may differ from the decoder's: cross-attention projects between them.
    """

    def __init__(self, encoder: VisionEncoder, decoder: CaptionDecoder) -> None:
        super().__init__()
        if decoder.context_dim != encoder.dim:
            raise ArgumentError(
                "{decoder.context_dim} must equal {encoder.dim}",
                **{"decoder.context_dim": decoder.context_dim, "encoder.dim": encoder.dim},
            )
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) -> image tokens (B, 1 + N, encoder.dim)."""
        return self.encoder(images)

    def forward(self, images: Tensor, input_ids: Tensor, image_index: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, vocab) for ``input_ids`` (B, T) given the images (B, 3, H, W),
        or given (U, 3, H, W) and ``image_index`` (B,), the row of each caption's image: each image
        encoded once, its keys and values projected once for all its captions."""
        return self.decoder(input_ids, self.encode(images), context_index=image_index)

    def loss(
        self,
        images: Tensor,
        input_ids: Tensor,
        pad_id: int,
        label_smoothing: float = 0.0,
        weight: Tensor | None = None,
        image_index: Tensor | None = None,
    ) -> Tensor:
        """Next-token cross-entropy over the caption ``[BOS] w1 .. wn [EOS] [PAD]..``; pads ignored.
        ``weight`` (vocab,): each target token's weight, the mean then taken over those weights;
        ``image_index``: see `forward`."""
        logits = self(images, input_ids[:, :-1], image_index)
        return F.cross_entropy(
            logits.flatten(0, 1).float(),
            input_ids[:, 1:].flatten(),
            weight=weight,
            ignore_index=pad_id,
            label_smoothing=label_smoothing,
        )
