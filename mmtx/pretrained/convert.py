"""What every importer shares: finding a layout in a foreign state dict, taking its tensors by
name (and noticing any it did not take), and loading the converted tensors into an mmtx module."""

from __future__ import annotations

import copy
import fnmatch
import logging
import math
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from mmtx.pretrained.files import Pretrained, PretrainedError

log = logging.getLogger(__name__)

Converted = dict[str, tuple[Tensor, str]]  # our name -> (tensor, the checkpoint's name for it)
DecoderParts = tuple[dict[str, Any], Converted, list[str]]  # constructor arguments, tensors, names left new


def find_prefix(
    ckpt: Pretrained, anchors: dict[str, str], prefix: str | None = None, what: str = "model"
) -> tuple[str, str]:
    """The (layout, name prefix) of the one layout whose anchor tensor ``ckpt`` holds.

    ``anchors`` maps a layout to a tensor name only it has. A checkpoint that nests the model
    (``vit.``, ``bert.``, a VisionEncoderDecoder's ``encoder.``) is found under that prefix;
    ``prefix`` picks one when several match.
    """
    found = [
        (layout, name[: -len(anchor)])
        for layout, anchor in anchors.items()
        for name in ckpt.tensors
        if name.endswith(anchor) and (name == anchor or name[-len(anchor) - 1] == ".")
    ]
    if prefix is not None:
        found = [(layout, p) for layout, p in found if p == prefix]
    if not found:
        names = " or ".join(f"'{a}'" for a in anchors.values())
        where = f" under prefix {prefix!r}" if prefix is not None else ""
        raise PretrainedError(f"{ckpt.source}: not a {what} mmtx can import (no tensor named {names}{where})")
    if len(found) > 1:
        raise PretrainedError(
            f"{ckpt.source}: holds several {what}s ({', '.join(f'{layout} at {p!r}' for layout, p in found)}); "
            "pass prefix= to pick one"
        )
    return found[0]


def normalize_names(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Old TensorFlow-converted names (``LayerNorm.gamma``/``beta``, as in bert-base-uncased) as
    PyTorch's ``weight``/``bias``."""
    pytorch = {"gamma": "weight", "beta": "bias"}
    return {re.sub(r"(?<=LayerNorm\.)(gamma|beta)$", lambda m: pytorch[m[1]], name): t for name, t in tensors.items()}


class Tensors:
    """The tensors of a foreign checkpoint under ``prefix``, taken one by one by their names.

    Every tensor taken is remembered with its full name, so errors name the file and key, and
    :meth:`check_all_taken` can refuse checkpoints holding tensors no conversion rule took (a
    variant the mmtx module cannot represent must fail loudly, not load partially).
    """

    def __init__(self, ckpt: Pretrained, prefix: str = "") -> None:
        self.source, self.prefix = ckpt.source, prefix
        self.tensors = normalize_names(ckpt.tensors)
        self.taken: set[str] = set()

    def at(self, prefix: str) -> Tensors:
        """The same tensors (and record of those taken) under another prefix, e.g. a model's head."""
        view = copy.copy(self)  # shares the tensors and the set of names taken
        view.prefix = prefix
        return view

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors

    def take(self, name: str) -> tuple[Tensor, str]:
        """The tensor ``prefix + name`` and its full name; a clear error if it is missing."""
        full = self.prefix + name
        if full not in self.tensors:
            raise PretrainedError(f"{self.source}: missing tensor '{full}'")
        self.taken.add(full)
        return self.tensors[full], full

    def take_cat(self, names: Iterable[str]) -> tuple[Tensor, str]:
        """Tensors concatenated along dim 0 (separate q/k/v -> our fused projection)."""
        parts = [self.take(name) for name in names]
        return torch.cat([t for t, _ in parts]), "+".join(full for _, full in parts)

    def count(self, template: str) -> int:
        """How many consecutive ``i = 0, 1, ...`` have a tensor ``template.format(i=i)`` (the depth)."""
        n = 0
        while self.has(template.format(i=n)):
            n += 1
        return n

    def check_all_taken(self, ignore: Iterable[str] = (), within: str | None = None) -> None:
        """Fail on tensors under ``within`` (default: the prefix) that were not taken, except
        those matching an ``ignore`` pattern (fnmatch, relative to ``within``)."""
        within = self.prefix if within is None else within
        patterns = [within + pattern for pattern in ignore]
        left = sorted(
            name for name in self.tensors
            if name.startswith(within) and name not in self.taken
            and not any(fnmatch.fnmatchcase(name, p) for p in patterns)
        )  # fmt: skip
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise PretrainedError(
                f"{self.source}: tensors that no conversion rule takes: {shown} "
                "(a variant of the architecture this importer does not support)"
            )


def tied_names(module: nn.Module) -> dict[str, str]:
    """Names of the module's state that alias an earlier name's tensor (tied weights): alias -> name."""
    first: dict[int, str] = {}
    aliases = {}
    items = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in items:
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


def load_converted(module: nn.Module, converted: Converted, source: str, fresh: Iterable[str] = ()) -> list[str]:
    """Copy ``converted`` (our name -> (tensor, the checkpoint's name for it)) into ``module``.

    Every tensor of the module must be given, except tied aliases and names starting with a
    ``fresh`` prefix (layers the checkpoint does not have, left as initialised). Shapes are
    checked first, naming both sides. Returns the names left as initialised.
    """
    own = module.state_dict()
    unknown = sorted(set(converted) - set(own))
    if unknown:  # a conversion rule produced a name the module does not have: a bug here
        raise PretrainedError(f"{source}: converted names {unknown[:5]} are not in {type(module).__name__}")
    for name, (tensor, origin) in converted.items():
        if tensor.shape != own[name].shape:
            raise PretrainedError(
                f"{source}: '{origin}' has shape {tuple(tensor.shape)}, but {type(module).__name__}.{name} "
                f"needs {tuple(own[name].shape)}"
            )
    aliases = tied_names(module)
    fresh = tuple(fresh)
    left = [name for name in own if name not in converted and name not in aliases]
    missing = [name for name in left if not name.startswith(fresh)]
    if missing:
        raise PretrainedError(f"{source}: nothing in the checkpoint for {missing[:5]} of {type(module).__name__}")
    module.load_state_dict({name: tensor for name, (tensor, _) in converted.items()}, strict=False)
    if left:
        log.info(
            "%s: %d tensors of %s are new (as initialised): %s",
            source,
            len(left),
            type(module).__name__,
            ", ".join(left[:6]) + (" ..." if len(left) > 6 else ""),
        )
    return left


def mlp_ratio(hidden: int, dim: int, source: str) -> float:
    """The ``mlp_ratio`` whose ``int(dim * mlp_ratio)`` is exactly ``hidden`` (Mlp's rounding)."""
    ratio = hidden / dim
    if int(dim * ratio) != hidden:
        ratio = math.nextafter(ratio, math.inf)
    if int(dim * ratio) != hidden:
        raise PretrainedError(f"{source}: an MLP width of {hidden} cannot be expressed for width {dim}")
    return ratio


def setting(config: dict[str, Any], key: str, default: Any) -> Any:
    """``config[key]``, or ``default`` where config.json lacks it or holds null."""
    value = config.get(key)
    return default if value is None else value


def check_given(name: str, given: Any, found: Any, source: str) -> None:
    """A setting given in config (so that other settings can refer to it) must match the checkpoint's."""
    if given is not None and given != found:
        raise PretrainedError(f"{source}: {name}={given} was given, but the checkpoint has {name}={found}")


def with_choices(
    found: dict[str, Any],
    source: str,
    *,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    max_length: int | None = None,
    num_heads: int | None = None,
    dropout: float | None = None,
    attn_dropout: float | None = None,
) -> dict[str, Any]:
    """A text tower's constructor arguments: those ``found`` in a checkpoint (``num_heads``: its
    config's, if any), with the caller's choices (see :func:`mmtx.pretrained.load_decoder`)."""
    return {
        **found, "vocab_size": vocab_size or found["vocab_size"], "max_length": max_length or found["max_length"],
        "num_heads": head_count(num_heads, found["num_heads"], found["dim"], source),
        "dropout": found["dropout"] if dropout is None else dropout,
        "attn_dropout": found["attn_dropout"] if attn_dropout is None else attn_dropout,
        "pad_id": found["pad_id"] if pad_id is None else pad_id,
    }  # fmt: skip


def head_count(num_heads: int | None, configured: int | None, dim: int, source: str) -> int:
    """Attention heads: given, else the config's, else ``dim / 64`` (the head width of every ViT,
    BERT and GPT-2 size); weights alone do not tell."""
    heads = num_heads or configured
    if heads is None:
        if dim % 64:
            raise PretrainedError(f"{source}: no config.json gives the number of heads of width {dim}: pass num_heads")
        heads = dim // 64
        log.info("%s: no config.json; assuming %d heads of width 64", source, heads)
    if dim % heads:
        raise PretrainedError(f"{source}: width {dim} is not divisible by {heads} heads")
    return heads


# Hugging Face activation names -> mmtx's (see mmtx.nn.blocks.ACTIVATIONS)
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def activation_name(hf_name: str, source: str) -> str:
    if hf_name not in HF_ACTIVATIONS:
        raise PretrainedError(f"{source}: activation {hf_name!r} is not supported ({', '.join(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[hf_name]


def sub_config(config: dict[str, Any], part: str) -> dict[str, Any]:
    """The ``encoder``/``decoder`` part of a VisionEncoderDecoder's config.json, else the config itself."""
    if config.get("model_type") in ("vision-encoder-decoder", "encoder-decoder") and isinstance(config.get(part), dict):
        return config[part]
    return config


def extend_rows(table: tuple[Tensor, str], rows: int, own: Tensor, source: str, what: str) -> tuple[Tensor, str]:
    """A vocabulary table (embeddings or biases) grown to ``rows``: the checkpoint's rows first, then
    the rows of ``own`` (the module as initialised: new tokens such as an appended [PAD])."""
    tensor, name = table
    if rows < tensor.shape[0]:
        raise PretrainedError(
            f"{source}: {what} has {tensor.shape[0]} entries, more than vocab_size={rows} "
            "(use the checkpoint's tokenizer)"
        )
    # on the device of ``own``: the meta device when a config is only checked (mmtx.config_check)
    return torch.cat([tensor.to(own.device), own[tensor.shape[0] :].to(tensor.dtype)]), name


def context_width(kv: tuple[Tensor, str] | None, context_dim: int | None, default: int, source: str) -> int:
    """The width cross-attention reads: the checkpoint's (from its key/value weight ``kv``, which a
    given ``context_dim`` must match), else ``context_dim``, else ``default`` (the decoder's width)."""
    if kv is None:
        return context_dim or default
    width = kv[0].shape[1]
    if context_dim is not None and context_dim != width:
        raise PretrainedError(
            f"{source}: the checkpoint's cross-attention reads a context of width {width} ('{kv[1]}'), "
            f"context_dim={context_dim} was given"
        )
    return width


def fold_context_projection(t: Tensors, parent: str, converted: Converted, depth: int) -> None:
    """Import a VisionEncoderDecoder's ``enc_to_dec_proj`` into the decoder's cross-attention.

    Where the encoder is wider than the decoder, Hugging Face projects the encoder's tokens
    (``enc_to_dec_proj``, beside ``encoder.`` and ``decoder.``) before every cross-attention reads
    them. mmtx's cross-attention reads the encoder's width itself, so the projection is folded
    into each layer's key/value map, which is exact since both are affine:
    ``W_kv' = W_kv W_p`` and ``b_kv' = W_kv b_p + b_kv`` (computed in float64). ``parent`` is
    where the decoder sits (``decoder.``); ``converted`` is changed in place.
    """
    if not parent.endswith("decoder."):
        return
    root = t.at(parent.removesuffix("decoder."))
    if not root.has("enc_to_dec_proj.weight"):
        return
    (w_p, name), (b_p, _) = root.take("enc_to_dec_proj.weight"), root.take("enc_to_dec_proj.bias")
    for i in range(depth):
        kv = f"body.blocks.{i}.cross_attn.kv"
        if f"{kv}.weight" not in converted:
            raise PretrainedError(
                f"{t.source}: '{name}' projects the encoder's tokens, but the decoder has no cross-attention"
            )
        (w, w_name), (b, b_name) = converted[f"{kv}.weight"], converted[f"{kv}.bias"]
        converted[f"{kv}.weight"] = ((w.double() @ w_p.double()).to(w.dtype), w_name)  # (2D, D_encoder)
        converted[f"{kv}.bias"] = ((w.double() @ b_p.double() + b.double()).to(b.dtype), b_name)


def fit_tables(converted: Converted, module: nn.Module, kwargs: dict[str, Any], source: str, at: str = "") -> None:
    """Grow the word embeddings (and an untied output layer) to the tokenizer's vocabulary, the new
    rows as ``module`` initialised them; keep the positions needed. ``at``: the prefix of the
    embedding tables in ``module`` (``body.`` in a decoder); the output layer is ``lm_head``."""
    own = module.state_dict()
    for name, what in (
        (f"{at}token_embed.weight", "the vocabulary"),
        ("lm_head.weight", "the output projection"),
        ("lm_head.bias", "the output bias"),
    ):
        if name in converted:
            converted[name] = extend_rows(converted[name], kwargs["vocab_size"], own[name], source, what)
    name, rows = f"{at}pos_embed.weight", kwargs["max_length"]
    positions, origin = converted[name]
    if rows > len(positions):
        raise PretrainedError(
            f"{source}: the position table has {len(positions)} positions, max_length={rows} needs more"
        )
    converted[name] = positions[:rows], origin


def output_projection(converted: Converted, weight: tuple[Tensor, str]) -> bool:
    """Whether a checkpoint's output projection ``weight`` is its word embedding (tied); an untied
    one is imported as ``lm_head.weight``."""
    tied = torch.equal(weight[0], converted["body.token_embed.weight"][0])
    if not tied:
        converted["lm_head.weight"] = weight
    return tied
