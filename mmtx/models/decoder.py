"""Causal text decoder that reads image tokens through cross-attention, with an LM head."""

from __future__ import annotations

from torch import Tensor, nn

from mmtx.models.text import TextTransformer
from mmtx.nn.blocks import BlockCache
from mmtx.nn.embeddings import PositionKind
from mmtx.nn.init import init_weights


class CaptionDecoder(nn.Module):
    """A causal :class:`TextTransformer` with cross-attention to ``context`` and a vocabulary head.

    Args:
        vocab_size: output vocabulary (the tokenizer's size).
        context_dim: width of the image tokens it attends to (the encoder's ``dim``).
        tie_embeddings: share the LM head's weight with the token embedding (Press & Wolf 2017).
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
    ) -> None:
        super().__init__()
        self.body = TextTransformer(
            vocab_size, dim, depth, num_heads, mlp_ratio, max_length, pos_embed, causal=True,
            context_dim=context_dim, qkv_bias=qkv_bias, dropout=dropout, attn_dropout=attn_dropout,
            norm_eps=norm_eps, pad_id=pad_id,
        )
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        init_weights(self.lm_head)
        if tie_embeddings:
            self.lm_head.weight = self.body.token_embed.weight

    @property
    def max_length(self) -> int:
        return self.body.max_length

    def new_cache(self, max_length: int | None = None) -> list[BlockCache]:
        return self.body.new_cache(max_length)

    def forward(
        self,
        input_ids: Tensor,
        context: Tensor | None,
        *,
        context_mask: Tensor | None = None,
        cache: list[BlockCache] | None = None,
    ) -> Tensor:
        """``input_ids`` (B, T), ``context`` (B, S, context_dim) -> logits (B, T, vocab_size)."""
        h = self.body(input_ids, context, context_mask=context_mask, cache=cache)
        return self.lm_head(h)
