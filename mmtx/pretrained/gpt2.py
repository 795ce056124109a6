"""GPT-2 checkpoints as a :class:`CaptionDecoder`.

GPT-2 is pre-norm with a final norm (as mmtx's default blocks), uses the tanh approximation of
GELU, and stores its projections as ``Conv1D`` weights of shape (in, out): transposed here.
Cross-attention (``crossattention`` + ``ln_cross_attn``, written by ``add_cross_attention=True``
models such as VisionEncoderDecoder's) is imported when present, else new.
"""

from __future__ import annotations

from mmtx.pretrained.convert import (
    DecoderParts,
    Tensors,
    activation_name,
    fold_context_projection,
    mlp_ratio,
    output_projection,
    setting,
    sub_config,
)
from mmtx.pretrained.files import Pretrained, PretrainedError

ANCHOR = "wte.weight"
# one block's tensors: our name -> GPT-2's, under "h.{i}."; Conv1D weights are transposed
LAYER = {"norm1": "ln_1", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "norm2": "ln_2",
         "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}  # fmt: skip
CROSS = {"norm_cross": "ln_cross_attn", "cross_attn.q": "crossattention.q_attn",
         "cross_attn.kv": "crossattention.c_attn", "cross_attn.proj": "crossattention.c_proj"}  # fmt: skip
# causal-mask buffers older transformers versions saved with the weights
IGNORED = ("h.*.attn.bias", "h.*.attn.masked_bias", "h.*.crossattention.bias", "h.*.crossattention.masked_bias")


def gpt2_decoder_parts(ckpt: Pretrained, prefix: str) -> DecoderParts:
    """The :class:`CaptionDecoder` arguments found in the GPT-2 weights under ``prefix`` (``num_heads``:
    the config's, if any), their tensors, and no more names to leave as initialised."""
    t = Tensors(ckpt, prefix)
    src = t.source
    config = sub_config(ckpt.config, "decoder")
    if config.get("model_type", "gpt2") != "gpt2":
        raise PretrainedError(f"{src}: config.json has model_type={config['model_type']!r}, not GPT-2")
    if not setting(config, "scale_attn_weights", True) or setting(config, "scale_attn_by_inverse_layer_idx", False):
        raise PretrainedError(f"{src}: attention scaling other than 1/sqrt(head width) is not supported")

    converted = {"body.token_embed.weight": t.take("wte.weight"), "body.pos_embed.weight": t.take("wpe.weight")}
    depth = t.count("h.{i}.ln_1.weight")
    if depth == 0:
        raise PretrainedError(f"{src}: no blocks ('{prefix}h.0.ln_1.weight')")
    cross = t.has("h.0.crossattention.c_attn.weight")
    for i in range(depth):
        for ours, theirs in {**LAYER, **(CROSS if cross else {})}.items():
            weight, name = t.take(f"h.{i}.{theirs}.weight")
            is_norm = ours.startswith("norm")
            converted[f"body.blocks.{i}.{ours}.weight"] = (weight if is_norm else weight.t(), name)
            converted[f"body.blocks.{i}.{ours}.bias"] = t.take(f"h.{i}.{theirs}.bias")
    for param in ("weight", "bias"):
        converted[f"body.norm.{param}"] = t.take(f"ln_f.{param}")
    parent = prefix.removesuffix("transformer.")
    fold_context_projection(t, parent, converted, depth)
    head = t.at(parent)
    tied = True
    if head.has("lm_head.weight"):  # absent when tied (save_pretrained and the Hub's gpt2 files)
        tied = output_projection(converted, head.take("lm_head.weight"))
    t.check_all_taken([prefix[len(parent) :] + pattern for pattern in IGNORED], within=parent)

    vocab, dim = converted["body.token_embed.weight"][0].shape
    hidden = converted["body.blocks.0.mlp.fc1.weight"][0].shape[0]
    found = dict(
        vocab_size=vocab, dim=dim, depth=depth, num_heads=config.get("n_head"), mlp_ratio=mlp_ratio(hidden, dim, src),
        max_length=converted["body.pos_embed.weight"][0].shape[0], pos_embed="learned", tie_embeddings=tied,
        qkv_bias=True, dropout=setting(config, "resid_pdrop", 0.1), attn_dropout=setting(config, "attn_pdrop", 0.1),
        norm_eps=setting(config, "layer_norm_epsilon", 1e-5), pad_id=setting(config, "pad_token_id", None),
        activation=activation_name(setting(config, "activation_function", "gelu_new"), src),
    )  # fmt: skip
    return found, converted, []
