"""ViT image encoders from timm (``vit_*_patch16_*``) and Hugging Face (``ViTModel``) checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mmtx.models.vit import VisionEncoder
from mmtx.nn.embeddings import resample_positions
from mmtx.pretrained.convert import (
    Tensors,
    activation_name,
    check_given,
    find_prefix,
    head_count,
    load_converted,
    mlp_ratio,
    setting,
    sub_config,
)
from mmtx.pretrained.files import PretrainedError, read_pretrained

log = logging.getLogger(__name__)

# one block's tensors in each layout (weight and bias under each name); "q"/"k"/"v" are fused
# into our qkv, "qkv" is taken as it is
TIMM_BLOCK = {
    "norm1": "blocks.{i}.norm1", "qkv": "blocks.{i}.attn.qkv", "proj": "blocks.{i}.attn.proj",
    "norm2": "blocks.{i}.norm2", "fc1": "blocks.{i}.mlp.fc1", "fc2": "blocks.{i}.mlp.fc2",
}  # fmt: skip
HF_BLOCK = {  # the names in Hugging Face files (save_pretrained, the Hub)
    "norm1": "encoder.layer.{i}.layernorm_before", "q": "encoder.layer.{i}.attention.attention.query",
    "k": "encoder.layer.{i}.attention.attention.key", "v": "encoder.layer.{i}.attention.attention.value",
    "proj": "encoder.layer.{i}.attention.output.dense", "norm2": "encoder.layer.{i}.layernorm_after",
    "fc1": "encoder.layer.{i}.intermediate.dense", "fc2": "encoder.layer.{i}.output.dense",
}  # fmt: skip
HF_BLOCK_V5 = {  # transformers 5's module names (a state_dict() saved with torch.save)
    "norm1": "layers.{i}.layernorm_before", "q": "layers.{i}.attention.q_proj", "k": "layers.{i}.attention.k_proj",
    "v": "layers.{i}.attention.v_proj", "proj": "layers.{i}.attention.o_proj", "norm2": "layers.{i}.layernorm_after",
    "fc1": "layers.{i}.mlp.fc1", "fc2": "layers.{i}.mlp.fc2",
}  # fmt: skip

LAYOUTS = {
    "timm": dict(patch="patch_embed.proj", cls="cls_token", pos="pos_embed", norm="norm", ignore=("head.*",)),
    "hf": dict(
        patch="embeddings.patch_embeddings.projection", cls="embeddings.cls_token",
        pos="embeddings.position_embeddings", norm="layernorm", ignore=("pooler.*", "embeddings.mask_token"),
    ),
}  # fmt: skip


def load_vit(
    pretrained: str | Path,
    *,
    image_size: int | None = None,
    num_heads: int | None = None,
    dim: int | None = None,
    patch_size: int | None = None,
    dropout: float | None = None,
    attn_dropout: float | None = None,
    prefix: str | None = None,
) -> VisionEncoder:
    """A :class:`VisionEncoder` with the weights of a timm or Hugging Face ViT checkpoint.

    Args:
        pretrained: a directory or weights file, read by :func:`~mmtx.pretrained.read_pretrained`.
        image_size: the size the encoder is built for (default: the checkpoint's). Learned
            positions are resampled bicubically to its grid here, as timm and Hugging Face do
            (timm antialiases when shrinking, HF does not; the encoder keeps that choice for
            images of other sizes later).
        num_heads: only for checkpoints without a config.json (default: width / 64).
        dim, patch_size: checked against the checkpoint when given, so that other config values
            can refer to them (a decoder's ``context_dim``).
        dropout, attn_dropout: default the checkpoint config's (0 for ViTs).
        prefix: where the ViT sits in a checkpoint that holds several models (``encoder.``).
    """
    ckpt = read_pretrained(pretrained)
    layout, prefix = find_prefix(ckpt, {k: v["patch"] + ".weight" for k, v in LAYOUTS.items()}, prefix, "ViT")
    names, src, t = LAYOUTS[layout], ckpt.source, Tensors(ckpt, prefix)
    config = sub_config(ckpt.config, "encoder")
    if layout == "timm":  # LayerNorm(eps=1e-6); resample_abs_pos_embed antialiases
        block, heads_configured = TIMM_BLOCK, (config.get("model_args") or {}).get("num_heads")
        eps, act, antialias = 1e-6, "gelu", True
    else:  # interpolate_pos_encoding does not antialias
        if config.get("model_type", "vit") != "vit":
            raise PretrainedError(f"{src}: config.json has model_type={config['model_type']!r}, not a ViT")
        block = HF_BLOCK if t.has(HF_BLOCK["norm1"].format(i=0) + ".weight") else HF_BLOCK_V5
        heads_configured = config.get("num_attention_heads")
        eps, act, antialias = setting(config, "layer_norm_eps", 1e-12), setting(config, "hidden_act", "gelu"), False
        act = activation_name(act, src)

    converted = {}
    patch_w = converted["patch_embed.proj.weight"] = t.take(names["patch"] + ".weight")
    converted["patch_embed.proj.bias"] = t.take(names["patch"] + ".bias")
    width, in_chans, p, p2 = patch_w[0].shape
    if p != p2:
        raise PretrainedError(f"{src}: '{patch_w[1]}' has non-square patches {p}x{p2}")
    converted["cls_token"] = t.take(names["cls"])
    depth = t.count(block["norm1"] + ".weight")
    if depth == 0:
        raise PretrainedError(f"{src}: no transformer blocks ('{prefix}{block['norm1'].format(i=0)}.weight')")
    qkv_bias = t.has(block["qkv" if "qkv" in block else "q"].format(i=0) + ".bias")
    for i in range(depth):
        b = {role: name.format(i=i) for role, name in block.items()}
        for role, ours in (
            ("norm1", "norm1"),
            ("proj", "attn.proj"),
            ("norm2", "norm2"),
            ("fc1", "mlp.fc1"),
            ("fc2", "mlp.fc2"),
        ):
            for param in ("weight", "bias"):
                converted[f"blocks.{i}.{ours}.{param}"] = t.take(f"{b[role]}.{param}")
        for param in ("weight", "bias") if qkv_bias else ("weight",):
            converted[f"blocks.{i}.attn.qkv.{param}"] = (
                t.take(f"{b['qkv']}.{param}") if "qkv" in b else t.take_cat(f"{b[r]}.{param}" for r in "qkv")
            )
    for param in ("weight", "bias"):
        converted[f"norm.{param}"] = t.take(f"{names['norm']}.{param}")
    pos = t.take(names["pos"])
    t.check_all_taken(names["ignore"])

    # a table of 1 + g*g positions (CLS first), or g*g (timm's no_embed_class: CLS gets none)
    n = pos[0].shape[1]
    cls_in_table = round((n - 1) ** 0.5) ** 2 == n - 1 and n > 1
    grid = round((n - 1) ** 0.5) if cls_in_table else round(n**0.5)
    if grid * grid != n - cls_in_table:
        raise PretrainedError(f"{src}: '{pos[1]}' has {n} positions, not a square grid (with or without CLS)")
    check_given("dim", dim, width, src)
    check_given("patch_size", patch_size, p, src)
    hidden = converted["blocks.0.mlp.fc1.weight"][0].shape[0]
    kwargs = dict(
        image_size=image_size or grid * p, patch_size=p, in_chans=in_chans, dim=width, depth=depth,
        num_heads=head_count(num_heads, heads_configured, width, src), mlp_ratio=mlp_ratio(hidden, width, src),
        pos_embed="learned", qkv_bias=qkv_bias,
        dropout=setting(config, "hidden_dropout_prob", 0.0) if dropout is None else dropout,
        attn_dropout=setting(config, "attention_probs_dropout_prob", 0.0) if attn_dropout is None else attn_dropout,
        norm_eps=eps, activation=act, pos_antialias=antialias,
    )  # fmt: skip
    encoder = VisionEncoder(**kwargs)
    table = pos[0].float()
    cls_pos = table[:, :1] if cls_in_table else table.new_zeros(1, 1, width)
    patch_pos = resample_positions(table[:, int(cls_in_table) :], (grid, grid), encoder.grid_size, antialias)
    converted["pos_embed"] = (torch.cat([cls_pos, patch_pos], dim=1).to(pos[0].dtype), pos[1])
    load_converted(encoder, converted, src)
    encoder.build_config = {"_target_": "mmtx.models.vit.VisionEncoder", **kwargs}
    log.info(
        "%s: %s ViT, width %d, %d blocks, %d heads, patch %d, at %d px",
        src,
        layout,
        width,
        depth,
        kwargs["num_heads"],
        p,
        kwargs["image_size"],
    )
    return encoder
