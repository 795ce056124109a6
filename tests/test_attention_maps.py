"""Attention maps: the decoder's cross-attention per generated word, captured after decoding."""

from __future__ import annotations

import torch

from mmtx.attention_maps import attention_grid, caption_maps, cross_attention, heat, overlay, word_maps
from tests.helpers import tiny_captioner


def test_each_word_attends_with_weights_summing_to_one_over_the_image() -> None:
    model = tiny_captioner().eval()
    images, ids = torch.randn(2, 3, 32, 32), torch.randint(3, 40, (2, 7))
    context = model.encode(images)
    weights = cross_attention(model.decoder, ids, context)
    L = sum(b.cross_attn is not None for b in model.decoder.body.blocks)
    assert weights.shape == (2, L, 4, 7, context.shape[1])  # (B, layers, heads, T, 1 + patches)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, L, 4, 7))
    maps = word_maps(weights, model.encoder.grid_size)
    assert maps.shape == (2, 7, 4, 4)
    torch.testing.assert_close(maps.sum((-1, -2)), torch.ones(2, 7))  # over the patches, CLS left out
    assert not any(b.cross_attn._forward_hooks for b in model.decoder.body.blocks)  # the hooks are gone


def test_a_cross_attention_forced_onto_one_patch_lights_that_patch() -> None:
    """Queries made constant and every key feature the sum of its image token's features: the
    token with by far the largest (patch 9 of the 4 x 4 grid) takes each head's attention, and
    the map shows it."""
    model = tiny_captioner().eval()
    with torch.no_grad():
        for block in model.decoder.body.blocks:
            attn = block.cross_attn
            attn.q.weight.zero_()
            attn.q.bias.fill_(1.0)
            dim = attn.q.weight.shape[0]
            attn.kv.weight[:dim].fill_(1.0)  # keys: the sum of the token's features, in every dimension
            attn.kv.bias.zero_()
    context = torch.zeros(1, 17, 32)
    context[0, 1 + 9] = 5.0  # patch 9: row 2, column 1
    maps = word_maps(cross_attention(model.decoder, torch.tensor([[1, 5, 6]]), context), (4, 4))
    for word_map in maps[0]:
        assert word_map.argmax().item() == 9 and word_map[2, 1] > 0.99


def test_caption_maps_follow_the_generated_words_and_draw_a_grid() -> None:
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.caption import CaptionTask
    from tests.bad_inputs import tiny_model_config

    tokenizer = Tokenizer.train(["a red circle above a blue square"] * 3, vocab_size=60)
    task = CaptionTask(tiny_model_config(), tokenizer.to_str()).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ids = task.generate_ids(images)
        maps = caption_maps(task, images, ids)
    for row, (words, word_maps_) in zip(ids.tolist(), maps):
        n = next((i for i, t in enumerate(row) if t in (tokenizer.eos_id, tokenizer.pad_id)), len(row))
        assert len(words) == n and word_maps_.shape == (n, 4, 4)
    pixels = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    words, word_maps_ = maps[0]
    sheet = attention_grid(pixels, "a caption", words, word_maps_, columns=4, panel=64)
    assert sheet.size == (4 * 64, -(-(len(words) + 1) // 4) * (64 + 18))
    assert overlay(pixels, torch.eye(4)).size == (32, 32)
    assert heat(torch.tensor([[0.0, 1.0]]).numpy()).tolist() == [[[0, 0, 4], [252, 255, 164]]]


def test_a_question_attends_over_the_image_patches() -> None:
    """The question's map (last co-attention layer, mean over heads and real question tokens)
    sums to 1 over the patches, and padding tokens do not change it."""
    from mmtx.attention_maps import question_maps
    from mmtx.models import TextEncoder, VisionEncoder
    from mmtx.models.two_stream import TwoStreamModel
    from mmtx.models.vqa import VqaClassifier

    torch.manual_seed(0)
    backbone = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2),
        TextEncoder(vocab_size=30, dim=32, depth=1, num_heads=2, max_length=8),
        co_layers=2,
        joint_dim=24,
    )
    model = VqaClassifier(backbone, num_answers=5).eval()
    images, ids = torch.randn(2, 3, 32, 32), torch.randint(1, 30, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 5:] = False  # the second question has 5 tokens
    maps = question_maps(model, images, ids, mask)
    assert maps.shape == (2, 4, 4)
    torch.testing.assert_close(maps.sum((-1, -2)), torch.ones(2))
    shorter = question_maps(model, images[1:], ids[1:, :5], mask[1:, :5])
    torch.testing.assert_close(shorter[0], maps[1], rtol=1e-4, atol=1e-6)


def test_recorded_weights_follow_context_index() -> None:
    """Weights recorded from a cross-attention reading fewer context rows (``context_index``) are
    those of the same attention reading a copy of each row's context."""
    from mmtx.attention_maps import attention_weights
    from mmtx.nn import Attention

    torch.manual_seed(0)
    attn = Attention(16, 2, context_dim=12).eval()
    x, context, index = torch.randn(3, 4, 16), torch.randn(2, 5, 12), torch.tensor([1, 1, 0])
    shared = attention_weights([attn], lambda: attn(x, context, context_index=index))
    copied = attention_weights([attn], lambda: attn(x, context[index]))
    assert shared.shape == (3, 1, 2, 4, 5)
    torch.testing.assert_close(shared, copied)
