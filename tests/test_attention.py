"""The shared attention and block against a naive reference, masks, positions, the KV cache."""

import math

import pytest
import torch

from mmtx.nn import Attention, CrossAttentionBlock, KVCache, Rotary, TransformerBlock, apply_rotary, sinusoidal_1d
from mmtx.nn.attention import build_attn_mask


def naive_attention(attn: Attention, x, context=None, key_mask=None, causal=False, rope=None):
    """Softmax(QK^T / sqrt(d)) V written out by hand, from the module's own weights."""
    B, T, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    if attn.is_cross:
        q = x @ attn.q.weight.T + attn.q.bias
        k, v = (context @ attn.kv.weight.T + attn.kv.bias).split(C, dim=-1)
    else:
        q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split(C, dim=-1)
    q, k, v = (t.reshape(B, -1, H, D).transpose(1, 2) for t in (q, k, v))
    if rope is not None:
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, T, S)
    S = k.shape[2]
    allowed = torch.ones(B, 1, T, S, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(T, S).tril().bool()
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    y = scores.softmax(-1) @ v
    return y.transpose(1, 2).reshape(B, T, C) @ attn.proj.weight.T + attn.proj.bias


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_naive(causal):
    attn = Attention(32, 4).eval()
    x = torch.randn(2, 7, 32)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3]).bool()
    for key_mask in (None, mask):
        got = attn(x, key_padding_mask=key_mask, causal=causal)
        want = naive_attention(attn, x, key_mask=key_mask, causal=causal)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cross_attention_matches_naive_with_other_width():
    attn = Attention(32, 4, context_dim=24).eval()
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 9, 24)
    ctx_mask = torch.ones(2, 9, dtype=torch.bool)
    ctx_mask[1, 6:] = False
    torch.testing.assert_close(
        attn(x, ctx, key_padding_mask=ctx_mask),
        naive_attention(attn, x, ctx, key_mask=ctx_mask),
        atol=1e-5,
        rtol=1e-5,
    )


def test_rotary_attention_matches_naive():
    attn = Attention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    rope = Rotary(8)(torch.arange(6))
    torch.testing.assert_close(
        attn(x, causal=True, rope=rope),
        naive_attention(attn, x, causal=True, rope=rope),
        atol=1e-5,
        rtol=1e-5,
    )


def test_rotary_scores_depend_on_relative_position_only():
    rot = Rotary(16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        cq, sq = rot(torch.tensor([i]))
        ck, sk = rot(torch.tensor([j]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    torch.testing.assert_close(score(3, 1), score(10, 8))
    assert not torch.allclose(score(3, 1), score(3, 2))


def test_padding_does_not_leak():
    """Changing what sits at padded key positions must not change any output."""
    attn = Attention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]]).bool()
    y1 = attn(x, key_padding_mask=mask)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16) * 100
    y2 = attn(x2, key_padding_mask=mask)
    torch.testing.assert_close(y1[:, :4], y2[:, :4])


def test_incremental_self_attention_equals_full_causal():
    attn = Attention(32, 4).eval()
    x = torch.randn(3, 8, 32)
    full = attn(x, causal=True)
    cache = KVCache(max_length=8)
    first = attn(x[:, :3], causal=True, cache=cache)  # a 3-token prefill, then one at a time
    steps = [attn(x[:, t : t + 1], causal=True, cache=cache) for t in range(3, 8)]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 8


def test_cross_attention_cache_computes_context_once(monkeypatch):
    attn = Attention(16, 2, context_dim=16).eval()
    ctx = torch.randn(2, 5, 16)
    calls = []
    attn.kv.register_forward_hook(lambda *a: calls.append(1))
    cache = KVCache(static=True)
    outs = [attn(torch.randn(2, 1, 16), ctx, cache=cache) for _ in range(4)]
    assert len(calls) == 1 and all(o.shape == (2, 1, 16) for o in outs)


def test_cache_overflow_is_an_error():
    cache = KVCache(max_length=2)
    kv = torch.zeros(1, 1, 3, 4)
    with pytest.raises(ValueError, match="max_length=2"):
        cache.append(kv, kv)


def test_bottom_right_causal_mask():
    mask = build_attn_mask(None, True, q_len=2, k_len=4, device=torch.device("cpu"))
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_width_must_divide_heads():
    with pytest.raises(ValueError, match="num_heads=5"):
        Attention(32, 5)


def test_block_residual_structure_and_cross_attention():
    block = TransformerBlock(32, 4, context_dim=16).eval()
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 3, 16)
    y = block(x, ctx)
    assert y.shape == x.shape
    # the context matters, and a block without cross-attention has no such input
    assert not torch.allclose(y, block(x, torch.randn(2, 3, 16)))
    assert TransformerBlock(32, 4).cross_attn is None
    half = CrossAttentionBlock(32, 4, context_dim=16).eval()
    assert not hasattr(half, "attn") and half(x, ctx).shape == x.shape


@pytest.mark.parametrize("norm_first", [True, False])
def test_blocks_place_their_norms_as_the_formulas_say(norm_first: bool) -> None:
    """Pre-norm ``x + f(LN(x))`` and post-norm ``LN(x + f(x))``, for every sub-layer of the full
    block and of the cross-attention half (a co-attention layer's)."""
    torch.manual_seed(0)
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 3, 16)

    def residual(h, norm, f):
        return h + f(norm(h)) if norm_first else norm(h + f(h))

    block = TransformerBlock(32, 4, context_dim=16, norm_first=norm_first).eval()
    h = residual(x, block.norm1, block.attn)
    h = residual(h, block.norm_cross, lambda t: block.cross_attn(t, ctx))
    torch.testing.assert_close(block(x, ctx), residual(h, block.norm2, block.mlp))

    half = CrossAttentionBlock(32, 4, context_dim=16, norm_first=norm_first).eval()
    h = residual(x, half.norm_cross, lambda t: half.cross_attn(t, ctx))
    torch.testing.assert_close(half(x, ctx), residual(h, half.norm2, half.mlp))
    # the half keeps a full block's names: checkpoints of co-attention layers load unchanged
    assert set(half.state_dict()) == {k for k in block.state_dict() if not k.startswith(("norm1.", "attn."))}


def test_sinusoidal_matches_the_original_formula():
    pe = sinusoidal_1d(torch.arange(50), 16)
    pos, i = 17, 3
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-5)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-5)


def test_grouped_cross_attention_equals_copied_keys_values():
    """Beams share their image's cached keys/values (no copies) and get what copies would give."""
    attn = Attention(32, 4, context_dim=24).eval()
    B, g = 3, 4
    ctx = torch.randn(B, 7, 24)
    mask = torch.ones(B, 7, dtype=torch.bool)
    mask[1, 5:], mask[2, 3:] = False, False  # padded contexts (VQA questions)
    cache = KVCache(static=True)
    attn(torch.randn(B, 1, 32), ctx, key_padding_mask=mask, cache=cache)  # fills the cache once
    stored = cache.k
    with pytest.raises(ValueError, match="shared by its rows' beams"):
        cache.repeat_interleave(g)  # beams never copy an image's keys/values

    x = torch.randn(B * g, 2, 32)
    copied = attn(x, ctx.repeat_interleave(g, 0), key_padding_mask=mask.repeat_interleave(g, 0))
    torch.testing.assert_close(attn(x, key_padding_mask=mask, cache=cache), copied)
    assert cache.k is stored and cache.k.shape[0] == B  # nothing copied
    # a mask given per query row (B * g rows) reads the same
    torch.testing.assert_close(attn(x, key_padding_mask=mask.repeat_interleave(g, 0), cache=cache), copied)
    with pytest.raises(ValueError, match="do not divide"):
        attn(torch.randn(B * g + 1, 1, 32), cache=cache)


def test_reorder_moves_history_into_a_reused_buffer():
    """Beam reordering: the preallocated cache agrees with a plain concatenating one, and after
    the first reorder it only swaps between two buffers (no allocation per step)."""
    bounded, growing = KVCache(max_length=6), KVCache()
    steps = [torch.randn(3, 2, n, 4) for n in (3, 1, 1, 1)]
    buffers = set()
    for i, kv in enumerate(steps):
        k_b, v_b = bounded.append(kv, -kv)
        k_g, v_g = growing.append(kv, -kv)
        torch.testing.assert_close((k_b, v_b), (k_g, v_g), rtol=0, atol=0)
        index = torch.tensor([[2, 0, 0], [1, 2, 0], [0, 0, 1], [2, 1, 0]][i])
        bounded.reorder(index)
        growing.reorder(index)
        if i > 0:
            buffers.add(bounded.k.data_ptr())
    assert len(buffers) == 2
    n = growing.length
    torch.testing.assert_close(bounded.k[:, :, :n], growing.k, rtol=0, atol=0)
    torch.testing.assert_close(bounded.v[:, :, :n], growing.v, rtol=0, atol=0)


def test_context_index_reads_each_rows_context_projected_once() -> None:
    """Cross-attention with ``context_index``: row i of x reads context row index[i], the same as
    attending to a copy of that row; refused with a cache and in self-attention."""
    torch.manual_seed(0)
    attn = Attention(16, 2, context_dim=12).eval()
    x, context = torch.randn(5, 3, 16), torch.randn(2, 7, 12)
    index = torch.tensor([1, 0, 1, 1, 0])
    key_mask = torch.ones(5, 7, dtype=torch.bool)
    key_mask[2, 4:] = False
    torch.testing.assert_close(
        attn(x, context, key_padding_mask=key_mask, context_index=index),
        attn(x, context[index], key_padding_mask=key_mask),
    )
    grads = []  # and the same gradients, for the context and the projections alike
    for indexed in (True, False):
        ctx = context.clone().requires_grad_()
        attn.zero_grad()
        if indexed:
            y = attn(x, ctx, key_padding_mask=key_mask, context_index=index)
        else:
            y = attn(x, ctx[index], key_padding_mask=key_mask)
        y.square().sum().backward()
        grads.append([ctx.grad, *(p.grad.clone() for p in attn.parameters())])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="context_index is for cross-attention without a cache"):
        attn(x, context, context_index=index, cache=KVCache(static=True))
    with pytest.raises(ValueError, match="context_index is for cross-attention without a cache"):
        Attention(16, 2)(x, context_index=index)
