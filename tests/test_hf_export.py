"""mmtx-export format=hf: a captioner transformers can represent is written as a
VisionEncoderDecoderModel that gives the same logits and greedy captions; others are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmtx.checkpoint import TASK_KEY
from mmtx.data.tokenizer import Tokenizer
from mmtx.export import ExportError
from mmtx.pretrained.hf_export import export_hf
from mmtx.tasks.caption import CaptionTask
from tests.bad_inputs import tiny_model_config

transformers = pytest.importorskip("transformers", reason="transformers is the reference for HF layouts")

TOL = 1e-5  # fp32
TEXTS = ["a red square left of a blue circle", "a small green triangle", "two big yellow boxes"]
# the tiny captioner, as transformers' ViT + GPT-2 build it: linear patch map, learned positions,
# full attention, GELU (tanh) in the decoder; the encoder narrower than the decoder (transformers projects it)
MAPPABLE = ["model.encoder.stem=patch", "model.encoder.attention=full", "model.encoder.pos_embed=learned",
            "model.decoder.read_where=false", "model.encoder.dim=24", "+model.decoder.activation=gelu_tanh",
            "model.decoder.depth=2"]  # fmt: skip


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Perturb every parameter (norms and biases too: a swapped one cannot go unnoticed)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def batch(vocab: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, size, size, generator=gen), torch.randint(4, vocab, (2, 9), generator=gen)


def loaded(out: Path) -> torch.nn.Module:
    return transformers.VisionEncoderDecoderModel.from_pretrained(out).eval()


def assert_same_captions(task: CaptionTask, hf: torch.nn.Module, images: torch.Tensor) -> None:
    """Greedy decoding in both: the same tokens up to [EOS]."""
    tok = task.tokenizer
    ours = task.generate_ids(images).tolist()
    theirs = hf.generate(pixel_values=images, max_new_tokens=task.generation.max_new_tokens, num_beams=1,
                         do_sample=False).tolist()  # fmt: skip
    for a, b in zip(ours, theirs):
        b = b[1:]  # transformers keeps the start token
        stop = b.index(tok.eos_id) + 1 if tok.eos_id in b else len(b)
        assert a[:stop] == b[:stop]


BERT_STYLE = ["+model.decoder.norm_first=false", "+model.decoder.embed_norm=true", "+model.decoder.type_vocab_size=2",
              "+model.decoder.head_transform=true", "+model.decoder.head_bias=true"]  # fmt: skip


@pytest.mark.parametrize("decoder", [[], BERT_STYLE], ids=["gpt2", "bert"])
def test_a_captioner_trained_in_mmtx_gives_the_same_logits_and_captions(tmp_path: Path, decoder: list[str]) -> None:
    tokenizer = Tokenizer.train(TEXTS, vocab_size=60)
    torch.manual_seed(0)
    model = tiny_model_config(*MAPPABLE, *decoder)
    task = CaptionTask(model, tokenizer.to_str(), generation={"max_new_tokens": 6}).eval()
    randomize(task.model, seed=3)
    out = export_hf(task, tmp_path / "hf")
    hf = loaded(out)
    assert hf.enc_to_dec_proj.weight.shape == (32, 24)
    images, ids = batch(tokenizer.vocab_size)
    with torch.no_grad():
        ours = task.model(images, ids)
        assert (hf(pixel_values=images, decoder_input_ids=ids).logits - ours).abs().max() < TOL
        assert_same_captions(task, hf, images)
    # the tokenizer and the image preprocessing come with it
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.decode(tokenizer.encode(TEXTS[0]), skip_special_tokens=True) == TEXTS[0]
    assert hf_tok.pad_token_id == tokenizer.pad_id and hf_tok.eos_token_id == tokenizer.eos_id
    processor = transformers.AutoImageProcessor.from_pretrained(out)
    assert processor.size == {"height": 32, "width": 32}


@pytest.mark.parametrize("decoder_kind", ["gpt2", "bert"])
def test_a_transformers_model_imported_and_exported_again_is_itself(tmp_path: Path, decoder_kind: str) -> None:
    """transformers -> mmtx (model=caption_pretrained's loaders) -> format=hf -> transformers, with
    a GPT-2 or a BERT decoder."""
    tokenizer = Tokenizer.train(TEXTS, vocab_size=60)
    encoder = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, image_size=32, patch_size=8)  # fmt: skip
    decoder = (
        transformers.GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=24)
        if decoder_kind == "gpt2"
        else transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=24)
    )  # fmt: skip
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    torch.manual_seed(0)
    reference = transformers.VisionEncoderDecoderModel(config=config).eval()
    randomize(reference, seed=5)
    reference.save_pretrained(tmp_path / "source")
    model = {
        "_target_": "mmtx.models.captioner.ImageCaptioner",
        "encoder": {"_target_": "mmtx.pretrained.load_vit", "pretrained": str(tmp_path / "source")},
        "decoder": {"_target_": "mmtx.pretrained.load_decoder", "pretrained": str(tmp_path / "source"),
                    "context_dim": 32, "max_length": 24},
    }  # fmt: skip
    task = CaptionTask(model, tokenizer.to_str(), generation={"max_new_tokens": 6}).eval()
    hf = loaded(export_hf(task, tmp_path / "hf"))
    images, ids = batch(tokenizer.vocab_size)
    with torch.no_grad():
        expected = reference(pixel_values=images, decoder_input_ids=ids).logits
        assert (hf(pixel_values=images, decoder_input_ids=ids).logits - expected).abs().max() < TOL
        assert_same_captions(task, hf, images)
    theirs, again = reference.state_dict(), hf.state_dict()
    assert all(torch.equal(theirs[k], again[k]) for k in theirs if "pooler" not in k)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([], ["model.encoder.stem='conv'"]),
        ([*MAPPABLE, "model.encoder.pos_embed=sinusoidal", "model.decoder.pos_embed=rope"],
         ["model.encoder.pos_embed='sinusoidal'", "model.decoder.pos_embed='rope'"]),
        ([*MAPPABLE, "model.encoder.attention=axial"], ["model.encoder.attention='axial'"]),
        ([*MAPPABLE, "model.decoder.read_where=true"], ["model.decoder.read_where=True (GPT-2: False)"]),
        ([*MAPPABLE, "model.encoder.dim=48"], ["model.encoder.dim=48 is wider than model.decoder.dim=32"]),
        ([*MAPPABLE, "+model.decoder.norm_first=false"],
         ["ViT + BERT cannot", "model.decoder.embed_norm=False (BERT: True)", "model.decoder.type_vocab_size=0"]),
    ],
)  # fmt: skip
def test_what_does_not_map_is_refused_by_name(tmp_path: Path, overrides: list[str], named: list[str]) -> None:
    task = CaptionTask(tiny_model_config(*overrides), Tokenizer.train(TEXTS, vocab_size=60).to_str())
    with pytest.raises(ExportError) as refused:
        export_hf(task, tmp_path / "hf")
    assert all(n in str(refused.value) for n in named), str(refused.value)
    assert not (tmp_path / "hf").exists()


def test_mmtx_export_format_hf_on_the_command_line(cli, tmp_path: Path) -> None:
    tokenizer = Tokenizer.train(TEXTS, vocab_size=60).to_str()
    for name, overrides in (("mappable", MAPPABLE), ("default", [])):
        task = CaptionTask(tiny_model_config(*overrides), tokenizer)
        torch.save({TASK_KEY: "mmtx.tasks.caption.CaptionTask", "hyper_parameters": dict(task.hparams),
                    "state_dict": task.state_dict(), "global_step": 1}, tmp_path / f"{name}.ckpt")  # fmt: skip
    run = cli.run(
        "mmtx-export", f"ckpt={tmp_path / 'mappable.ckpt'}", f"out={tmp_path / 'hf'}", "format=hf", cwd=tmp_path
    )
    assert "VisionEncoderDecoderModel" in run.stdout
    assert loaded(tmp_path / "hf").config.decoder.n_layer == 2
    refused = cli.run("mmtx-export", f"ckpt={tmp_path / 'default.ckpt'}", f"out={tmp_path / 'no'}", "format=hf",
                      cwd=tmp_path, check=False)  # fmt: skip
    assert refused.returncode != 0 and "model.encoder.stem='conv'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    bad = cli.run("mmtx-export", f"ckpt={tmp_path / 'mappable.ckpt'}", f"out={tmp_path / 'no'}", "format=onnx",
                  cwd=tmp_path, check=False)  # fmt: skip
    assert bad.returncode != 0 and "format='onnx' is not one of mmtx, hf" in bad.stderr
