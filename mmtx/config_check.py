"""Settings that cannot work, refused at start-up with the key and the values allowed.

`check_train_config` runs first thing in ``mmtx-train`` (before any data is generated, read or
scanned), `check_eval_config` in ``mmtx-eval`` and `check_shards_config` in ``mmtx-shards``; each
collects every problem it finds and raises them together as one `ConfigError`. Each rule lives in
one place:

- a value no constructor checks on its own (a model size, an optimiser rate, a Trainer argument,
  a file that must exist) is checked here, by key;
- what a constructor refuses (every data setting, heads that do not divide the width, an image
  size that is not a multiple of the patch size, a BPE vocabulary below its byte alphabet, a
  tower shorter than the data's captions) is found by building the tokenizer, the data module and the task once, as
  cheaply as they build: the data module reads nothing before ``setup`` and the task is built
  on the meta device with a stand-in tokenizer. A constructor refuses with an
  `mmtx.config_error.ArgumentError`, which carries the arguments it names, and the refusal is
  reported under the keys that gave them: ``dim=30 is not divisible by num_heads=4`` from the
  encoder built from ``model.encoder`` reads::

    model.encoder.dim=30 is not divisible by model.encoder.num_heads=4 (allowed: a multiple of 4, e.g. 28 or 32)

A key that a constructor does not take (``+data.batchsize=8``) is found in its signature before
anything is built and reported as one its node does not have, with the closest key there is
(`unknown_keys`, `mmtx.config_error.not_a_key`). A resumed checkpoint is checked where ``mmtx-train`` reads it
(`mmtx.checkpoint.check_resume`). Unknown group options (``data=nope``) never get here: Hydra
refuses them, listing the options; nor do overrides of keys the config lacks (``data.batchsize=8``):
the apps refuse them first (`mmtx.cli.common.check_override_keys`).
"""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mmtx.checkpoint import read_checkpoint, rebuild_task
from mmtx.config_build import build, failed_node, locate
from mmtx.config_error import ArgumentError, ConfigError, is_int, is_number, not_a_key
from mmtx.data.splits import SPLITS
from mmtx.data.tokenizer import Tokenizer
from mmtx.generation import GenerationConfig
from mmtx.nn.embeddings import PatchEmbed
from mmtx.stored_config import constructor_keys


def _rule(allowed: str, test: Callable[[Any], bool]) -> Callable[[Any, str], list[str]]:
    """A check of one value: no problem, or ``KEY=VALUE must be ALLOWED``."""
    return lambda value, key: [] if test(value) else [f"{key}={value!r} must be {allowed}"]


_positive_int = _rule("a positive integer", lambda v: is_int(v) and v > 0)
_optional_positive_int = _rule("a positive integer", lambda v: v is None or (is_int(v) and v > 0))
_non_negative_int = _rule("an integer >= 0", lambda v: is_int(v) and v >= 0)
_positive_number = _rule("a positive number", lambda v: is_number(v) and v > 0)
_fraction = _rule("a number in [0, 1)", lambda v: is_number(v) and 0 <= v < 1)

_MODEL_RULES = {  # checked in every node of the model config that has the key
    **dict.fromkeys(
        ("dim", "num_heads", "patch_size", "image_size", "max_length", "joint_dim", "itc_dim", "in_chans"),
        _optional_positive_int,
    ),
    **dict.fromkeys(("depth", "co_layers"), _non_negative_int),
    **dict.fromkeys(("dropout", "attn_dropout"), _fraction),
    **dict.fromkeys(("mlp_ratio", "hidden_mult"), _positive_number),
}
_TASK_RULES = {  # checked where the task has the key
    "lr": _positive_number,
    "weight_decay": _rule("a number >= 0", lambda v: is_number(v) and v >= 0),
    "warmup_ratio": _fraction,
    "label_smoothing": _fraction,
    "min_lr_ratio": _rule("a number in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
    "num_answers": _positive_int,
    "rerank": _positive_int,
    "num_samples": _non_negative_int,
    "retrieval_images": _non_negative_int,
}


def check_train_config(cfg: DictConfig) -> None:
    """Refuse an ``mmtx-train`` config that cannot work, naming every bad key at once."""
    groups = ("data", "model", "task", "tokenizer")
    missing = {group: _unset(cfg[group], group) for group in groups}
    problems = [p for group in groups for p in missing[group]]
    by_value = {
        "data": unset_split_files(cfg.data, splits=("train", "val")),
        "model": model_problems(cfg.model),
        "task": task_problems(cfg.task),
        "tokenizer": tokenizer_problems(cfg.tokenizer),
    }
    unknown = {group: unknown_keys(cfg[group], group) for group in groups if not missing[group]}
    problems += [p for group in groups for p in by_value[group] + unknown.get(group, [])]
    problems += trainer_problems(cfg.trainer)
    if not isinstance(cfg.get("activation_checkpointing", False), bool):
        problems.append(f"activation_checkpointing={cfg.activation_checkpointing!r} must be true or false")
    if cfg.get("init_from") and not cfg.get("ckpt_path") and not Path(cfg.init_from).is_file():  # a resume ignores it
        problems.append(f"init_from={cfg.init_from}: no such checkpoint file")
    # the optimiser's values (task.lr ...) and unset data files stop nothing from being built and checked
    broken = {
        group
        for group in groups
        if missing[group] or unknown.get(group) or (by_value[group] and group not in ("task", "data"))
    }
    problems += build_problems(cfg, broken)
    _raise(problems)


def check_eval_config(cfg: DictConfig) -> None:
    """Refuse an ``mmtx-eval`` config that cannot work, naming every bad key at once."""
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise ConfigError(
            "invalid config:\n  ckpt is not set: give the checkpoint to evaluate, e.g. ckpt=RUN/checkpoints/last.ckpt"
        )
    problems = _unset(cfg.data, "data") if cfg.get("data") else []
    if cfg.split not in SPLITS:
        problems.append(f"split={cfg.split!r} is not one of {', '.join(SPLITS)}")
    image_size = cfg.get("image_size")
    problems += _optional_positive_int(image_size, "image_size")
    if cfg.get("data"):
        problems += unset_split_files(cfg.data, splits=(cfg.split,)) + data_built_problems(cfg)
    given = {k: v for k, v in (cfg.get("generation") or {}).items() if v is not None}
    try:  # what GenerationConfig refuses in the command line's generation overrides
        GenerationConfig(**{"max_new_tokens": 32, **given})
    except (TypeError, ValueError) as err:
        problems.append(str(err) if str(err).startswith("generation:") else f"generation: {err}")
    if is_int(image_size) and image_size > 0 and Path(str(cfg.ckpt)).is_file():
        with torch.device("meta"):  # its image towers, without weights
            task = rebuild_task(read_checkpoint(cfg.ckpt, mmap=True), cfg.ckpt)
        problems += [
            f"image_size={image_size} is not a multiple of the checkpoint's {name.removesuffix('.patch_embed')}"
            f".patch_size={module.patch_size} (allowed: {_multiples(module.patch_size)})"
            for name, module in task.named_modules()
            if isinstance(module, PatchEmbed) and image_size % module.patch_size
        ]
    _raise(problems)


def check_shards_config(cfg: DictConfig) -> None:
    """Refuse an ``mmtx-shards`` config that cannot work, naming every bad key at once."""
    problems = data_built_problems(cfg)
    if OmegaConf.is_missing(cfg, "out"):
        problems.append("out is not set: give the folder to write the shards to, e.g. out=shards/")
    problems += _positive_int(cfg.shard_size, "shard_size") + _positive_int(cfg.quality, "quality")
    _raise(problems + _optional_positive_int(cfg.image_size, "image_size"))


# --- what the constructors refuse -------------------------------------------------------------


def build_problems(cfg: DictConfig, broken: set[str] = frozenset()) -> list[str]:
    """Build the tokenizer, the data module and the task from ``cfg`` as cheaply as they build
    (nothing read, no weights) and report what their constructors refuse under the keys that
    gave the arguments. Groups in ``broken`` (already reported) are not built."""
    problems: list[str] = []
    tokenizer = None
    if "tokenizer" not in broken:
        tokenizer = _built(problems, cfg, "tokenizer", lambda: _stand_in_tokenizer(cfg.tokenizer))
    if "data" not in broken:
        _built(
            problems, cfg, "data", lambda: build(_plain(cfg.data), key="data", tokenizer=tokenizer or Tokenizer.train)
        )
    if tokenizer is not None and not {"model", "task"} & broken:
        arguments = locate(cfg.task._target_).stand_in_data_arguments()
        with torch.device("meta"), warnings.catch_warnings():
            # public weights loaded into meta tensors (model=caption_pretrained): a no-op, as meant
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
            _built(problems, cfg, "task", lambda: build_task(cfg, tokenizer, arguments))
    return problems


def build_task(cfg: DictConfig, tokenizer: Tokenizer, data_arguments: dict[str, Any]) -> Any:
    """The task of ``cfg.task``, given the model and data configs as plain dicts (it builds the
    model itself), the tokenizer as JSON and what the data decides (``data_arguments``)."""
    settings = _plain(cfg.task)
    task = locate(settings.pop("_target_"))
    return task(
        **settings,
        model=_plain(cfg.model),
        tokenizer=tokenizer.to_str(),
        data_config=_plain(cfg.data),
        **data_arguments,
    )


def _stand_in_tokenizer(tokenizer: DictConfig) -> Tokenizer:
    """The run's tokenizer file, or one learned as the run would learn it, from a few words."""
    if tokenizer.get("path"):
        return Tokenizer.from_file(tokenizer.path)
    return Tokenizer.train(
        ["a stand-in text"], vocab_size=tokenizer.vocab_size, kind=tokenizer.kind, min_frequency=tokenizer.min_frequency
    )


# the task is given the whole model and data configs, under other names
_TASK_ARGUMENTS = {"model": "model", "data_config": "data", "tokenizer": "tokenizer"}
# keys of a node that Hydra reads itself rather than passing them to the target
_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def unknown_keys(node: Any, path: str) -> list[str]:
    """A problem for each key that the ``_target_`` of its node (``node`` or one under it) does not
    take, read from the constructors' signatures: ``+data.batchsize=8`` is named before anything
    is built."""
    problems = []
    for where, config in _nodes(node, path):
        accepted = _constructor_keys(config.get("_target_")) if "_target_" in config else None
        if accepted is not None:
            keys = [str(k) for k in config]
            problems += [not_a_key(f"{where}.{k}", keys) for k in keys if k not in accepted | _HYDRA_KEYS]
    return problems


def _constructor_keys(target: Any) -> set[str] | None:
    """The keys ``target`` takes (`mmtx.stored_config.constructor_keys`), None where unknown."""
    try:
        return constructor_keys(locate(str(target)))
    except Exception:  # not importable: instantiating it reports that
        return None


def _built(problems: list[str], cfg: DictConfig, group: str, build: Callable[[], Any]) -> Any:
    """``build()``, or None with its refusal appended to ``problems`` under its keys."""
    try:
        return build()
    except (ValueError, TypeError, OSError, ImportError) as error:
        # the builder marks a constructor's error with its node (model.encoder); unmarked: the
        # task's or the tokenizer's own constructor refused
        node = failed_node(error) or group
        renames = _TASK_ARGUMENTS if node == "task" else {}
        if isinstance(error, ArgumentError):
            problems.append(error.render(_config_keys(cfg, node, renames)))
        else:
            problems.append(f"{node}: {error}")
        return None


def _config_keys(cfg: DictConfig, node: str, renames: dict[str, str]) -> Callable[[str, str], str]:
    """How an `ArgumentError` of the constructor built from ``node`` writes an argument: as the
    config key it came from (``dim`` -> ``model.encoder.dim``), followed by "(set by
    data.image_size)" where the config interpolated the value from another key."""
    config = OmegaConf.select(cfg, node)
    arguments = set(config) if isinstance(config, DictConfig) else set()

    def argument(name: str, shown: str) -> str:
        first, dot, rest = name.partition(".")
        if first in renames:
            key = renames[first] + dot + rest
        elif first in arguments:
            key = f"{node}.{name}"
        else:
            return name + shown
        parent, _, last = key.rpartition(".")
        return key + (shown + _source(OmegaConf.select(cfg, parent), last) if shown else "")

    return argument


def _plain(node: DictConfig) -> dict:
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


# --- data -------------------------------------------------------------------------------------


def unset_split_files(data: Any, key: str = "data", splits: tuple[str, ...] = ()) -> list[str]:
    """A problem for each file of ``splits`` that a ``data`` config leaves unset (its values are
    the data module's to refuse: `data_built_problems`)."""
    get = data.get
    problems = []
    for split in splits:  # data.<split>: {annotations, images, ...} of the file-based sources
        files = get(split)
        if isinstance(files, DictConfig):
            problems += [
                f"{key}.{split}.{name} is not set: give the {split} split's {name}, e.g. {key}.{split}.{name}=..."
                for name, value in files.items()
                if value is None
            ]
    return problems


def data_built_problems(cfg: DictConfig) -> list[str]:
    """What the data module of ``cfg.data`` refuses when it is built (it reads nothing then)."""
    problems: list[str] = []
    _built(problems, cfg, "data", lambda: build(_plain(cfg.data), key="data", tokenizer=Tokenizer.train))
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
    strategy = trainer.get("strategy")
    if isinstance(strategy, DictConfig) and str(strategy.get("_target_")).startswith("mmtx.strategies."):
        try:  # its own checks, before any data is read (building it starts no process group)
            instantiate(strategy)
        except InstantiationException as e:
            problems.append(f"{key}.strategy: {e.__cause__ or e}")
    accelerator, devices = str(trainer.get("accelerator", "auto")), trainer.get("devices", "auto")
    count = devices if is_int(devices) else None
    if accelerator in ("gpu", "cuda"):
        visible = torch.cuda.device_count()
        if not visible:
            problems.append(
                f"{key}.accelerator={accelerator}: this machine has no GPU that torch can use; "
                "train on the CPU with trainer=cpu"
            )
        elif count is not None and count > visible:
            problems.append(f"{key}.devices={count}: only {visible} GPU(s) are visible; use {key}.devices<={visible}")
    elif accelerator == "cpu":
        cores = os.cpu_count() or 1
        if count is not None and count > cores:
            problems.append(
                f"{key}.devices={count} would start {count} processes on {cores} CPU core(s), which "
                f"slows every one of them; use {key}.devices<={cores}"
            )
        precision = str(trainer.get("precision"))
        if precision not in _CPU_PRECISIONS:
            problems.append(
                f"{key}.precision={precision} does not run on the CPU; use one of "
                f"{', '.join(p for p in _CPU_PRECISIONS if '-' in p)}"
            )
    return problems


# --- model ------------------------------------------------------------------------------------


def model_problems(model: DictConfig) -> list[str]:
    """Values that cannot be sizes, depths or rates anywhere in ``model`` (what the values
    allow together, the constructors check when the task is built)."""
    problems: list[str] = []
    for path, node in _nodes(model, "model"):
        for key, check in _MODEL_RULES.items():
            if key in node:
                problems += [p + _source(node, key) for p in check(node.get(key), f"{path}.{key}")]
    return problems


# --- task, tokenizer --------------------------------------------------------------------------


def task_problems(task: Any) -> list[str]:
    """What is wrong with the optimiser and schedule settings of ``task`` (its objectives and
    generation settings are checked by their constructors when the task is built)."""
    problems = [p for key, check in _TASK_RULES.items() if key in task for p in check(task[key], f"task.{key}")]
    if "betas" in task and not (len(task.betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in task.betas)):
        problems.append(f"task.betas={_show(task.betas)} must be two numbers in [0, 1)")
    return problems


def tokenizer_problems(tokenizer: Any) -> list[str]:
    """A given tokenizer file must exist (what ``Tokenizer.train`` refuses is found by building)."""
    if tokenizer.get("path"):
        return [] if Path(tokenizer.path).exists() else [f"tokenizer.path={tokenizer.path}: no such file or directory"]
    return _positive_int(tokenizer.get("min_frequency"), "tokenizer.min_frequency")


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


def _unset(node: Any, path: str) -> list[str]:
    """A problem for each dotted key under ``node`` whose value is still the mandatory ``???``."""
    found = []
    for key in node:
        child = node._get_node(key)  # unresolved: interpolations may need a running Hydra app
        if OmegaConf.is_missing(node, key):
            found.append(f"{path}.{key} is not set (??? in the config): give it, e.g. {path}.{key}=...")
        elif isinstance(child, DictConfig):
            found += _unset(child, f"{path}.{key}")
    return found


def _source(node: Any, key: str) -> str:
    """ " (set by data.image_size)" when ``node[key]`` is an interpolation: the key to change."""
    if isinstance(node, DictConfig) and OmegaConf.is_interpolation(node, key):
        source = str(node._get_node(key)._value())  # e.g. "${data.image_size}"
        return f" (set by {source[2:-1] if source.startswith('${') else source})"
    return ""


def _multiples(step: int) -> str:
    return f"a multiple of {step}: {step}, {2 * step}, {3 * step}, ..."


def _show(value: Any) -> str:
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
