"""ViLBERT-style two-stream vision-and-language model (Lu et al. 2019) on raw image patches.

The vision stream (ViT blocks) and the text stream (text-encoder blocks) first run on their own;
then co-attention layers let each stream read the other. ``h_IMG`` (the vision CLS output) and
``h_CLS`` (the first text token's output) are pooled into a joint space whose element-wise
product feeds the alignment and answer heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.models.text import TextEncoder
from mmtx.models.vit import VisionEncoder
from mmtx.nn.blocks import CoAttentionLayer
from mmtx.nn.init import init_weights


@dataclass
class Unimodal:
    """Each stream after its own blocks, before any co-attention."""

    vision: Tensor  # (B, 1 + N, Dv), or (U, 1 + N, Dv) with an image_index
    text: Tensor  # (B, T, Dt)
    text_mask: Tensor  # (B, T), True on real tokens
    vision_rope: tuple[Tensor, Tensor] | None = None
    text_rope: tuple[Tensor, Tensor] | None = None
    image_index: Tensor | None = None  # (B,): the row of ``vision`` (U, 1 + N, Dv) each text is about

    def select_text(self, index: Tensor) -> Unimodal:
        """Pair each image with the text of row ``index[i]`` (texts do not depend on images yet)."""
        if self.image_index is not None:
            raise ValueError(
                "select_text pairs texts with images row by row: give each text its image (no image_index)"
            )
        return Unimodal(self.vision, self.text[index], self.text_mask[index], self.vision_rope, self.text_rope)


@dataclass
class Joint:
    """Both streams after co-attention and the final norms, and their pooled product."""

    vision: Tensor  # (B, 1 + N, Dv), or (U, 1 + N, Dv) with an image_index
    text: Tensor  # (B, T, Dt)
    pooled: Tensor | None  # (B, joint_dim): pool(h_IMG) * pool(h_CLS); None without a pooler
    image_pooled: Tensor | None  # (B, joint_dim): pool(h_IMG)
    text_pooled: Tensor | None  # (B, joint_dim): pool(h_CLS)
    image_index: Tensor | None = None  # (B,): the row of ``vision`` each text is about

    def per_text(self, image_tokens: Tensor) -> Tensor:
        """``image_tokens`` (or anything computed per row of ``vision``) for each text: (B, ...)."""
        return image_tokens if self.image_index is None else image_tokens[self.image_index]


class TwoStreamModel(nn.Module):
    """Vision and text towers joined by ``co_layers`` co-attention layers.

    Args:
        vision: the image stream (its patch embedding, positions and blocks are used; its final
            norm is applied after the co-attention layers).
        text: the text stream, likewise. The co-attention layers place their norms as each
            stream does (pre-norm ViT, post-norm BERT).
        co_layers: number of co-attention layers (ViLBERT: 6 in the base model).
        joint_dim: width of the pooled joint representation.
        vision_reads_text: False keeps only the text half of each co-attention layer (the
            question reads the image; the image tokens do not depend on the question), so the
            vision work is done once per image however many questions it has.
        pooler: build the pooling layers of ``Joint.pooled`` (the head on top decides: a head
            that reads the tokens leaves them out, since data-parallel training refuses
            parameters no loss uses).
        patch_masking: build the mask token that replaces masked patches (masked patch
            modelling only), likewise.
    """

    def __init__(
        self,
        vision: VisionEncoder,
        text: TextEncoder,
        co_layers: int = 2,
        joint_dim: int = 256,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        vision_reads_text: bool = True,
        pooler: bool = True,
        patch_masking: bool = True,
    ) -> None:
        super().__init__()
        if co_layers < 0:
            raise ArgumentError("{co_layers} must be >= 0", co_layers=co_layers)
        self.vision, self.text, self.vision_reads_text = vision, text, vision_reads_text
        self.pooler, self.patch_masking, self._joint_dim = pooler, patch_masking, joint_dim
        self.co_layers = nn.ModuleList(
            CoAttentionLayer(
                vision.dim,
                text.dim,
                vision.num_heads,
                text.num_heads,
                mlp_ratio,
                dropout=dropout,
                vision_norm_first=vision.norm_first,
                text_norm_first=text.norm_first,
                vision_reads_text=vision_reads_text,
            )
            for _ in range(co_layers)
        )
        self.vision_pool = self.text_pool = self.mask_token = None
        if pooler:  # ViLBERT pools h_IMG and h_CLS with a linear layer + activation into one space
            self.vision_pool = nn.Sequential(nn.Linear(vision.dim, joint_dim), nn.ReLU())
            self.text_pool = nn.Sequential(nn.Linear(text.dim, joint_dim), nn.ReLU())
        if patch_masking:
            self.mask_token = nn.Parameter(torch.zeros(vision.dim))  # replaces masked patches
        for module in (self.co_layers, self.vision_pool, self.text_pool):
            if module is not None:
                module.apply(init_weights)
        if patch_masking:
            nn.init.normal_(self.mask_token, std=0.02)

    @property
    def joint_dim(self) -> int:
        return self._joint_dim

    def encode_vision(
        self, images: Tensor, masked_patches: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """The vision stream's own blocks (B, 1 + N, Dv); ``masked_patches`` (B, N) get the mask token."""
        if masked_patches is not None and self.mask_token is None:
            raise ValueError("masked_patches: this model was built without a mask token (patch_masking=False)")
        v, rope = self.vision.embed(images, masked_patches, self.mask_token)
        head_mask = self.vision.head_mask(self.vision.patch_embed.grid(*images.shape[-2:]), v.device)
        for block in self.vision.blocks:
            v = block(v, rope=rope, head_mask=head_mask)
        return v, rope

    def encode_text(self, input_ids: Tensor, text_mask: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """The text stream's own blocks (B, T, Dt)."""
        t, rope = self.text.embed(input_ids)
        for block in self.text.blocks:
            t = block(t, mask=text_mask, rope=rope)
        return t, rope

    def unimodal(
        self,
        images: Tensor,
        input_ids: Tensor,
        text_mask: Tensor,
        masked_patches: Tensor | None = None,
        image_index: Tensor | None = None,
    ) -> Unimodal:
        """Run each stream's own blocks. ``image_index`` (B,), if given, says which row of
        ``images`` (U, 3, H, W) holds each text's image: texts about the same image share one pass
        of the vision stream (without it, text i is about image i). ``masked_patches`` (U, N): one
        row per image."""
        v, v_rope = self.encode_vision(images, masked_patches)
        t, t_rope = self.encode_text(input_ids, text_mask)
        return Unimodal(v, t, text_mask, v_rope, t_rope, image_index)

    def fuse(self, u: Unimodal) -> Joint:
        """Exchange information through the co-attention layers; pool h_IMG and h_CLS. Image
        tokens that do not read the text stay one row per image (`Unimodal.image_index`)."""
        v, t, index = u.vision, u.text, u.image_index
        if index is not None and self.vision_reads_text and self.co_layers:
            v, index = v[index], None  # the image tokens will depend on the text: one copy per text
        for layer in self.co_layers:
            v, t = layer(v, t, u.text_mask, u.vision_rope, u.text_rope, image_index=index)
        v, t = self.vision.norm(v), self.text.norm(t)
        if not self.pooler:
            return Joint(v, t, None, None, None, index)
        image_pooled, text_pooled = self.vision_pool(v[:, 0]), self.text_pool(t[:, 0])
        if index is not None:
            image_pooled = image_pooled[index]
        return Joint(v, t, image_pooled * text_pooled, image_pooled, text_pooled, index)

    def forward(self, images: Tensor, input_ids: Tensor, text_mask: Tensor, image_index: Tensor | None = None) -> Joint:
        """``images`` (B, 3, H, W), or (U, 3, H, W) with an ``image_index`` (see :meth:`unimodal`),
        ``input_ids``/``text_mask`` (B, T) -> :class:`Joint`."""
        return self.fuse(self.unimodal(images, input_ids, text_mask, image_index=image_index))
