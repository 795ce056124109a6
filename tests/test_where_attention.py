"""Cross-attention that also returns where it read: the coordinates, a reference written out by
hand, what it adds over plain cross-attention, decoding with it, and its refusals."""

import math

import pytest
import torch

from mmtx.models.captioner import ImageCaptioner
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.vit import VisionEncoder
from mmtx.nn import Attention, TransformerBlock, WhereCrossAttention
from mmtx.nn.where_attention import grid_coordinates


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_grid_coordinates_are_cls_then_patch_centres_row_by_row():
    expected = torch.tensor(
        [[0.0, 0.0, 1.0], [-0.5, -0.5, 0.0], [0.5, -0.5, 0.0], [-0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]
    )  # CLS, then (x, y) of the top left, top right, bottom left, bottom right patches
    assert torch.equal(grid_coordinates(5), expected)
    assert grid_coordinates(1 + 8 * 8)[1:, :2].abs().max() == pytest.approx(7 / 8)


@pytest.mark.parametrize("num_tokens", [1, 4, 1 + 2 * 3])
def test_a_context_that_is_not_cls_and_a_square_grid_is_refused(num_tokens):
    with pytest.raises(ValueError, match=f"square grid of patch tokens, got {num_tokens} tokens"):
        grid_coordinates(num_tokens)


def test_where_cross_attention_matches_a_reference_written_out():
    attn = WhereCrossAttention(24, 3, context_dim=16).eval()
    x, context = torch.randn(2, 5, 24), torch.randn(2, 10, 16)  # 10 tokens: CLS + a 3x3 grid
    q = (x @ attn.q.weight.T + attn.q.bias).view(2, 5, 3, 8).transpose(1, 2)
    k, v = (context @ attn.kv.weight.T + attn.kv.bias).split(24, -1)
    k, v = (t.view(2, 10, 3, 8).transpose(1, 2) for t in (k, v))
    weights = (q @ k.transpose(-1, -2) / math.sqrt(8)).softmax(-1)  # (B, H, T, S)
    read = (weights @ v).transpose(1, 2).reshape(2, 5, 24)
    where = (weights @ grid_coordinates(10)).transpose(1, 2).reshape(2, 5, 9)  # each head's mean (x, y, cls)
    expected = read @ attn.proj.weight.T + attn.proj.bias + where @ attn.where.weight.T + attn.where.bias
    torch.testing.assert_close(attn(x, context), expected, rtol=1e-5, atol=1e-5)


def test_where_it_read_tells_apart_what_plain_cross_attention_cannot():
    """Moving the image tokens to other places leaves plain cross-attention's output as it was
    (it reads a set of tokens), but not the read's: its heads return where the tokens stand."""
    plain = Attention(24, 3, context_dim=16).eval()
    where = WhereCrossAttention(24, 3, context_dim=16).eval()
    x, context = torch.randn(2, 5, 24), torch.randn(2, 17, 16)  # CLS + a 4x4 grid
    moved = torch.cat([context[:, :1], context[:, 1:].flip(1)], 1)  # the patches mirrored through the centre
    torch.testing.assert_close(plain(x, moved), plain(x, context), rtol=1e-5, atol=1e-5)
    assert (where(x, moved) - where(x, context)).abs().max() > 1e-2


def test_a_decoder_that_reads_where_decodes_the_same_with_and_without_its_cache():
    from mmtx.generation import GenerationConfig, generate

    enc = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=4)
    dec = CaptionDecoder(40, context_dim=32, dim=48, depth=2, num_heads=4, max_length=16, read_where=True)
    model = ImageCaptioner(enc, dec).eval()
    assert all(isinstance(b.cross_attn, WhereCrossAttention) for b in dec.body.blocks)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.3)  # spread enough that the tokens generated vary
        context = model.encode(torch.randn(3, 3, 32, 32))
        for beams in (1, 3):  # three beams read each image's keys and values once (grouped)
            out = [
                generate(dec, context, bos_id=1, eos_id=2, pad_id=0,
                         config=GenerationConfig(max_new_tokens=10, num_beams=beams, use_cache=cache))
                for cache in (True, False)
            ]  # fmt: skip
            assert torch.equal(*out)
            assert len(set(map(tuple, out[0].tolist()))) > 1


def test_reading_where_needs_cross_attention():
    with pytest.raises(ValueError, match="read_where is an option of cross-attention"):
        TransformerBlock(16, 2, read_where=True)
    assert type(TransformerBlock(16, 2, context_dim=8).cross_attn) is Attention


def test_the_config_key_builds_a_captioner_that_reads_where_and_learns():
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.caption import CaptionTask
    from tests.bad_inputs import tiny_model_config

    tokenizer = Tokenizer.train(["a red square left of a blue circle", "a blue circle above a red square"], 40)
    task = CaptionTask(tiny_model_config("model.decoder.read_where=true"), tokenizer.to_str())
    model = task.model
    assert all(isinstance(b.cross_attn, WhereCrossAttention) for b in model.decoder.body.blocks)
    images = torch.randn(4, 3, 32, 32)
    ids, _ = tokenizer.encode_batch(["a red square left of a blue circle", "a blue circle above a red square"] * 2, 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = model.loss(images, ids, tokenizer.pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]
    assert model.decoder.body.blocks[0].cross_attn.where.weight.grad.abs().sum() > 0  # the places are learnt from
