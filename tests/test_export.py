"""Exporting to safetensors + config.json + tokenizer.json, and loading back without Lightning.

Exports of a captioner and of VQA models (built from the repository's configs, some from
pretrained files the tests write) must load back to identical outputs; broken weight files are
refused naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors import safe_open

from mmtx.checkpoint import DATA_KEY, TASK_KEY
from mmtx.data.tokenizer import Tokenizer
from mmtx.export import ExportError, export_task, load_exported, task_from_export
from mmtx.generation import GenerationConfig, generate
from tests.helpers import TINY_TWO_STREAM, compose_train, write_gpt2, write_vit

CAPTIONS = ["a red circle above a blue square", "two green triangles", "a small yellow circle", "three squares"]
TINY_CAPTIONER = [
    "model.encoder.dim=32", "model.encoder.depth=1", "model.encoder.num_heads=2", "model.encoder.patch_size=8",
    "model.decoder.dim=32", "model.decoder.depth=1", "model.decoder.num_heads=2",
]  # fmt: skip
DATA = ["data.image_size=32", "data.max_length=12"]


def build_task(overrides: list[str], tokenizer: Tokenizer, spread: float = 0.1, **data_arguments):
    """The task ``mmtx-train overrides`` would train, built as ``mmtx.commands.train`` builds it, its
    weights spread by ``spread`` so that outputs differ from token to token."""
    cfg = compose_train([*DATA, *overrides])
    model = OmegaConf.to_container(cfg.model, resolve=True)
    task = instantiate(cfg.task, model=model, tokenizer=tokenizer.to_str(), **data_arguments,
                       _recursive_=False, _convert_="all")  # fmt: skip
    task.data_config = {"image_size": 32}
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in task.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * spread)
    return task.eval()


def save_checkpoint(task, path: Path) -> Path:
    """What Lightning writes for the task, the entries mmtx reads."""
    torch.save({
        "state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
        TASK_KEY: f"{type(task).__module__}.{type(task).__qualname__}", DATA_KEY: task.data_config,
    }, path)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def wordpiece() -> Tokenizer:
    return Tokenizer.train(CAPTIONS * 5, vocab_size=60)


def inputs(tokenizer: Tokenizer, n: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    images = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ids, mask = tokenizer.encode_batch(CAPTIONS[:n], max_length=12)
    return images, ids, mask


# ------------------------------------------------------------------------------ round trips


def test_captioner_export_loads_back_identical_without_lightning(tmp_path: Path, wordpiece: Tokenizer) -> None:
    task = build_task(TINY_CAPTIONER, wordpiece)
    out = export_task(task, tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "mmtx.tasks.caption.CaptionTask" and config["image_size"] == 32
    assert config["model"]["decoder"]["vocab_size"] == wordpiece.vocab_size  # filled in by the task
    with safe_open(out / "model.safetensors", "pt") as f:
        stored = set(f.keys())
    assert "decoder.body.token_embed.weight" in stored and "decoder.lm_head.weight" not in stored  # tied: once

    model, tokenizer, _ = load_exported(out)
    assert model.decoder.lm_head.weight is model.decoder.body.token_embed.weight
    images, ids, _ = inputs(wordpiece)
    settings = GenerationConfig(max_new_tokens=8)
    with torch.no_grad():
        assert torch.equal(model(images, ids), task.model(images, ids))
        kw = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, config=settings)
        assert torch.equal(generate(model.decoder, model.encode(images), **kw),
                           generate(task.model.decoder, task.model.encode(images), **kw))  # fmt: skip
    assert tokenizer.to_str() == wordpiece.to_str()

    # in a fresh interpreter: loading needs neither Lightning, Hydra nor torch.load (no pickles),
    # and importing the importers brings in none of the reference libraries
    code = (
        "import sys, torch; torch.load = None; from mmtx.export import load_exported; import mmtx.pretrained; "
        f"m = load_exported({str(out)!r}).model; "
        "found = {'lightning', 'pytorch_lightning', 'hydra', 'omegaconf', 'timm', 'transformers'} & set(sys.modules); "
        "assert not found, found; print(type(m).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0 and result.stdout.strip() == "ImageCaptioner", result.stderr[-2000:]


def test_a_captioner_with_its_own_stem_channels_exports_and_loads_back(tmp_path: Path, wordpiece: Tokenizer) -> None:
    """The stem's channels are a config list: the export stores them and rebuilds the same layers."""
    task = build_task([*TINY_CAPTIONER, "model.encoder.stem=conv", "model.encoder.stem_channels=[8,16,24]"], wordpiece)
    out = export_task(task, tmp_path / "export")
    assert json.loads((out / "config.json").read_text())["model"]["encoder"]["stem_channels"] == [8, 16, 24]
    model, _, _ = load_exported(out)
    convs = [m for m in model.encoder.patch_embed.stem if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 16, 24]
    images, ids, _ = inputs(wordpiece)
    with torch.no_grad():
        assert torch.equal(model(images, ids), task.model(images, ids))


def test_the_machines_decoding_layout_is_not_exported(tmp_path: Path, wordpiece: Tokenizer) -> None:
    """few_row_products is the decoding CPU's choice: not written, and an older export's value (the
    then-default true) is dropped on loading, so the machine that decodes decides."""
    task = build_task(TINY_CAPTIONER, wordpiece)
    task.generation = dataclasses.replace(task.generation, few_row_products=True)
    out = export_task(task, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert "few_row_products" not in config["generation"] and "num_beams" in config["generation"]
    config["generation"]["few_row_products"] = True  # as exports written before the change have it
    (out / "config.json").write_text(json.dumps(config))
    assert task_from_export(out).generation.few_row_products is None


@pytest.mark.parametrize("kind", ["vqa", "vqa_generative"])
def test_vqa_exports_load_back_identical(tmp_path: Path, wordpiece: Tokenizer, kind: str) -> None:
    overrides = [f"task={kind}", *TINY_TWO_STREAM]
    if kind == "vqa":
        task = build_task(overrides, wordpiece, answers=["yes", "no", "2", "red"])
    else:
        task = build_task([*overrides, "model.decoder.dim=32", "model.decoder.depth=1"], wordpiece)
    model, _, config = load_exported(export_task(task, tmp_path))
    images, ids, mask = inputs(wordpiece)
    with torch.no_grad():
        if kind == "vqa":
            assert config["answers"] == ["yes", "no", "2", "red"] and model.num_answers == 4
            assert torch.equal(model(images, ids, mask), task.model(images, ids, mask))
        else:
            assert config["generation"]["max_new_tokens"] == 8
            context, context_mask = model.context(images, ids, mask)
            expected = task.model.context(images, ids, mask)
            assert torch.equal(context, expected[0]) and torch.equal(context_mask, expected[1])
            answer = wordpiece.encode_batch(["yes", "no", "two"], max_length=10)[0]
            assert torch.equal(model.decoder(answer, context, context_mask=context_mask),
                               task.model.decoder(answer, context, context_mask=context_mask))  # fmt: skip


def test_load_exported_refuses_foreign_code_and_mismatched_weights(tmp_path: Path, wordpiece: Tokenizer) -> None:
    out = export_task(build_task(TINY_CAPTIONER, wordpiece), tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    for field, value, message in [
        ("_target_", "os.system", "'os.system' is not a class of mmtx.models"),
        ("_partial_", True, "Hydra option '_partial_' is not allowed"),
    ]:
        bad = json.loads(json.dumps(config))
        bad["model"]["encoder"][field] = value
        (out / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ExportError, match=message):
            load_exported(out)
    bad = json.loads(json.dumps(config))
    bad["model"]["decoder"]["depth"] = 2
    (out / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ExportError, match=r"does not match ImageCaptioner: missing \['decoder.body.blocks.1"):
        load_exported(out)
    with pytest.raises(ExportError, match="not an mmtx export"):
        load_exported(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "not safetensors"])
def test_broken_export_weights_are_refused_naming_the_file(tmp_path: Path, wordpiece: Tokenizer, damage: str) -> None:
    out = export_task(build_task(TINY_CAPTIONER, wordpiece), tmp_path / "export")
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100] if damage == "truncated" else b"PK\x03\x04 a zip, not tensors")
    with pytest.raises(ExportError, match=f"{weights}: not a readable safetensors file"):
        load_exported(out)


# --------------------------------------------------------------- from pretrained files, by config


def test_caption_pretrained_loads_vit_and_gpt2_and_exports_self_contained(tmp_path: Path, cli) -> None:
    """``model=caption_pretrained`` with a Hugging Face ViT and a GPT-2 directory (tokenizer from
    its vocab.json + merges.txt): the captioner computes what ViT + GPT-2 compute; ``mmtx-export``
    of its checkpoint loads back identical once the pretrained files are gone."""
    transformers = pytest.importorskip("transformers", reason="transformers writes the pretrained files")
    vit_dir, gpt2_dir = tmp_path / "vit", tmp_path / "gpt2"
    vit = write_vit(vit_dir, transformers)
    tokenizer = write_gpt2(gpt2_dir, transformers, CAPTIONS)
    overrides = ["model=caption_pretrained", f"model.encoder.pretrained={vit_dir}", "model.encoder.dim=32",
                 f"model.decoder.pretrained={gpt2_dir}", f"tokenizer.path={gpt2_dir}"]  # fmt: skip
    task = build_task(overrides, tokenizer, spread=0.0)
    gpt2 = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    assert task.model.decoder.vocab_size == tokenizer.vocab_size == gpt2.config.vocab_size + 5  # [PAD] etc. appended
    images, ids, _ = inputs(tokenizer)
    with torch.no_grad():
        context = vit.eval()(images).last_hidden_state
        expected = gpt2(ids.clamp(max=gpt2.config.vocab_size - 1), encoder_hidden_states=context).logits
        ours = task.model(images, ids.clamp(max=gpt2.config.vocab_size - 1))
        assert (ours[..., : gpt2.config.vocab_size] - expected).abs().max() < 1e-5

    ckpt = save_checkpoint(task, tmp_path / "last.ckpt")
    result = cli.run("mmtx-export", f"ckpt={ckpt}", f"out={tmp_path / 'export'}", cwd=tmp_path)
    assert "exported" in result.stdout, cli.describe(result)
    shutil.rmtree(vit_dir)  # the export must not need the pretrained files
    shutil.rmtree(gpt2_dir)
    model, loaded_tokenizer, config = load_exported(tmp_path / "export")
    assert "mmtx.pretrained" not in json.dumps(config)
    assert config["model"]["encoder"]["norm_eps"] == 1e-12 and config["model"]["decoder"]["activation"] == "gelu_tanh"
    with torch.no_grad():
        assert torch.equal(model(images, ids), task.model(images, ids))
    assert loaded_tokenizer.encode(CAPTIONS[0]) == tokenizer.encode(CAPTIONS[0])


def test_vqa_pretrained_config_from_bert_and_timm_vit(tmp_path: Path) -> None:
    """``task=vqa model=vqa_pretrained`` with a timm ViT and a BERT directory (vocab.txt): the
    text stream is BERT, the export loads back identical without the files."""
    transformers = pytest.importorskip("transformers", reason="transformers writes the BERT files")
    timm = pytest.importorskip("timm", reason="timm writes the ViT files")
    vit_dir, bert_dir = tmp_path / "vit", tmp_path / "bert"
    torch.manual_seed(0)
    vit = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                            depth=1, num_heads=4, num_classes=0)  # fmt: skip
    timm.models.save_for_hf(vit, vit_dir, safe_serialization=True)
    bert_dir.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w for c in CAPTIONS for w in c.split()})]
    (bert_dir / "vocab.txt").write_text("\n".join(words) + "\n")
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=4, intermediate_size=64))  # fmt: skip
    bert.save_pretrained(bert_dir)
    tokenizer = Tokenizer.from_file(bert_dir)
    overrides = ["task=vqa", "model=vqa_pretrained", f"model.backbone.vision.pretrained={vit_dir}",
                 "model.backbone.vision.patch_size=8", f"model.backbone.text.pretrained={bert_dir}",
                 "model.backbone.joint_dim=32", "model.backbone.co_layers=1", f"tokenizer.path={bert_dir}"]  # fmt: skip
    task = build_task(overrides, tokenizer, spread=0.0, answers=["yes", "no", "three"])
    images, ids, mask = inputs(tokenizer)
    assert tokenizer.vocab_size == len(words) and (ids[:, 0] == 2).all()  # [CLS] ... [SEP], BERT's ids
    with torch.no_grad():
        text, _ = task.model.backbone.encode_text(ids, mask)
        assert (text - bert.eval()(ids, attention_mask=mask.long()).last_hidden_state).abs().max() < 1e-5

    model, _, config = load_exported(export_task(task, tmp_path / "export"))
    assert "mmtx.pretrained" not in json.dumps(config) and config["model"]["backbone"]["text"]["embed_norm"]
    shutil.rmtree(vit_dir)
    shutil.rmtree(bert_dir)
    with torch.no_grad():
        assert torch.equal(model(images, ids, mask), task.model(images, ids, mask))
