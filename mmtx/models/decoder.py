"""Causal text decoder that reads image tokens through cross-attention, with an LM head."""

from __future__ import annotations

from torch import Tensor, nn

from mmtx.models.text import TextTransformer
from mmtx.nn.blocks import BlockCache, activation_layer
from mmtx.nn.embeddings import PositionKind
from mmtx.nn.init import init_weights


class CaptionDecoder(nn.Module):
    """A causal :class:`TextTransformer` with cross-attention to ``context`` and a vocabulary head.

    Args:
        vocab_size: output vocabulary (the tokenizer's size).
        context_dim: width of the image tokens it attends to (the encoder's ``dim``).
        tie_embeddings: share the LM head's weight with the token embedding (Press & Wolf 2017).
        norm_first, activation, type_vocab_size, embed_norm: the body's options (see
            :class:`TextTransformer`); BERT decoders are post-norm with type embeddings and an
            embedding norm, GPT-2 uses ``activation="gelu_tanh"``.
        head_transform: BERT's prediction head: Linear -> activation -> LayerNorm before the
            vocabulary projection.
        head_bias: a bias on the vocabulary projection (BERT).
        read_where: each cross-attention head also returns the mean place (x, y) of the image
            tokens it read (`mmtx.nn.where_attention.WhereCrossAttention`), so a word can follow
            where the shape it names stands; the image tokens must be a CLS token and a square
            grid of patches, as mmtx's ViT gives.
    """

    def __init__(
        self,
        vocab_size: int,
        context_dim: int,
        dim: int = 512,
        depth: int = 6,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        max_length: int = 64,
        pos_embed: PositionKind = "learned",
        tie_embeddings: bool = True,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_eps: float = 1e-6,
        pad_id: int | None = 0,
        norm_first: bool = True,
        activation: str = "gelu",
        type_vocab_size: int = 0,
        embed_norm: bool = False,
        head_transform: bool = False,
        head_bias: bool = False,
        read_where: bool = False,
    ) -> None:
        super().__init__()
        self.body = TextTransformer(
            vocab_size,
            dim,
            depth,
            num_heads,
            mlp_ratio,
            max_length,
            pos_embed,
            causal=True,
            context_dim=context_dim,
            qkv_bias=qkv_bias,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_eps=norm_eps,
            pad_id=pad_id,
            norm_first=norm_first,
            activation=activation,
            type_vocab_size=type_vocab_size,
            embed_norm=embed_norm,
            read_where=read_where,
        )
        self.head_transform = (
            nn.Sequential(nn.Linear(dim, dim), activation_layer(activation), nn.LayerNorm(dim, eps=norm_eps))
            if head_transform
            else None
        )
        self.lm_head = nn.Linear(dim, vocab_size, bias=head_bias)
        for head in (self.head_transform, self.lm_head):
            if head is not None:
                head.apply(init_weights)
        if tie_embeddings:
            self.lm_head.weight = self.body.token_embed.weight

    @property
    def max_length(self) -> int:
        return self.body.max_length

    @property
    def context_dim(self) -> int:
        return self.body.context_dim

    @property
    def vocab_size(self) -> int:
        return self.body.vocab_size

    @property
    def pad_id(self) -> int | None:
        return self.body.pad_id

    def new_cache(self, max_length: int | None = None) -> list[BlockCache]:
        return self.body.new_cache(max_length)

    def forward(
        self,
        input_ids: Tensor,
        context: Tensor | None,
        *,
        context_mask: Tensor | None = None,
        context_index: Tensor | None = None,
        cache: list[BlockCache] | None = None,
    ) -> Tensor:
        """``input_ids`` (B, T), ``context`` (B, S, context_dim) -> logits (B, T, vocab_size); with
        ``context_index`` (B,), ``context`` has a row per image and caption i reads row
        ``context_index[i]``."""
        h = self.body(input_ids, context, context_mask=context_mask, context_index=context_index, cache=cache)
        if self.head_transform is not None:
            h = self.head_transform(h)
        return self.lm_head(h)
