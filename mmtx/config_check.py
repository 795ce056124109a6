"""Settings that cannot work, refused at start-up with the key and the values allowed.

`check_train_config` runs first thing in ``mmtx-train`` (before any data is generated, read or
scanned) and `check_eval_config` in ``mmtx-eval``; each collects every problem it finds and
raises them together as one `ConfigError`, e.g.::

    model.encoder.dim=30 is not divisible by model.encoder.num_heads=4 (allowed: a multiple of 4, e.g. 28 or 32)

A resumed checkpoint is checked where ``mmtx-train`` reads it (`mmtx.checkpoint.check_resume`).
Unknown group options (``data=nope``) never get here: Hydra refuses them, listing the options.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from mmtx.checkpoint import read_checkpoint
from mmtx.data.bad_data import POLICIES
from mmtx.data.base import SPLITS
from mmtx.generation import GenerationConfig
from mmtx.nn.embeddings import POSITION_KINDS

TOKENIZER_KINDS = ("wordpiece", "bpe")
SHAPES_MIN_IMAGE_SIZE = 32  # the smallest size shapes scenes are drawn at
_BPE_MIN_VOCAB = 7 + 256  # special tokens + the byte alphabet
_POSITIVE = ("dim", "num_heads", "patch_size", "image_size", "max_length", "joint_dim", "itc_dim", "in_chans")
_NON_NEGATIVE = ("depth", "co_layers")
_PROBABILITIES = ("dropout", "attn_dropout")  # in [0, 1)


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the values allowed."""


def check_train_config(cfg: DictConfig) -> None:
    """Refuse an ``mmtx-train`` config that cannot work, naming every bad key at once."""
    problems = [f"{key} is not set (??? in the config): give it, e.g. {key}=..."
                for group in ("data", "model", "task", "tokenizer") for key in _missing(cfg[group], group)]
    problems += [*data_problems(cfg.data, splits=("train", "val")), *model_problems(cfg), *task_problems(cfg.task)]
    problems += tokenizer_problems(cfg.tokenizer) + trainer_problems(cfg.trainer)
    if cfg.get("init_from") and not Path(cfg.init_from).is_file():
        problems.append(f"init_from={cfg.init_from}: no such checkpoint file")
    _raise(problems)


def check_eval_config(cfg: DictConfig) -> None:
    """Refuse an ``mmtx-eval`` config that cannot work, naming every bad key at once."""
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise ConfigError("invalid config:\n  ckpt is not set: give the checkpoint to evaluate, e.g. ckpt=RUN/checkpoints/last.ckpt")
    problems = [f"{key} is not set (??? in the config): give it, e.g. {key}=..."
                for key in (_missing(cfg.data, "data") if cfg.get("data") else [])]
    if cfg.split not in SPLITS:
        problems.append(f"split={cfg.split!r} is not one of {', '.join(SPLITS)}")
    image_size = cfg.get("image_size")
    if image_size is not None:
        problems += _positive_int(image_size, "image_size")
    if cfg.get("data"):
        problems += data_problems(cfg.data, splits=(cfg.split,))
    given = {k: v for k, v in (cfg.get("generation") or {}).items() if v is not None}
    problems += _generation_problems(given, "generation")
    if isinstance(image_size, int) and image_size > 0 and Path(str(cfg.ckpt)).is_file():
        model = read_checkpoint(cfg.ckpt, mmap=True).get("hyper_parameters", {}).get("model")
        for path, node in _nodes(model if isinstance(model, dict) else {}, "model"):
            patch = node.get("patch_size") if str(node.get("_target_", "")).endswith("VisionEncoder") else None
            if isinstance(patch, int) and patch > 0 and image_size % patch:
                problems.append(
                    f"image_size={image_size} is not a multiple of the checkpoint's {path}.patch_size={patch} "
                    f"(allowed: {_multiples(patch)})"
                )
    _raise(problems)


# --- data -------------------------------------------------------------------------------------


def data_problems(data: Any, key: str = "data", splits: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with a ``data`` config (any source); the files of ``splits`` must be given."""
    get = data.get
    problems = []
    for split in splits:  # data.<split>: {annotations, images, ...} of the file-based sources
        files = get(split)
        if isinstance(files, DictConfig):
            problems += [f"{key}.{split}.{name} is not set: give the {split} split's {name}, e.g. {key}.{split}.{name}=..."
                         for name, value in files.items() if value is None]
    problems += _positive_int(get("image_size"), f"{key}.image_size")
    problems += _positive_int(get("batch_size"), f"{key}.batch_size")
    if get("eval_batch_size") is not None:
        problems += _positive_int(get("eval_batch_size"), f"{key}.eval_batch_size")
    workers = get("num_workers")
    if not _is_int(workers) or workers < 0:
        problems.append(f"{key}.num_workers={workers!r} must be an integer >= 0 (0: load in the main process)")
    length = get("max_length")
    if not _is_int(length) or length < 3:
        problems.append(f"{key}.max_length={length!r} must be an integer >= 3 ([BOS], a token, [EOS])")
    crop = get("crop_scale")
    if crop is not None and not (
        len(crop) == 2 and all(_is_number(v) for v in crop) and 0 < crop[0] <= crop[1] <= 1
    ):
        problems.append(f"{key}.crop_scale={_show(crop)} must be null or [lo, hi] with 0 < lo <= hi <= 1")
    for policy in ("on_bad_image", "on_bad_annotation"):
        if policy in data and get(policy) not in POLICIES and not _source(data, policy):  # else: reported at its source
            problems.append(f"{key}.{policy}={get(policy)!r} is not one of {', '.join(POLICIES)}")
    if str(get("_target_", "")).split(".")[-1] in ("ShapesCaptions", "ShapesVqa"):
        size = get("image_size")
        if _is_int(size) and 0 < size < SHAPES_MIN_IMAGE_SIZE:
            problems.append(f"{key}.image_size={size} is below {SHAPES_MIN_IMAGE_SIZE}, the smallest shapes scenes")
        for count in ("num_train", "num_val", "captions_per_image", "questions_per_image"):
            if count in data:
                problems += _positive_int(get(count), f"{key}.{count}")
    return problems


# --- trainer ----------------------------------------------------------------------------------

_CPU_PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true", "64-true", "64")


def trainer_problems(trainer: Any, key: str = "trainer") -> list[str]:
    """Arguments the Trainer does not take, and devices or precisions this machine cannot run."""
    problems = []
    accepted = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    for name in trainer:
        if name != "_target_" and name not in accepted:
            close = difflib.get_close_matches(str(name), accepted, n=1)
            hint = f" (did you mean {key}.{close[0]}?)" if close else ""
            problems.append(f"{key}.{name} is not an argument of lightning's Trainer{hint}")
    accelerator, devices = str(trainer.get("accelerator", "auto")), trainer.get("devices", "auto")
    count = devices if _is_int(devices) else None
    if accelerator in ("gpu", "cuda"):
        visible = torch.cuda.device_count()
        if not visible:
            problems.append(f"{key}.accelerator={accelerator}: this machine has no GPU that torch can use; "
                            "train on the CPU with trainer=cpu")
        elif count is not None and count > visible:
            problems.append(f"{key}.devices={count}: only {visible} GPU(s) are visible; use {key}.devices<={visible}")
    elif accelerator == "cpu":
        cores = os.cpu_count() or 1
        if count is not None and count > cores:
            problems.append(f"{key}.devices={count} would start {count} processes on {cores} CPU core(s), which "
                            f"slows every one of them; use {key}.devices<={cores}")
        precision = str(trainer.get("precision"))
        if precision not in _CPU_PRECISIONS:
            problems.append(f"{key}.precision={precision} does not run on the CPU; use one of "
                            f"{', '.join(p for p in _CPU_PRECISIONS if '-' in p)}")
    return problems


# --- model ------------------------------------------------------------------------------------


def model_problems(cfg: DictConfig) -> list[str]:
    """What is wrong with ``cfg.model``: sizes, head splits, patches, positions, text lengths."""
    problems: list[str] = []
    model = cfg.model
    for path, node in _nodes(model, "model"):
        problems += _tower_problems(node, path)
    data_length = cfg.data.get("max_length")
    text_tower = "decoder" if str(cfg.task._target_).endswith("CaptionTask") else "backbone.text"
    tower = OmegaConf.select(model, text_tower)
    if tower is not None and _is_int(data_length) and _is_int(tower.get("max_length")):
        if tower.max_length < data_length:
            problems.append(
                f"model.{text_tower}.max_length={tower.max_length} is shorter than data.max_length={data_length} "
                f"(allowed: >= {data_length})"
            )
    context = OmegaConf.select(model, "decoder.context_dim")
    for source in ("encoder.dim", "backbone.vision.dim"):
        width = OmegaConf.select(model, source)
        if _is_int(context) and _is_int(width) and context != width:
            problems.append(f"model.decoder.context_dim={context} must equal model.{source}={width}")
    return problems


def _tower_problems(node: Any, path: str) -> list[str]:
    """Problems of one config node with model sizes (a tower, a head, the whole model)."""
    problems = []
    for key in _POSITIVE:
        if key in node and node.get(key) is not None:
            problems += [p + _source(node, key) for p in _positive_int(node.get(key), f"{path}.{key}")]
    for key in _NON_NEGATIVE:
        if key in node and (not _is_int(node.get(key)) or node.get(key) < 0):
            problems.append(f"{path}.{key}={node.get(key)!r} must be an integer >= 0{_source(node, key)}")
    for key in _PROBABILITIES:
        if key in node and not (_is_number(node.get(key)) and 0 <= node.get(key) < 1):
            problems.append(f"{path}.{key}={node.get(key)!r} must be a number in [0, 1)")
    for key in ("mlp_ratio", "hidden_mult"):
        if key in node and not (_is_number(node.get(key)) and node.get(key) > 0):
            problems.append(f"{path}.{key}={node.get(key)!r} must be a positive number")
    if problems:
        return problems  # the checks below need sound numbers

    dim, heads = node.get("dim"), node.get("num_heads")
    vision = str(node.get("_target_", "")).endswith("VisionEncoder")
    if _is_int(dim) and _is_int(heads) and dim % heads:
        lower, upper = dim - dim % heads, dim - dim % heads + heads
        example = f"{lower} or {upper}" if lower else str(upper)
        problems.append(
            f"{path}.dim={dim} is not divisible by {path}.num_heads={heads} "
            f"(allowed: a multiple of {heads}, e.g. {example})"
        )
    kind = node.get("pos_embed")
    if "pos_embed" in node and kind not in POSITION_KINDS:
        problems.append(f"{path}.pos_embed={kind!r} is not one of {', '.join(POSITION_KINDS)}")
    elif kind == "rope" and _is_int(dim) and _is_int(heads) and not dim % heads:
        step = 4 if vision else 2  # rotary pairs per axis: 2-D for patches, 1-D for text
        if (dim // heads) % step:
            problems.append(
                f"{path}.pos_embed=rope needs a head width ({path}.dim / {path}.num_heads = {dim // heads}) "
                f"divisible by {step}"
            )
    elif kind == "sinusoidal" and _is_int(dim):
        step = 4 if vision else 2
        if dim % step:
            problems.append(f"{path}.pos_embed=sinusoidal needs {path}.dim divisible by {step}, got {dim}")

    size, patch = node.get("image_size"), node.get("patch_size")
    vision = vision or str(node.get("_target_", "")).endswith("load_vit")  # a ViT from public weights
    if vision and _is_int(size) and _is_int(patch):
        if size < patch or size % patch:
            relation = "smaller than" if size < patch else "not a multiple of"
            problems.append(
                f"{path}.image_size={size}{_source(node, 'image_size')} is {relation} {path}.patch_size={patch} "
                f"(allowed: {_multiples(patch)})"
            )
    return problems


# --- task, tokenizer --------------------------------------------------------------------------


def task_problems(task: Any) -> list[str]:
    """What is wrong with the optimiser, schedule, objectives and generation of ``task``."""
    problems = []
    if "lr" in task and not (_is_number(task.lr) and task.lr > 0):
        problems.append(f"task.lr={task.lr!r} must be a positive number")
    if "weight_decay" in task and not (_is_number(task.weight_decay) and task.weight_decay >= 0):
        problems.append(f"task.weight_decay={task.weight_decay!r} must be a number >= 0")
    for key in ("warmup_ratio", "label_smoothing"):
        if key in task and not (_is_number(task[key]) and 0 <= task[key] < 1):
            problems.append(f"task.{key}={task[key]!r} must be a number in [0, 1)")
    if "min_lr_ratio" in task and not (_is_number(task.min_lr_ratio) and 0 <= task.min_lr_ratio <= 1):
        problems.append(f"task.min_lr_ratio={task.min_lr_ratio!r} must be a number in [0, 1]")
    if "betas" in task and not (
        len(task.betas) == 2 and all(_is_number(b) and 0 <= b < 1 for b in task.betas)
    ):
        problems.append(f"task.betas={_show(task.betas)} must be two numbers in [0, 1)")
    for key in ("num_answers", "rerank"):
        if key in task:
            problems += _positive_int(task[key], f"task.{key}")
    for key in ("num_samples", "retrieval_images"):
        if key in task and (not _is_int(task[key]) or task[key] < 0):
            problems.append(f"task.{key}={task[key]!r} must be an integer >= 0")
    objectives = task.get("objectives")
    if objectives:
        weights = ("mlm", "mpm", "itm", "itc")
        for key in weights:
            if key in objectives and not (_is_number(objectives[key]) and objectives[key] >= 0):
                problems.append(f"task.objectives.{key}={objectives[key]!r} must be a number >= 0 (0: off)")
        for key in ("mask_prob", "patch_mask_prob", "patch_replace_prob", "negative_prob"):
            if key in objectives and not (_is_number(objectives[key]) and 0 <= objectives[key] <= 1):
                problems.append(f"task.objectives.{key}={objectives[key]!r} must be a number in [0, 1]")
        if all(_is_number(objectives.get(k, 0)) and objectives.get(k, 0) == 0 for k in weights):
            problems.append("task.objectives: every loss weight (mlm, mpm, itm, itc) is 0; set one > 0")
    if task.get("generation"):
        given = {k: v for k, v in task.generation.items() if v is not None}
        problems += _generation_problems(given, "task.generation")
    return problems


def tokenizer_problems(tokenizer: Any) -> list[str]:
    """What is wrong with the ``tokenizer`` settings (a given file must exist)."""
    if tokenizer.get("path"):
        path = Path(tokenizer.path)
        return [] if path.exists() else [f"tokenizer.path={tokenizer.path}: no such file or directory"]
    problems = []
    kind = tokenizer.get("kind")
    if kind not in TOKENIZER_KINDS:
        problems.append(f"tokenizer.kind={kind!r} is not one of {', '.join(TOKENIZER_KINDS)}")
    size = tokenizer.get("vocab_size")
    low = _BPE_MIN_VOCAB if kind == "bpe" else 8
    if not _is_int(size) or size < low:
        problems.append(f"tokenizer.vocab_size={size!r} must be an integer >= {low} for tokenizer.kind={kind}")
    frequency = tokenizer.get("min_frequency")
    problems += _positive_int(frequency, "tokenizer.min_frequency")
    return problems


def _generation_problems(given: dict[str, Any], key: str) -> list[str]:
    try:
        GenerationConfig(**{"max_new_tokens": 32, **given})
    except (TypeError, ValueError) as err:
        return [f"{key}: {err}"]
    return []


# --- helpers ----------------------------------------------------------------------------------


def _raise(problems: list[str]) -> None:
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"  {p}" for p in problems))


def _nodes(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every mapping in a config tree with its dotted path, the root first."""
    if isinstance(node, (DictConfig, dict)):
        yield path, node
        for key in node:
            child = node.get(key)
            if isinstance(child, (DictConfig, dict)):
                yield from _nodes(child, f"{path}.{key}")


def _missing(node: Any, path: str) -> list[str]:
    """The dotted keys under ``node`` whose value is still the mandatory ``???``."""
    found = []
    for key in node:
        child = node._get_node(key)  # unresolved: interpolations may need a running Hydra app
        if OmegaConf.is_missing(node, key):
            found.append(f"{path}.{key}")
        elif isinstance(child, DictConfig):
            found += _missing(child, f"{path}.{key}")
    return found


def _source(node: Any, key: str) -> str:
    """" (set by data.image_size)" when ``node[key]`` is an interpolation: the key to change."""
    if isinstance(node, DictConfig) and OmegaConf.is_interpolation(node, key):
        source = str(node._get_node(key)._value())  # e.g. "${data.image_size}"
        return f" (set by {source[2:-1] if source.startswith('${') else source})"
    return ""


def _positive_int(value: Any, key: str) -> list[str]:
    return [] if _is_int(value) and value > 0 else [f"{key}={value!r} must be a positive integer"]


def _multiples(step: int) -> str:
    return f"a multiple of {step}: {step}, {2 * step}, {3 * step}, ..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value: Any) -> str:
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
