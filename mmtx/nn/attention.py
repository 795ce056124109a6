"""Multi-head attention: the one attention implementation every mmtx model uses.

Self-attention projects queries, keys and values with one fused matmul; cross-attention projects
queries from ``x`` and keys/values (fused) from ``context``. Both run through
``F.scaled_dot_product_attention`` so the fastest available kernel (flash, memory-efficient, or the
CPU math path) is picked by PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.nn.rotary import apply_rotary


class KVCache:
    """Keys and values of one attention layer, kept between decoding steps.

    Self-attention appends each step's keys/values into a buffer preallocated for ``max_length``
    positions (no reallocation per step). Cross-attention stores the context's keys/values once
    (``static``) and reuses them for every step: they depend on the image only. Queries with
    ``g`` times as many rows as the stored context (the beams of each image) share its rows:
    :class:`Attention` groups them by shape, so beam search never copies a static cache.
    """

    def __init__(self, max_length: int | None = None, static: bool = False) -> None:
        self.max_length = max_length
        self.static = static
        self.k: Tensor | None = None  # (B, H, max_length, Dh) buffer, or (B, H, S, Dh) if static
        self.v: Tensor | None = None
        self.length = 0
        self._spare: tuple[Tensor, Tensor] | None = None  # second buffer that reorder() fills

    @property
    def ready(self) -> bool:
        return self.k is not None

    def store(self, k: Tensor, v: Tensor) -> None:
        """Keep a context's keys/values (cross-attention)."""
        self.k, self.v, self.length = k, v, k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``t`` new positions; return the keys/values of all positions so far."""
        start, end = self.length, self.length + k.shape[2]
        if self.max_length is None:  # unbounded: grow by concatenation
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        else:
            if end > self.max_length:
                raise ValueError(f"KV cache overflow: {end} positions > max_length={self.max_length}")
            if self.k is None:
                shape = (k.shape[0], k.shape[1], self.max_length, k.shape[3])
                self.k = k.new_empty(shape)
                self.v = v.new_empty(shape)
            self.k[:, :, start:end] = k
            self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving beams' histories).

        Only the filled positions move, gathered into a second buffer of the same size that then
        becomes the cache (the old one is kept as the next spare): one copy, no allocation.
        """
        if self.k is None or self.static:
            return
        if self.max_length is None or (torch.is_grad_enabled() and self.k.requires_grad):
            self.k = self.k.index_select(0, index)  # differentiable (out= is not)
            self.v = self.v.index_select(0, index)
            return
        if self._spare is None or self._spare[0].shape != self.k.shape or self._spare[0].dtype != self.k.dtype:
            self._spare = (torch.empty_like(self.k), torch.empty_like(self.v))
        k, v = self._spare
        n = self.length
        torch.index_select(self.k[:, :, :n], 0, index, out=k[:, :, :n])
        torch.index_select(self.v[:, :, :n], 0, index, out=v[:, :, :n])
        self._spare = (self.k, self.v)
        self.k, self.v = k, v

    def repeat_interleave(self, repeats: int) -> None:
        """Give every batch row ``repeats`` copies (one per beam) of its history."""
        if self.static:
            raise ValueError("a static (cross-attention) cache is shared by its rows' beams, never copied")
        if self.k is None:
            return
        self.k = self.k.repeat_interleave(repeats, dim=0)
        self.v = self.v.repeat_interleave(repeats, dim=0)
        self._spare = None


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention``; on the CPU, bf16/fp16 attention that will be
    back-propagated through is computed in fp32.

    PyTorch's CPU attention kernels are fast in bf16 going forward but slow going backward, so
    a bf16 training step of the small CPU models is faster with its attention in fp32 (docs/cpu.md
    has the figures and the command); forward-only attention (inference,
    generation) stays in bf16. The upcast only adds precision; the result has the inputs' dtype.
    """
    if (
        q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        with torch.autocast("cpu", enabled=False):  # autocast would cast the inputs back down
            y = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
            )
        return y.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


def build_attn_mask(
    key_padding_mask: Tensor | None, causal: bool, q_len: int, k_len: int, device: torch.device
) -> Tensor | None:
    """Boolean mask for SDPA (True = may attend), broadcastable to (B, H, q_len, k_len).

    Queries are the last ``q_len`` of ``k_len`` positions (the usual case with a KV cache), so the
    causal part is aligned to the bottom-right.
    """
    mask = None
    if causal and q_len > 1:
        q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        mask = torch.arange(k_len, device=device)[None, :] <= q_pos  # (q_len, k_len)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :].bool()  # (B, 1, 1, k_len)
        mask = pad if mask is None else pad & mask
    return mask


def head_width(dim: int, num_heads: int) -> int:
    """``dim // num_heads``, refusing a width the heads do not divide (with the widths allowed)."""
    if dim % num_heads:
        lower = dim - dim % num_heads
        example = f"{lower} or {lower + num_heads}" if lower else str(num_heads)
        raise ArgumentError(
            "{dim} is not divisible by {num_heads} (allowed: a multiple of {num_heads!v}, e.g. {example!v})",
            dim=dim,
            num_heads=num_heads,
            example=example,
        )
    return dim // num_heads


class Attention(nn.Module):
    """Multi-head scaled dot-product attention, self or cross.

    Args:
        dim: width of the queries' stream (and of the output).
        num_heads: number of heads; ``dim`` must be divisible by it.
        context_dim: width of the keys/values' stream for cross-attention; ``None`` makes this a
            self-attention layer with a fused QKV projection.
        qkv_bias: bias on the input projections.
        attn_dropout: dropout on the attention weights (training only).
        proj_dropout: dropout after the output projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        context_dim: int | None = None,
        qkv_bias: bool = True,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_width(dim, num_heads)
        self.is_cross = context_dim is not None
        if self.is_cross:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(context_dim, 2 * dim, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.attn_dropout = attn_dropout
        self.proj_dropout = nn.Dropout(proj_dropout)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        """(B, T, n*D) -> (n, B, H, T, Dh): the n projections' heads, one per index of dim 0."""
        B, T, _ = x.shape
        return x.view(B, T, n, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        context_index: Tensor | None = None,
        head_mask: Tensor | None = None,
    ) -> Tensor:
        """Attend from ``x`` (B, T, dim) to itself or to ``context`` (B, S, context_dim).

        ``key_padding_mask`` (B, S) is True on real keys. ``rope`` is (cos, sin) for the query
        positions (self-attention only). ``head_mask`` (H, T, S), True where a head's query may
        read a key, narrows what each head reads (self-attention without a cache only). With a
        ``cache``, ``x`` holds only the new positions.
        ``context_index`` (B,): row i of ``x`` reads row ``context_index[i]`` of a ``context`` of
        fewer rows (the questions of a batch reading their images), whose keys and values are
        then projected once per context row (``key_padding_mask`` stays one row per row of ``x``;
        not with a ``cache``, whose rows ``b*g .. b*g+g-1`` share context row ``b`` instead).
        """
        if context_index is not None and (cache is not None or not self.is_cross):
            raise ValueError("context_index is for cross-attention without a cache")
        if head_mask is not None and (cache is not None or self.is_cross):
            raise ValueError("head_mask is for self-attention without a cache")
        if self.is_cross:
            return self._cross(x, context, key_padding_mask, cache, context_index)
        q, k, v = self._heads(self.qkv(x), 3).unbind(0)  # (B, H, T, Dh) each
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if cache is not None:
            k, v = cache.append(k, v)
        T, S = q.shape[2], k.shape[2]
        # the causal flag alone is exact (and fastest) when queries and keys are aligned
        is_causal = causal and key_padding_mask is None and head_mask is None and S == T and T > 1
        mask = None if is_causal else build_attn_mask(key_padding_mask, causal, T, S, x.device)
        if head_mask is not None:
            mask = head_mask if mask is None else mask & head_mask
        return self._attend(q, k, v, mask, is_causal, x.shape)

    def _cross(
        self,
        x: Tensor,
        context: Tensor | None,
        key_padding_mask: Tensor | None,
        cache: KVCache | None,
        context_index: Tensor | None,
    ) -> Tensor:
        """Cross-attention (see `forward`): keys and values from ``context`` or a filled ``cache``."""
        if context is None and (cache is None or not cache.ready):
            raise ValueError("cross-attention needs a context (or a filled cache)")
        if cache is not None and cache.ready:
            k, v = cache.k, cache.v  # computed once per image
        elif cache is not None:
            # kept contiguous, (2, B, H, S, Dh) in one copy: every later decoding step reads
            # them whole, and strided rows would slow each of those reads
            k, v = self._heads(self.kv(context), 2).contiguous().unbind(0)
            cache.store(k, v)
        else:
            kv = self.kv(context)  # (Bc, S, 2*dim): projected once per context row
            if context_index is not None:
                # one contiguous gather of keys and values together: its backward is one
                # index_add over the projections, not an index_put per head view
                kv = kv.index_select(0, context_index)
            k, v = self._heads(kv, 2).unbind(0)
        groups = x.shape[0] // k.shape[0]
        if groups > 1:  # rows b*g .. b*g+g-1 share context row b: one query sequence per context
            return self._grouped_cross(x, k, v, groups, key_padding_mask)
        q = self._heads(self.q(x), 1)[0]
        mask = build_attn_mask(key_padding_mask, False, x.shape[1], k.shape[2], x.device)
        return self._attend(q, k, v, mask, False, x.shape)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, shape: torch.Size
    ) -> Tensor:
        """The heads' attention (B, H, T, Dh), joined and projected to ``shape`` (B, T, dim)."""
        dropout = self.attn_dropout if self.training else 0.0
        y = sdpa(q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout)  # (B, H, T, Dh)
        return self.proj_dropout(self.proj(y.transpose(1, 2).reshape(shape)))

    def _grouped_cross(self, x: Tensor, k: Tensor, v: Tensor, groups: int, key_padding_mask: Tensor | None) -> Tensor:
        """Cross-attention of ``x`` (B*g, T, dim) to keys/values of B contexts, where every g
        consecutive rows of ``x`` read the same context (the beams of one image).

        The g rows' queries are laid side by side as one sequence of g*T queries per context, so
        the keys/values are read once per context instead of being copied g times. Each query's
        result is the same as with repeated keys/values.
        """
        B, T, _ = x.shape
        Bk = k.shape[0]
        if B != Bk * groups:
            raise ValueError(f"{B} query rows do not divide into groups of {Bk} context rows")
        q = self.q(x).view(Bk, groups * T, self.num_heads, self.head_dim).transpose(1, 2)  # (Bk, H, gT, Dh)
        if key_padding_mask is not None and key_padding_mask.shape[0] == B:
            key_padding_mask = key_padding_mask[::groups]  # the same context mask for each group
        mask = build_attn_mask(key_padding_mask, False, groups * T, k.shape[2], x.device)
        return self._attend(q, k, v, mask, False, x.shape)  # (Bk, H, gT, Dh) read as (B, T, dim)
