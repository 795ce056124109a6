"""BERT checkpoints (bert-base-uncased layout): the text encoder, and a decoder with
cross-attention as Hugging Face's ``BertLMHeadModel``/``VisionEncoderDecoder`` use it.

BERT is post-norm, adds token-type embeddings and normalises the summed embeddings, keeps
separate query/key/value projections (fused here), and predicts tokens through a transform
(dense, GELU, LayerNorm) and a biased projection tied to the word embeddings.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from mmtx.models.text import TextEncoder
from mmtx.pretrained.convert import (
    Converted,
    DecoderParts,
    Tensors,
    activation_name,
    find_prefix,
    fit_tables,
    fold_context_projection,
    load_converted,
    mlp_ratio,
    output_projection,
    setting,
    sub_config,
    with_choices,
)
from mmtx.pretrained.files import Pretrained, PretrainedError, read_pretrained

log = logging.getLogger(__name__)

ANCHOR = "embeddings.word_embeddings.weight"
BODY_IGNORED = ("pooler.*", "embeddings.position_ids")  # the pooler has no place in mmtx's towers
# one layer's tensors (weight and bias each): our name -> BERT's, under "encoder.layer.{i}."
LAYER = {
    "attn.proj": "attention.output.dense", "norm1": "attention.output.LayerNorm",
    "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense", "norm2": "output.LayerNorm",
}  # fmt: skip
CROSS = {
    "cross_attn.q": "crossattention.self.query", "cross_attn.proj": "crossattention.output.dense",
    "norm_cross": "crossattention.output.LayerNorm",
}  # fmt: skip


def load_text_encoder(
    pretrained: str | Path,
    *,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    max_length: int | None = None,
    num_heads: int | None = None,
    dropout: float | None = None,
    attn_dropout: float | None = None,
    prefix: str | None = None,
) -> TextEncoder:
    """A :class:`TextEncoder` (e.g. a two-stream model's text stream) with BERT's weights.

    Args:
        pretrained: a directory or weights file, read by :func:`~mmtx.pretrained.read_pretrained`.
        vocab_size: the tokenizer's size (default: the checkpoint's); ids past the checkpoint's
            vocabulary get new embeddings.
        pad_id: the padding id (default: the config's ``pad_token_id``, 0).
        max_length: keep the first positions only (default: all, 512 for BERT).
        num_heads: only for checkpoints without a config.json (default: width / 64).
        dropout, attn_dropout: default the config's (BERT: 0.1).
        prefix: where BERT sits in a checkpoint that holds several models.
    """
    ckpt = read_pretrained(pretrained)
    _, prefix = find_prefix(ckpt, {"bert": ANCHOR}, prefix, "BERT encoder")
    t = Tensors(ckpt, prefix)
    found, converted = bert_body(t, _bert_config(ckpt, "encoder"), cross=False)
    t.check_all_taken(BODY_IGNORED)
    kwargs = with_choices(
        found,
        t.source,
        vocab_size=vocab_size,
        pad_id=pad_id,
        max_length=max_length,
        num_heads=num_heads,
        dropout=dropout,
        attn_dropout=attn_dropout,
    )
    encoder = TextEncoder(**kwargs)
    fit_tables(converted, encoder, kwargs, t.source)
    load_converted(encoder, converted, t.source)
    encoder.build_config = {"_target_": "mmtx.models.text.TextEncoder", **kwargs}
    log.info(
        "%s: BERT encoder, width %d, %d layers, %d heads", t.source, kwargs["dim"], kwargs["depth"], kwargs["num_heads"]
    )
    return encoder


def bert_decoder_parts(ckpt: Pretrained, prefix: str) -> DecoderParts:
    """The :class:`CaptionDecoder` arguments found in the BERT weights under ``prefix`` (``num_heads``:
    the config's, if any), their tensors, and the names to leave as initialised.

    Cross-attention and the prediction head (``cls.predictions``, beside ``bert.``) are imported
    when the checkpoint has them and start as initialised otherwise (as in Hugging Face).
    """
    t = Tensors(ckpt, prefix)
    src = t.source
    cross = t.has("encoder.layer.0.crossattention.self.query.weight")
    found, body = bert_body(t, _bert_config(ckpt, "decoder"), cross=cross)
    parent = prefix.removesuffix("bert.")
    head = t.at(parent + "cls.predictions.")
    converted = {f"body.{name}": tensor for name, tensor in body.items()}
    fold_context_projection(t, parent, converted, found["depth"])
    has_head = head.has("transform.dense.weight")
    tied = True
    if has_head:
        for ours, theirs in (("head_transform.0", "transform.dense"), ("head_transform.2", "transform.LayerNorm")):
            for param in ("weight", "bias"):
                converted[f"{ours}.{param}"] = head.take(f"{theirs}.{param}")
        converted["lm_head.bias"] = head.take("bias")
        if head.has("decoder.weight"):  # absent when tied (save_pretrained), present in older files
            tied = output_projection(converted, head.take("decoder.weight"))
        if head.has("decoder.bias"):  # older files store the bias twice
            bias, name = head.take("decoder.bias")
            if not torch.equal(bias, converted["lm_head.bias"][0]):
                raise PretrainedError(f"{src}: '{name}' differs from '{converted['lm_head.bias'][1]}'")
    body_at = prefix[len(parent) :]  # "bert." below the model's own prefix
    t.check_all_taken([*(body_at + pattern for pattern in BODY_IGNORED), "cls.seq_relationship.*"], within=parent)

    fresh = [] if has_head else ["head_transform.", "lm_head.bias"]
    return {**found, "tie_embeddings": tied, "head_transform": True, "head_bias": True}, converted, fresh


def bert_body(t: Tensors, config: dict[str, Any], cross: bool) -> tuple[dict[str, Any], Converted]:
    """The :class:`TextTransformer` arguments found in the checkpoint (``num_heads``: the config's,
    if any) and its tensors under their names."""
    converted = {
        "token_embed.weight": t.take("embeddings.word_embeddings.weight"),
        "pos_embed.weight": t.take("embeddings.position_embeddings.weight"),
        "type_embed.weight": t.take("embeddings.token_type_embeddings.weight"),
        "embed_norm.weight": t.take("embeddings.LayerNorm.weight"),
        "embed_norm.bias": t.take("embeddings.LayerNorm.bias"),
    }
    depth = t.count("encoder.layer.{i}.attention.self.query.weight")
    if depth == 0:
        raise PretrainedError(f"{t.source}: no layers ('{t.prefix}encoder.layer.0.attention.self.query.weight')")
    for i in range(depth):
        theirs, ours = f"encoder.layer.{i}.", f"blocks.{i}."
        parts = {**LAYER, **(CROSS if cross else {})}
        for param in ("weight", "bias"):
            for name, their_name in parts.items():
                converted[f"{ours}{name}.{param}"] = t.take(f"{theirs}{their_name}.{param}")
            converted[f"{ours}attn.qkv.{param}"] = t.take_cat(
                f"{theirs}attention.self.{x}.{param}" for x in ("query", "key", "value")
            )
            if cross:
                converted[f"{ours}cross_attn.kv.{param}"] = t.take_cat(
                    f"{theirs}crossattention.self.{x}.{param}" for x in ("key", "value")
                )
    vocab, dim = converted["token_embed.weight"][0].shape
    hidden = converted["blocks.0.mlp.fc1.weight"][0].shape[0]
    found = {
        "vocab_size": vocab, "dim": dim, "depth": depth, "num_heads": config.get("num_attention_heads"),
        "mlp_ratio": mlp_ratio(hidden, dim, t.source), "max_length": converted["pos_embed.weight"][0].shape[0],
        "pos_embed": "learned", "qkv_bias": True, "dropout": setting(config, "hidden_dropout_prob", 0.1),
        "attn_dropout": setting(config, "attention_probs_dropout_prob", 0.1),
        "norm_eps": setting(config, "layer_norm_eps", 1e-12), "pad_id": setting(config, "pad_token_id", 0),
        "norm_first": False, "activation": activation_name(setting(config, "hidden_act", "gelu"), t.source),
        "type_vocab_size": converted["type_embed.weight"][0].shape[0], "embed_norm": True,
    }  # fmt: skip
    return found, converted


def _bert_config(ckpt: Pretrained, part: str) -> dict[str, Any]:
    config = sub_config(ckpt.config, part)
    if config.get("model_type", "bert") != "bert":
        raise PretrainedError(f"{ckpt.source}: config.json has model_type={config['model_type']!r}, not BERT")
    if setting(config, "position_embedding_type", "absolute") != "absolute":
        raise PretrainedError(
            f"{ckpt.source}: position_embedding_type={config['position_embedding_type']!r} "
            "is not supported (absolute only)"
        )
    return config
