"""Importing public pretrained weights: parity with the reference implementations.

Each reference model (timm, Hugging Face transformers) is built small with random weights,
saved with its library's own functions, imported by :mod:`mmtx.pretrained` (which uses neither
library), and compared output for output in fp32. timm and transformers are test-only oracles.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mmtx.data.tokenizer import Tokenizer
from mmtx.generation import GenerationConfig, generate
from mmtx.models.captioner import ImageCaptioner
from mmtx.models.two_stream import TwoStreamModel
from mmtx.nn.blocks import PostNorm, PreNorm
from mmtx.pretrained import PretrainedError, load_decoder, load_text_encoder, load_vit

timm = pytest.importorskip("timm", reason="timm is the reference for the timm ViT layout (pip install '.[test]')")
transformers = pytest.importorskip("transformers", reason="transformers is the reference for HF layouts")

TOL = 1e-5  # fp32


def randomize(model: torch.nn.Module, seed: int = 0, spread: float = 0.05) -> torch.nn.Module:
    """Perturb every parameter (norms included, so a swapped norm cannot go unnoticed); eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * spread)
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------------------------- ViT


def timm_vit(**kwargs) -> torch.nn.Module:
    """A tiny timm ``vit_base_patch16_224`` (32-px images, 8-px patches, width 32, 4 heads)."""
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=37 / 32, num_classes=5,
                dynamic_img_size=True)  # fmt: skip
    return randomize(timm.create_model("vit_base_patch16_224", pretrained=False, **{**args, **kwargs}))


@pytest.fixture(scope="module")
def hf_vit(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32, patch_size=8
    )
    model = randomize(transformers.ViTModel(config), seed=1)
    path = tmp_path_factory.mktemp("hf_vit")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("size", [32, 48, 16])
def test_timm_vit_matches_timm_at_its_size_and_others(tmp_path: Path, size: int) -> None:
    """Other sizes resample the positions as timm's dynamic_img_size does (bicubic, antialiased)."""
    torch.manual_seed(0)
    reference = timm_vit()
    timm.models.save_for_hf(reference, tmp_path, safe_serialization=True)  # model.safetensors + config.json
    encoder = load_vit(tmp_path).eval()
    assert (encoder.num_heads, encoder.image_size, encoder.pos_antialias) == (4, 32, True)
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        diff = max_diff(encoder(images), reference.forward_features(images))
    assert diff < TOL


def test_timm_vit_from_a_pth_state_dict_and_without_a_class_position(tmp_path: Path) -> None:
    """torch.save'd state dict, no config.json (heads given); timm's no_embed_class tables."""
    torch.manual_seed(0)
    reference = timm_vit(no_embed_class=True)
    torch.save(reference.state_dict(), tmp_path / "vit.pth")
    encoder = load_vit(tmp_path / "vit.pth", num_heads=4, image_size=48).eval()  # resampled at import
    images = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert max_diff(encoder(images), reference.forward_features(images)) < TOL


@pytest.mark.parametrize("size", [32, 48, 16])
def test_hf_vit_matches_transformers_with_interpolated_positions(hf_vit, size: int) -> None:
    reference, path = hf_vit
    encoder = load_vit(path).eval()
    assert (encoder.norm.eps, encoder.pos_antialias) == (1e-12, False)
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected = reference(images, interpolate_pos_encoding=True).last_hidden_state
        assert max_diff(encoder(images), expected) < TOL
        # built for this size: positions resampled once at import, the same numbers
        assert max_diff(load_vit(path, image_size=size).eval()(images), expected) < TOL


def test_hf_vit_from_a_transformers_5_state_dict(hf_vit, tmp_path: Path) -> None:
    """transformers 5 names its ViT modules differently from its files; both are read."""
    reference, _ = hf_vit
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    reference.config.save_pretrained(tmp_path)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(load_vit(tmp_path).eval()(images), reference(images).last_hidden_state) < TOL


def test_vit_import_refuses_variants_and_bad_input(tmp_path: Path, hf_vit) -> None:
    torch.manual_seed(0)
    save_file(timm_vit(init_values=1e-5).state_dict(), tmp_path / "layerscale.safetensors")  # LayerScale
    with pytest.raises(PretrainedError, match=r"layerscale.safetensors: tensors that no conversion rule takes: .*ls1"):
        load_vit(tmp_path / "layerscale.safetensors", num_heads=4)
    state = timm_vit().state_dict()
    del state["blocks.1.attn.proj.bias"]
    save_file(state, tmp_path / "cut.safetensors")
    with pytest.raises(PretrainedError, match="missing tensor 'blocks.1.attn.proj.bias'"):
        load_vit(tmp_path / "cut.safetensors", num_heads=4)
    save_file({"weight": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(PretrainedError, match="other.safetensors: not a ViT"):
        load_vit(tmp_path / "other.safetensors")
    with pytest.raises(PretrainedError, match="dim=64 was given, but the checkpoint has dim=32"):
        load_vit(hf_vit[1], dim=64)
    with pytest.raises(PretrainedError, match="pretrained weights not found"):
        load_vit(tmp_path / "absent")


def test_torch_load_is_weights_only(tmp_path: Path) -> None:
    """A .bin whose pickle would run code (here: build an arbitrary object) is refused."""
    torch.save({"weight": torch.zeros(1), "config": Path("x")}, tmp_path / "evil.bin")
    with pytest.raises(PretrainedError, match=r"weights_only=True"):
        load_vit(tmp_path / "evil.bin")


# --------------------------------------------------------------------------------------- BERT

BERT = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=24)  # fmt: skip


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    model = randomize(transformers.BertModel(transformers.BertConfig(**BERT)), seed=2)
    path = tmp_path_factory.mktemp("bert")
    model.save_pretrained(path)
    return model, path


def padded_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 9), generator=gen)
    mask = torch.arange(9)[None, :] < torch.tensor([[9], [5], [2]])
    return ids.masked_fill(~mask, 0), mask


def test_bert_encoder_matches_transformers_with_padding(hf_bert) -> None:
    reference, path = hf_bert
    encoder = load_text_encoder(path).eval()
    assert not encoder.norm_first and encoder.pad_id == 0
    ids, mask = padded_batch(BERT["vocab_size"])
    types = (torch.arange(9) >= 4).long().expand(3, -1)
    with torch.no_grad():
        expected = reference(ids, attention_mask=mask.long()).last_hidden_state
        assert max_diff(encoder(ids, mask=mask), expected) < TOL
        expected = reference(ids, attention_mask=mask.long(), token_type_ids=types).last_hidden_state
        assert max_diff(encoder(ids, mask=mask, token_type_ids=types), expected) < TOL


def test_bert_base_uncased_style_bin_file(hf_bert, tmp_path: Path) -> None:
    """bert-base-uncased's own file: a BertForPreTraining state dict under ``bert.``, LayerNorm
    ``gamma``/``beta`` names, the MLM and NSP heads beside it, no config (heads given)."""
    reference, _ = hf_bert
    state = {f"bert.{k}".replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in reference.state_dict().items()}  # fmt: skip
    state["cls.seq_relationship.weight"] = torch.zeros(2, 32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    encoder = load_text_encoder(tmp_path / "pytorch_model.bin", num_heads=4, max_length=12).eval()
    ids, mask = padded_batch(BERT["vocab_size"], seed=1)
    with torch.no_grad():
        assert max_diff(encoder(ids, mask=mask), reference(ids, attention_mask=mask.long()).last_hidden_state) < TOL
    assert encoder.max_length == 12


def test_two_stream_text_stream_is_bert(hf_bert, hf_vit) -> None:
    """ViLBERT from BERT + ViT: the text stream's own blocks compute BERT exactly; the
    co-attention layers follow each stream's norm placement."""
    bert, bert_path = hf_bert
    model = TwoStreamModel(load_vit(hf_vit[1]), load_text_encoder(bert_path), co_layers=1, joint_dim=16).eval()
    layer = model.co_layers[
        0
    ]  # BERT's post-norm blocks in the text stream, the ViT's pre-norm ones in the vision stream
    assert isinstance(layer.text_self.norm1, PostNorm) and isinstance(layer.text_cross.norm2, PostNorm)
    assert isinstance(layer.vision_self.norm1, PreNorm) and isinstance(layer.vision_cross.norm2, PreNorm)
    ids, mask = padded_batch(BERT["vocab_size"], seed=2)
    with torch.no_grad():
        text, _ = model.encode_text(ids, mask)
        assert max_diff(text, bert(ids, attention_mask=mask.long()).last_hidden_state) < TOL
        assert model(torch.randn(3, 3, 32, 32), ids, mask).pooled.shape == (3, 16)


def test_bert_decoder_with_cross_attention_matches_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(**BERT, is_decoder=True, add_cross_attention=True)
    reference = randomize(transformers.BertLMHeadModel(config), seed=3)
    reference.save_pretrained(tmp_path)
    decoder = load_decoder(tmp_path).eval()
    ids, _ = padded_batch(BERT["vocab_size"], seed=3)
    context = torch.randn(3, 5, 32)
    context_mask = torch.arange(5)[None, :] < torch.tensor([[5], [3], [1]])
    with torch.no_grad():
        expected = reference(ids, encoder_hidden_states=context, encoder_attention_mask=context_mask.long()).logits
        assert max_diff(decoder(ids, context, context_mask=context_mask), expected) < TOL
        cache = decoder.new_cache()
        steps = [decoder(ids[:, t : t + 1], context, context_mask=context_mask, cache=cache) for t in range(9)]
        assert max_diff(torch.cat(steps, dim=1), expected) < TOL


def test_bert_decoder_from_an_encoder_checkpoint_gets_new_cross_attention(hf_bert) -> None:
    """As in VisionEncoderDecoder from bert-base-uncased: cross-attention and head start new."""
    _, path = hf_bert
    decoder = load_decoder(path, context_dim=48, vocab_size=64)
    assert decoder.body.blocks[0].cross_attn.kv.in_features == 48 and decoder.vocab_size == 64
    assert decoder.head_transform is not None and decoder.lm_head.weight is decoder.body.token_embed.weight


# -------------------------------------------------------------------------------------- GPT-2


def gpt2(cross: bool, seed: int) -> torch.nn.Module:
    config = transformers.GPT2Config(vocab_size=70, n_embd=32, n_layer=2, n_head=4, n_positions=24,
                                     add_cross_attention=cross)  # fmt: skip
    torch.manual_seed(seed)
    return randomize(transformers.GPT2LMHeadModel(config), seed=seed, spread=0.3)


def test_gpt2_decoder_with_cross_attention_logits_cache_and_greedy_tokens(tmp_path: Path) -> None:
    reference = gpt2(cross=True, seed=4)
    reference.save_pretrained(tmp_path)
    decoder = load_decoder(tmp_path).eval()
    assert decoder.body.blocks[0].mlp.act.approximate == "tanh"
    assert decoder.lm_head.weight is decoder.body.token_embed.weight
    gen = torch.Generator().manual_seed(4)
    ids, context = torch.randint(0, 70, (2, 9), generator=gen), torch.randn(2, 5, 32, generator=gen)
    context_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    hf_mask = context_mask.long()
    with torch.no_grad():
        expected = reference(ids, encoder_hidden_states=context, encoder_attention_mask=hf_mask).logits
        assert max_diff(decoder(ids, context, context_mask=context_mask), expected) < TOL
        cache = decoder.new_cache()
        steps = [decoder(ids[:, t : t + 1], context, context_mask=context_mask, cache=cache) for t in range(9)]
        assert max_diff(torch.cat(steps, dim=1), expected) < TOL

        # greedy decoding over the KV cache == a plain argmax loop over the reference's full forward
        bos, eos, pad, n = 1, 2, 0, 12
        tokens = generate(decoder, context, context_mask=context_mask, bos_id=bos, eos_id=eos, pad_id=pad,
                          config=GenerationConfig(max_new_tokens=n, min_new_tokens=n))  # fmt: skip
        seq = torch.full((2, 1), bos)
        for _ in range(n):
            logits = reference(seq, encoder_hidden_states=context, encoder_attention_mask=hf_mask).logits[:, -1]
            logits[:, [bos, eos, pad]] = -float("inf")  # generate never emits these (EOS: min_new_tokens)
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, seq[:, 1:])
    assert len(set(tokens.flatten().tolist())) > 2  # a sequence that varies, not one token repeated


def test_plain_gpt2_bin_gets_new_cross_attention_and_a_larger_vocabulary(tmp_path: Path) -> None:
    """GPT-2 without cross-attention (as on the Hub), torch.save'd: with the new cross-attention's
    output zeroed the decoder is GPT-2; tokens past its vocabulary (an appended [PAD]) are new rows."""
    reference = gpt2(cross=False, seed=5)
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    reference.config.save_pretrained(tmp_path)
    decoder = load_decoder(tmp_path, context_dim=16, vocab_size=75, pad_id=74, max_length=16).eval()
    assert (decoder.vocab_size, decoder.pad_id, decoder.max_length) == (75, 74, 16)
    with torch.no_grad():
        for block in decoder.body.blocks:
            block.cross_attn.proj.weight.zero_()
            block.cross_attn.proj.bias.zero_()
        ids = torch.randint(0, 75, (2, 10), generator=torch.Generator().manual_seed(5)).clamp(max=69)
        logits = decoder(ids, torch.randn(2, 4, 16))
        assert max_diff(logits[..., :70], reference(ids).logits) < TOL
        assert torch.all(decoder.body.token_embed.weight[74] == 0)  # the padding row


@pytest.mark.parametrize("decoder_kind", ["gpt2", "bert"])
def test_vision_encoder_decoder_wider_encoder_projection_is_imported(tmp_path: Path, decoder_kind: str) -> None:
    """A VisionEncoderDecoder whose ViT (width 48) is wider than its decoder (32) projects the image
    tokens (``enc_to_dec_proj``) before cross-attention: the captioner built from its files gives
    its logits."""
    torch.manual_seed(7)
    encoder = transformers.ViTConfig(hidden_size=48, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, image_size=32, patch_size=8)  # fmt: skip
    decoder = (
        transformers.GPT2Config(vocab_size=70, n_embd=32, n_layer=2, n_head=4, n_positions=24)
        if decoder_kind == "gpt2"
        else transformers.BertConfig(**BERT)
    )
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    reference = randomize(transformers.VisionEncoderDecoderModel(config=config), seed=7)
    assert reference.enc_to_dec_proj.weight.shape == (32, 48)
    reference.save_pretrained(tmp_path)
    captioner = ImageCaptioner(load_vit(tmp_path), load_decoder(tmp_path, context_dim=48)).eval()
    gen = torch.Generator().manual_seed(7)
    images, ids = torch.randn(2, 3, 32, 32, generator=gen), torch.randint(0, 60, (2, 9), generator=gen)
    with torch.no_grad():
        expected = reference(pixel_values=images, decoder_input_ids=ids).logits
        assert max_diff(captioner(images, ids), expected) < TOL


def test_decoder_import_errors_name_the_problem(tmp_path: Path) -> None:
    reference = gpt2(cross=True, seed=6)
    reference.save_pretrained(tmp_path)
    with pytest.raises(PretrainedError, match=r"context of width 32 \('.*c_attn.weight'\), context_dim=48 was given"):
        load_decoder(tmp_path, context_dim=48)
    with pytest.raises(PretrainedError, match="has 70 entries, more than vocab_size=60"):
        load_decoder(tmp_path, vocab_size=60)
    with pytest.raises(PretrainedError, match="has 24 positions, max_length=30 needs more"):
        load_decoder(tmp_path, max_length=30)
    save_file({"wte.weight": torch.zeros(70, 32)}, tmp_path / "cut.safetensors")
    with pytest.raises(PretrainedError, match="cut.safetensors: missing tensor 'wpe.weight'"):
        load_decoder(tmp_path / "cut.safetensors", num_heads=4)


# --------------------------------------------------------------------------------- tokenizers

TEXTS = ["a man riding a wave on top of a surfboard.", "Two  dogs, playing!", "naïve café — 3 cats", " lead"]


def test_gpt2_vocab_json_and_merges_txt_match_the_gpt2_tokenizer(tmp_path: Path) -> None:
    from tests.helpers import write_gpt2_vocab

    write_gpt2_vocab(tmp_path, TEXTS, vocab_size=400)  # vocab.json + merges.txt, GPT-2's files
    reference = transformers.GPT2TokenizerFast(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))

    tok = Tokenizer.from_file(tmp_path)
    assert tok.bos_id == tok.eos_id == reference.eos_token_id
    for text in TEXTS:
        assert tok.encode(text, add_special=False) == reference.encode(text)
        assert tok.decode(tok.encode(text)) == text


def test_bert_vocab_txt_follows_tokenizer_config_casing(tmp_path: Path) -> None:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "Man", "##s", "dog", "Dog", ",", "!", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    reference = transformers.BertTokenizerFast(str(tmp_path / "vocab.txt"), do_lower_case=False)
    tok = Tokenizer.from_file(tmp_path)
    for text in ("Man dogs, a Dog!", "man mans."):
        assert tok.encode(text) == reference.encode(text)  # [CLS] ... [SEP]
