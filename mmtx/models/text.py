"""Text towers: token embedding + positions + blocks, bidirectional or causal."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmtx.nn.attention import KVCache, head_width
from mmtx.nn.blocks import BlockCache, TransformerBlock
from mmtx.nn.embeddings import PositionKind, check_position_kind, check_sinusoidal_width, sinusoidal_1d
from mmtx.nn.init import init_weights
from mmtx.nn.rotary import Rotary


def mean_of_tokens(x: Tensor, mask: Tensor) -> Tensor:
    """The mean (B, D) of each text's real tokens ``x`` (B, T, D), ``mask`` (B, T) True on them."""
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(1) / weights.sum(1).clamp(min=1)


class TextTransformer(nn.Module):
    """Embeds token ids and runs them through transformer blocks (pre-norm by default).

    ``causal=True`` with a ``context_dim`` gives a decoder body (masked self-attention plus
    cross-attention to, e.g., image tokens); the defaults give a bidirectional encoder.

    Args:
        vocab_size: number of token ids.
        max_length: longest sequence (size of the learned position table; KV cache length).
        pos_embed: ``learned`` (BERT/GPT-2), ``sinusoidal`` (Vaswani et al.) or ``rope``.
        pad_id: id whose embedding is kept at zero.
        norm_first: pre-norm blocks and a final norm (GPT-2); False: post-norm blocks and no
            final norm (BERT).
        activation: the MLP activation (``gelu``; ``gelu_tanh`` for GPT-2).
        type_vocab_size: > 0 adds BERT's token-type (segment) embeddings; type 0 unless given.
        embed_norm: a LayerNorm on the summed embeddings (BERT).
        read_where: cross-attention also returns where each head read in the image
            (`mmtx.nn.where_attention.WhereCrossAttention`); needs a ``context_dim``.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 512,
        depth: int = 6,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        max_length: int = 64,
        pos_embed: PositionKind = "learned",
        causal: bool = False,
        context_dim: int | None = None,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_eps: float = 1e-6,
        pad_id: int | None = 0,
        norm_first: bool = True,
        activation: str = "gelu",
        type_vocab_size: int = 0,
        embed_norm: bool = False,
        read_where: bool = False,
    ) -> None:
        super().__init__()
        self.pos_kind = check_position_kind(pos_embed)
        head_dim = head_width(dim, num_heads)
        if pos_embed == "sinusoidal":
            check_sinusoidal_width(dim, axes=1)
        self.dim, self.num_heads, self.max_length, self.causal = dim, num_heads, max_length, causal
        self.context_dim = context_dim  # the width of what cross-attention reads (None: none)
        self.norm_first = norm_first
        self.token_embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.pos_embed = nn.Embedding(max_length, dim) if pos_embed == "learned" else None
        self.type_embed = nn.Embedding(type_vocab_size, dim) if type_vocab_size > 0 else None
        self.embed_norm = nn.LayerNorm(dim, eps=norm_eps) if embed_norm else None
        self.rotary = Rotary(head_dim) if pos_embed == "rope" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim,
                num_heads,
                mlp_ratio,
                context_dim=context_dim,
                qkv_bias=qkv_bias,
                dropout=dropout,
                attn_dropout=attn_dropout,
                norm_eps=norm_eps,
                norm_first=norm_first,
                activation=activation,
                read_where=read_where,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if norm_first else nn.Identity()
        self.apply(init_weights)

    @property
    def vocab_size(self) -> int:
        return self.token_embed.num_embeddings

    @property
    def pad_id(self) -> int | None:
        return self.token_embed.padding_idx

    def new_cache(self, max_length: int | None = None) -> list[BlockCache]:
        """Empty per-block decoding state for up to ``max_length`` tokens."""
        return [BlockCache(KVCache(max_length or self.max_length)) for _ in self.blocks]

    def embed(
        self, input_ids: Tensor, start: int = 0, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Token embeddings plus positions ``start..start+T`` (B, T, dim), and rotary tables if any.

        With token-type embeddings, ``token_type_ids`` (B, T) picks each token's type (default 0).
        """
        T = input_ids.shape[1]
        if start + T > self.max_length:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_length={self.max_length}")
        positions = torch.arange(start, start + T, device=input_ids.device)
        x = self.token_embed(input_ids)
        if self.type_embed is not None:
            x = x + (self.type_embed.weight[0] if token_type_ids is None else self.type_embed(token_type_ids))
        rope = None
        if self.pos_kind == "learned":
            x = x + self.pos_embed(positions)
        elif self.pos_kind == "sinusoidal":
            x = x + sinusoidal_1d(positions, self.dim).to(x.dtype)
        else:
            rope = self.rotary(positions)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.drop(x), rope

    def forward(
        self,
        input_ids: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        context_mask: Tensor | None = None,
        context_index: Tensor | None = None,
        cache: list[BlockCache] | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """``input_ids`` (B, T) -> hidden states (B, T, dim) after the final norm.

        ``mask`` (B, T) is True on real tokens; with a ``cache``, ``input_ids`` are only the new
        tokens and their positions continue from the cached length. ``context_index`` (B,): row i
        reads row ``context_index[i]`` of a ``context`` of fewer rows (`Attention.forward`).
        """
        start = cache[0].self_kv.length if cache else 0
        x, rope = self.embed(input_ids, start, token_type_ids)
        if self.causal:
            # Right padding: causality already keeps real tokens from seeing the pads after them,
            # so the padding mask is redundant and dropping it keeps the fused causal kernel.
            mask = None
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                context,
                mask=mask,
                context_mask=context_mask,
                context_index=context_index,
                causal=self.causal,
                rope=rope,
                cache=cache[i] if cache is not None else None,
            )
        return self.norm(x)


class TextEncoder(TextTransformer):
    """Bidirectional text encoder (BERT-style): every token sees every real token."""

    def __init__(self, vocab_size: int, **kwargs) -> None:
        super().__init__(vocab_size, causal=False, **kwargs)
