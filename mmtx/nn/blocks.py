"""The MLP and the residual blocks that every tower stacks: pre-norm by default, post-norm as an
option; self-attention with optional cross-attention, or cross-attention alone (co-attention)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.nn.attention import Attention, KVCache
from mmtx.nn.where_attention import WhereCrossAttention

# MLP activations by name: GELU (erf, as in ViT and BERT), its tanh approximation (GPT-2's
# "gelu_new"), ReLU
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
}


def activation_layer(name: str) -> nn.Module:
    """The activation module called ``name`` (a key of :data:`ACTIVATIONS`)."""
    if name not in ACTIVATIONS:
        raise ArgumentError(f"{{activation!r}} is not one of {', '.join(ACTIVATIONS)}", activation=name)
    return ACTIVATIONS[name]()


class Mlp(nn.Module):
    """Position-wise feed-forward network: Linear -> activation (GELU by default) -> Linear."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0, activation: str = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = activation_layer(activation)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class PreNorm(nn.LayerNorm):
    """A LayerNorm in front of its sub-layer: ``x + f(LN(x))`` (ViT, GPT-2)."""

    def residual(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + sublayer(self(x))


class PostNorm(nn.LayerNorm):
    """A LayerNorm after the residual sum: ``LN(x + f(x))`` (BERT, the original transformer)."""

    def residual(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self(x + sublayer(x))


def residual_norm(norm_first: bool) -> type[PreNorm] | type[PostNorm]:
    """The norm that places each sub-layer's residual: `PreNorm` or `PostNorm`."""
    return PreNorm if norm_first else PostNorm


@dataclass
class BlockCache:
    """Decoding state of one block: growing self-attention K/V, fixed cross-attention K/V."""

    self_kv: KVCache
    cross_kv: KVCache = field(default_factory=lambda: KVCache(static=True))


class TransformerBlock(nn.Module):
    """Residual block: self-attention, optional cross-attention, MLP, each with a LayerNorm.

    Pre-norm (default; ViT, GPT-2): ``x = x + f(LN(x))`` for each sub-layer ``f``.
    Post-norm (``norm_first=False``; BERT, the original transformer): ``x = LN(x + f(x))``.
    The norms place the residuals (`PreNorm`, `PostNorm`), chosen once here.

    Args:
        dim: width of the stream.
        num_heads: attention heads (self and cross).
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        context_dim: width of the stream that cross-attention reads; ``None`` means no
            cross-attention (an encoder block).
        dropout: dropout on each residual branch; ``attn_dropout`` on the attention weights.
        norm_eps: LayerNorm epsilon (1e-6 as in ViT, 1e-12 as in BERT, 1e-5 as in GPT-2).
        norm_first: pre-norm (True) or post-norm (False) residuals.
        activation: the MLP's activation (see :data:`ACTIVATIONS`).
        read_where: the cross-attention also returns where each head read, for a context of a
            CLS token and a square grid of patches (`WhereCrossAttention`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        context_dim: int | None = None,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_eps: float = 1e-6,
        norm_first: bool = True,
        activation: str = "gelu",
        read_where: bool = False,
    ) -> None:
        super().__init__()
        Norm = residual_norm(norm_first)
        attn_kw = dict(qkv_bias=qkv_bias, attn_dropout=attn_dropout, proj_dropout=dropout)
        self.norm1 = Norm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, **attn_kw)
        cross = context_dim is not None
        if read_where and not cross:
            raise ValueError("read_where is an option of cross-attention: give the block a context_dim")
        CrossAttention = WhereCrossAttention if read_where else Attention
        self.norm_cross = Norm(dim, eps=norm_eps) if cross else None
        self.cross_attn = CrossAttention(dim, num_heads, context_dim=context_dim, **attn_kw) if cross else None
        self.norm2 = Norm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout, activation)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        context_mask: Tensor | None = None,
        context_index: Tensor | None = None,
        causal: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        cache: BlockCache | None = None,
        head_mask: Tensor | None = None,
    ) -> Tensor:
        """``x`` (B, T, dim); ``mask`` (B, T) and ``context_mask`` (B, S) are True on real tokens;
        ``context_index`` and ``head_mask`` (what each self-attention head reads): see
        `Attention.forward`."""
        self_kv = cache.self_kv if cache is not None else None
        x = self.norm1.residual(
            x,
            lambda h: self.attn(h, key_padding_mask=mask, causal=causal, rope=rope, cache=self_kv, head_mask=head_mask),
        )
        if self.cross_attn is not None:
            cross_kv = cache.cross_kv if cache is not None else None
            x = self.norm_cross.residual(
                x,
                lambda h: self.cross_attn(
                    h, context, key_padding_mask=context_mask, cache=cross_kv, context_index=context_index
                ),
            )
        return self.norm2.residual(x, self.mlp)


class CrossAttentionBlock(nn.Module):
    """Residual block of cross-attention and MLP, without self-attention: one stream's half of a
    ViLBERT co-attention layer (its queries read the other stream). Arguments as `TransformerBlock`'s."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        context_dim: int,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_eps: float = 1e-6,
        norm_first: bool = True,
        activation: str = "gelu",
    ) -> None:
        super().__init__()
        Norm = residual_norm(norm_first)
        self.norm_cross = Norm(dim, eps=norm_eps)
        self.cross_attn = Attention(
            dim, num_heads, context_dim=context_dim, qkv_bias=qkv_bias, attn_dropout=attn_dropout, proj_dropout=dropout
        )
        self.norm2 = Norm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout, activation)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        *,
        context_mask: Tensor | None = None,
        context_index: Tensor | None = None,
    ) -> Tensor:
        """``x`` (B, T, dim) reads ``context`` (B, S, context_dim); ``context_mask`` (B, S) is True
        on real tokens; ``context_index``: see `Attention.forward`."""
        x = self.norm_cross.residual(
            x, lambda h: self.cross_attn(h, context, key_padding_mask=context_mask, context_index=context_index)
        )
        return self.norm2.residual(x, self.mlp)


# the residual blocks that every tower stacks: what sharding, activation checkpointing and
# compilation treat as one unit each
BLOCKS = (TransformerBlock, CrossAttentionBlock)


class CoAttentionLayer(nn.Module):
    """ViLBERT's co-attentional layer (Lu et al. 2019, fig. 2b) followed by each stream's own block.

    Each stream's queries attend to the *other* stream's keys/values (both reading the other's
    input, so the exchange is simultaneous), the result is added to its own residual and passed
    through its own MLP; then each stream runs a regular self-attention block. The two streams
    may have different widths and head counts, and each stream's blocks place their norms as
    that stream does (``vision_norm_first``/``text_norm_first``: a post-norm BERT text stream
    gets post-norm blocks, whose outputs need no final norm). ``vision_reads_text=False`` keeps
    only the text half: the text reads the image, the image tokens pass unchanged (so they stay
    the same for every question about an image).
    """

    def __init__(
        self,
        vision_dim: int,
        text_dim: int,
        vision_heads: int,
        text_heads: int,
        mlp_ratio: float = 4.0,
        *,
        vision_norm_first: bool = True,
        text_norm_first: bool = True,
        vision_reads_text: bool = True,
        **block_kwargs,
    ) -> None:
        super().__init__()
        v_kw = dict(mlp_ratio=mlp_ratio, norm_first=vision_norm_first, **block_kwargs)
        t_kw = dict(mlp_ratio=mlp_ratio, norm_first=text_norm_first, **block_kwargs)
        if vision_reads_text:
            self.vision_cross = CrossAttentionBlock(vision_dim, vision_heads, context_dim=text_dim, **v_kw)
            self.vision_self = TransformerBlock(vision_dim, vision_heads, **v_kw)
        else:
            self.vision_cross = self.vision_self = None
        self.text_cross = CrossAttentionBlock(text_dim, text_heads, context_dim=vision_dim, **t_kw)
        self.text_self = TransformerBlock(text_dim, text_heads, **t_kw)

    def forward(
        self,
        vision: Tensor,
        text: Tensor,
        text_mask: Tensor | None = None,
        vision_rope: tuple[Tensor, Tensor] | None = None,
        text_rope: tuple[Tensor, Tensor] | None = None,
        image_index: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``vision`` (B, N, Dv), ``text`` (B, T, Dt), ``text_mask`` (B, T) True on real tokens.
        Without ``vision_reads_text``, ``vision`` may hold fewer rows (U, N, Dv), text ``i`` reading
        row ``image_index[i]`` (B,): each image's keys and values projected once."""
        if image_index is not None and self.vision_cross is not None:
            raise ValueError(
                "image_index: the image tokens read the text (vision_reads_text), so each text needs its own"
            )
        t = self.text_self(self.text_cross(text, vision, context_index=image_index), mask=text_mask, rope=text_rope)
        if self.vision_cross is None:
            return vision, t
        v = self.vision_cross(vision, text, context_mask=text_mask)
        return self.vision_self(v, rope=vision_rope), t
