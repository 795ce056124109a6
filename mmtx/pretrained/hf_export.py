"""Writing a captioner as a Hugging Face ``VisionEncoderDecoderModel`` (ViT + GPT-2 or BERT) directory.

The inverse of the importers (:mod:`mmtx.pretrained.vit`, :mod:`mmtx.pretrained.gpt2`,
:mod:`mmtx.pretrained.bert`): where the captioner's architecture is one transformers builds — a
ViT with the linear patch map, learned positions and pre-norm blocks; a decoder with learned
positions and cross-attention that is GPT-2 (pre-norm, a bias-free output layer) or BERT
(post-norm, token types, normalised embeddings, a prediction transform) — its tensors are renamed
(GPT-2's ``Conv1D`` weights transposed, fused projections split) into the names ``save_pretrained`` writes, so that
``VisionEncoderDecoderModel.from_pretrained(out)`` computes the same logits, and
``AutoTokenizer`` / ``AutoImageProcessor`` read the tokenizer and the image preprocessing from
the same directory. transformers is not needed to write it. Anything else is refused, naming
each setting that does not map.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from mmtx.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from mmtx.export import ExportError, model_config
from mmtx.file_modes import as_created
from mmtx.models.captioner import ImageCaptioner
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.vit import VisionEncoder
from mmtx.pretrained.bert import CROSS as BERT_CROSS
from mmtx.pretrained.bert import LAYER as BERT_LAYER
from mmtx.pretrained.gpt2 import CROSS as GPT2_CROSS
from mmtx.pretrained.gpt2 import LAYER as GPT2_LAYER
from mmtx.tasks.lora import merge_adapters

# mmtx activation -> the name transformers' configs give it
_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
_VIT_BLOCK = {  # ours -> ViT's, under encoder.encoder.layer.{i}.
    "norm1": "layernorm_before", "attn.proj": "attention.output.dense", "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense",
}  # fmt: skip
_GPT2_BLOCK = {**GPT2_LAYER, **GPT2_CROSS}  # ours -> GPT-2's, under decoder.transformer.h.{i}.; Conv1D: transposed


def _arguments(cls: type, config: dict[str, Any]) -> dict[str, Any]:
    """``config``'s constructor arguments of ``cls``, its defaults filled in."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return {**defaults, **{k: v for k, v in config.items() if k != "_target_"}}


def _encoder_problems(enc: dict[str, Any]) -> list[str]:
    wanted = {"stem": "patch", "pos_embed": "learned", "norm_first": True, "attention": "full"}
    problems = [f"model.encoder.{k}={enc[k]!r} (transformers' ViT: {v!r})" for k, v in wanted.items() if enc[k] != v]
    if enc["activation"] not in _ACTIVATIONS:
        problems.append(f"model.encoder.activation={enc['activation']!r}")
    return problems


# what each decoder kind of transformers is, in CaptionDecoder's arguments
_DECODERS = {
    "GPT-2": {"norm_first": True, "pos_embed": "learned", "qkv_bias": True, "type_vocab_size": 0,
              "embed_norm": False, "head_transform": False, "head_bias": False, "read_where": False},
    "BERT": {"norm_first": False, "pos_embed": "learned", "qkv_bias": True, "embed_norm": True,
             "head_transform": True, "head_bias": True, "read_where": False},
}  # fmt: skip


def _decoder_kind(dec: dict[str, Any], encoder_dim: int) -> tuple[str, list[str]]:
    """Which of transformers' decoders the decoder is (post-norm: BERT, else GPT-2), and what
    does not map to it."""
    kind = "GPT-2" if dec["norm_first"] else "BERT"
    problems = [f"model.decoder.{k}={dec[k]!r} ({kind}: {v!r})" for k, v in _DECODERS[kind].items() if dec[k] != v]
    if kind == "BERT" and dec["type_vocab_size"] < 1:
        problems.append("model.decoder.type_vocab_size=0 (BERT: token types)")
    if dec["activation"] not in _ACTIVATIONS:
        problems.append(f"model.decoder.activation={dec['activation']!r}")
    if encoder_dim > dec["dim"]:
        problems.append(
            f"model.encoder.dim={encoder_dim} is wider than model.decoder.dim={dec['dim']} "
            f"({kind}'s cross-attention reads its own width, through one projection of the encoder's tokens)"
        )
    return kind, problems


def _padded_context(weight: Tensor, dim: int) -> Tensor:
    """A cross-attention key/value map (out, context) reading ``dim`` >= context channels: zeros
    for the channels transformers' projection of a narrower encoder leaves empty (see export_hf)."""
    return torch.cat([weight, weight.new_zeros(weight.shape[0], dim - weight.shape[1])], dim=1)


def _vit_tensors(encoder: VisionEncoder, image_size: int) -> dict[str, Tensor]:
    """The ViT's tensors, its positions for images of ``image_size`` (resampled as mmtx would)."""
    s = encoder.state_dict()
    dim = encoder.dim
    with torch.no_grad():
        positions = encoder.positions(encoder.patch_embed.grid(image_size, image_size))
    out = {
        "encoder.embeddings.cls_token": s["cls_token"],
        "encoder.embeddings.position_embeddings": positions,
        "encoder.embeddings.patch_embeddings.projection.weight": s["patch_embed.proj.weight"],
        "encoder.embeddings.patch_embeddings.projection.bias": s["patch_embed.proj.bias"],
        "encoder.layernorm.weight": s["norm.weight"],
        "encoder.layernorm.bias": s["norm.bias"],
        # the pooler: transformers builds one, captioning never reads it
        "encoder.pooler.dense.weight": torch.zeros(dim, dim, dtype=s["norm.weight"].dtype),
        "encoder.pooler.dense.bias": torch.zeros(dim, dtype=s["norm.weight"].dtype),
    }
    for i in range(len(encoder.blocks)):
        at = f"encoder.encoder.layer.{i}."
        for ours, theirs in _VIT_BLOCK.items():
            for param in ("weight", "bias"):
                out[f"{at}{theirs}.{param}"] = s[f"blocks.{i}.{ours}.{param}"]
        qkv = s[f"blocks.{i}.attn.qkv.weight"].chunk(3)
        biases = s[f"blocks.{i}.attn.qkv.bias"].chunk(3) if f"blocks.{i}.attn.qkv.bias" in s else None
        for j, role in enumerate(("query", "key", "value")):
            out[f"{at}attention.attention.{role}.weight"] = qkv[j]
            if biases is not None:
                out[f"{at}attention.attention.{role}.bias"] = biases[j]
    return out


def _gpt2_tensors(decoder: CaptionDecoder, tied: bool) -> dict[str, Tensor]:
    s = decoder.state_dict()
    out = {
        "decoder.transformer.wte.weight": s["body.token_embed.weight"],
        "decoder.transformer.wpe.weight": s["body.pos_embed.weight"],
        "decoder.transformer.ln_f.weight": s["body.norm.weight"],
        "decoder.transformer.ln_f.bias": s["body.norm.bias"],
    }
    if not tied:
        out["decoder.lm_head.weight"] = s["lm_head.weight"]
    dim = decoder.body.dim
    for i in range(len(decoder.body.blocks)):
        for ours, theirs in _GPT2_BLOCK.items():
            weight, bias = s[f"body.blocks.{i}.{ours}.weight"], s[f"body.blocks.{i}.{ours}.bias"]
            if ours == "cross_attn.kv":
                weight = _padded_context(weight, dim)
            is_norm = ours.startswith("norm")
            out[f"decoder.transformer.h.{i}.{theirs}.weight"] = weight if is_norm else weight.t()
            out[f"decoder.transformer.h.{i}.{theirs}.bias"] = bias
    return out


def _bert_tensors(decoder: CaptionDecoder, tied: bool) -> dict[str, Tensor]:
    s = decoder.state_dict()
    body, head = "decoder.bert.", "decoder.cls.predictions."
    out = {
        f"{body}embeddings.word_embeddings.weight": s["body.token_embed.weight"],
        f"{body}embeddings.position_embeddings.weight": s["body.pos_embed.weight"],
        f"{body}embeddings.token_type_embeddings.weight": s["body.type_embed.weight"],
        f"{body}embeddings.LayerNorm.weight": s["body.embed_norm.weight"],
        f"{body}embeddings.LayerNorm.bias": s["body.embed_norm.bias"],
        f"{head}transform.dense.weight": s["head_transform.0.weight"],
        f"{head}transform.dense.bias": s["head_transform.0.bias"],
        f"{head}transform.LayerNorm.weight": s["head_transform.2.weight"],
        f"{head}transform.LayerNorm.bias": s["head_transform.2.bias"],
        f"{head}bias": s["lm_head.bias"],
    }
    if not tied:
        out[f"{head}decoder.weight"] = s["lm_head.weight"]
    dim = decoder.body.dim
    for i in range(len(decoder.body.blocks)):
        ours, theirs = f"body.blocks.{i}.", f"{body}encoder.layer.{i}."
        for param in ("weight", "bias"):
            for name, their_name in {**BERT_LAYER, **BERT_CROSS}.items():
                out[f"{theirs}{their_name}.{param}"] = s[f"{ours}{name}.{param}"]
            for role, t in zip(("query", "key", "value"), s[f"{ours}attn.qkv.{param}"].chunk(3)):
                out[f"{theirs}attention.self.{role}.{param}"] = t
            kv = s[f"{ours}cross_attn.kv.{param}"]
            for role, t in zip(("key", "value"), (_padded_context(kv, dim) if param == "weight" else kv).chunk(2)):
                out[f"{theirs}crossattention.self.{role}.{param}"] = t
    return out


def _bert_config(dec: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_type": "bert", "vocab_size": dec["vocab_size"], "hidden_size": dec["dim"], "num_hidden_layers": dec["depth"],
        "num_attention_heads": dec["num_heads"], "intermediate_size": int(dec["dim"] * dec["mlp_ratio"]),
        "hidden_act": _ACTIVATIONS[dec["activation"]], "hidden_dropout_prob": dec["dropout"],
        "attention_probs_dropout_prob": dec["attn_dropout"], "max_position_embeddings": dec["max_length"],
        "type_vocab_size": dec["type_vocab_size"], "layer_norm_eps": dec["norm_eps"],
        "position_embedding_type": "absolute",
    }  # fmt: skip


def _documents(
    enc: dict[str, Any], dec: dict[str, Any], kind: str, tied: bool, image_size: int, task: Any
) -> dict[str, dict[str, Any]]:
    """The JSON files of the directory, by name: the model's config, the decoding settings, the
    tokenizer's settings and the image processor's."""
    generation, tok = task.generation, task.tokenizer
    special = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    encoder_config = {
        "model_type": "vit", "hidden_size": enc["dim"], "num_hidden_layers": enc["depth"],
        "num_attention_heads": enc["num_heads"], "intermediate_size": int(enc["dim"] * enc["mlp_ratio"]),
        "hidden_act": _ACTIVATIONS[enc["activation"]], "hidden_dropout_prob": enc["dropout"],
        "attention_probs_dropout_prob": enc["attn_dropout"], "layer_norm_eps": enc["norm_eps"],
        "image_size": image_size, "patch_size": enc["patch_size"], "num_channels": enc["in_chans"],
        "qkv_bias": enc["qkv_bias"],
    }  # fmt: skip
    decoder_config = _bert_config(dec) if kind == "BERT" else {
        "model_type": "gpt2", "vocab_size": dec["vocab_size"], "n_positions": dec["max_length"], "n_embd": dec["dim"],
        "n_layer": dec["depth"], "n_head": dec["num_heads"], "n_inner": int(dec["dim"] * dec["mlp_ratio"]),
        "activation_function": _ACTIVATIONS[dec["activation"]], "resid_pdrop": dec["dropout"],
        "embd_pdrop": dec["dropout"], "attn_pdrop": dec["attn_dropout"], "layer_norm_epsilon": dec["norm_eps"],
    }  # fmt: skip
    decoder_config |= {"add_cross_attention": True, "is_decoder": True, "tie_word_embeddings": tied, **special}
    document = {
        "architectures": ["VisionEncoderDecoderModel"],
        "model_type": "vision-encoder-decoder",
        "is_encoder_decoder": True,
        "tie_word_embeddings": False,  # the encoder and decoder share nothing; GPT-2's own tie is its config's
        "encoder": encoder_config,
        "decoder": decoder_config,
        "decoder_start_token_id": tok.bos_id,
        **special,
    }
    generation_config = {  # mmtx's decoding settings, under transformers' names
        "decoder_start_token_id": tok.bos_id, **special, "max_length": dec["max_length"],
        "max_new_tokens": generation.max_new_tokens, "min_new_tokens": generation.min_new_tokens,
        "num_beams": generation.num_beams, "length_penalty": generation.length_penalty,
        "early_stopping": generation.early_stopping, "do_sample": generation.do_sample,
        "temperature": generation.temperature, "top_k": generation.top_k, "top_p": generation.top_p,
    }  # fmt: skip
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": dec["max_length"],
        **{f"{role}_token": tok.backend.id_to_token(i) for role, i in
           (("bos", tok.bos_id), ("eos", tok.eos_id), ("pad", tok.pad_id), ("unk", tok.unk_id))},
    }  # fmt: skip
    preprocessor = {
        "image_processor_type": "ViTImageProcessor", "do_resize": True,
        "size": {"height": image_size, "width": image_size},
        "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD),
    }  # fmt: skip

    return {
        "config.json": document,
        "generation_config.json": generation_config,
        "tokenizer_config.json": tokenizer_config,
        "preprocessor_config.json": preprocessor,
    }


def export_hf(task: Any, out: str | Path) -> Path:
    """Write the captioner of ``task`` (what :func:`mmtx.checkpoint.load_task` returns) into
    ``out`` as transformers writes a ``VisionEncoderDecoderModel`` (ViT + GPT-2 or BERT): its weights,
    ``config.json``, ``generation_config.json``, the tokenizer (``tokenizer.json`` and
    ``tokenizer_config.json``) and ``preprocessor_config.json``. Refuses, naming every setting
    that does not map, a model of another kind or architecture. Low-rank adapters
    (``task.lora``) are merged into the weights first (in place)."""
    model = task.model
    if not isinstance(model, ImageCaptioner):
        raise ExportError(
            f"format=hf writes captioners (ImageCaptioner) as VisionEncoderDecoderModel; this checkpoint holds a "
            f"{type(model).__name__}"
        )
    config = model_config(task.hparams["model"], model)
    enc = _arguments(VisionEncoder, config["encoder"])
    dec = _arguments(CaptionDecoder, config["decoder"])
    kind, problems = _decoder_kind(dec, enc["dim"])
    problems = _encoder_problems(enc) + problems
    if problems:
        raise ExportError(f"format=hf: transformers' ViT + {kind} cannot represent " + "; ".join(problems))
    merge_adapters(task)  # once refusals are out of the way: it changes the task in place
    dec["vocab_size"] = model.decoder.vocab_size  # what the tokenizer filled in, whatever the config says
    tied = model.decoder.lm_head.weight is model.decoder.body.token_embed.weight
    # the size it was trained at: transformers' ViT takes one size, the positions are for its grid
    image_size = (getattr(task, "data_config", None) or {}).get("image_size") or enc["image_size"]
    decoder_tensors = _gpt2_tensors if kind == "GPT-2" else _bert_tensors
    tensors = {**_vit_tensors(model.encoder, image_size), **decoder_tensors(model.decoder, tied)}
    if enc["dim"] != dec["dim"]:  # transformers projects the encoder's tokens to the decoder's width
        # the encoder's features in the first channels, zeros after: exactly what mmtx's
        # cross-attention reads, through the zero-padded key/value map above
        dtype = model.decoder.body.token_embed.weight.dtype
        tensors["enc_to_dec_proj.weight"] = torch.eye(dec["dim"], enc["dim"], dtype=dtype)
        tensors["enc_to_dec_proj.bias"] = torch.zeros(dec["dim"], dtype=dtype)

    files = _documents(enc, dec, kind, tied, image_size, task)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    as_created(out / "model.safetensors")
    for name, value in files.items():
        (out / name).write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    task.tokenizer.backend.save(str(out / "tokenizer.json"))
    as_created(out / "tokenizer.json")
    return out
