"""Publishing a trained model in an open format, and loading it back without Lightning or pickles.

An export directory holds three files:

- ``model.safetensors``: the weights (a tied weight is stored once, under its first name);
- ``config.json``: the model's constructor config, ``_target_`` classes of ``mmtx.models`` with
  their arguments (enough to rebuild it), and what using it needs: the task it was trained
  for, the image size and normalisation, the decoding settings, a VQA classifier's answers;
- ``tokenizer.json``.

:func:`load_exported` rebuilds the model from these alone; only classes from ``mmtx.models``
may be named in the config, so loading one runs no code from the files.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from mmtx.config_build import build, locate
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from mmtx.file_modes import as_created
from mmtx.pretrained.convert import tied_names
from mmtx.pretrained.files import PretrainedError, read_weights
from mmtx.stored_config import (
    EXPORTED_MODEL,
    PLAIN,
    TASK,
    StoredConfigError,
    check_stored_config,
    check_tokenizer_json,
    constructor_parameters,
    stored_class,
)
from mmtx.tasks.lora import merge_adapters

__all__ = ["ExportError", "Exported", "export", "export_task", "load_exported", "model_config", "task_from_export"]

FORMAT, FORMAT_VERSION = "mmtx", 1
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
MACHINE_SETTINGS = ("few_row_products",)  # decoding settings that belong to the machine, not the model


class ExportError(ValueError):
    """An export that cannot be written, or a directory that is not a valid export."""


class Exported(NamedTuple):
    """A loaded export: the model (eval mode), its tokenizer and the whole ``config.json``."""

    model: nn.Module
    tokenizer: Tokenizer
    config: dict[str, Any]


# ------------------------------------------------------------------------------------ writing


def export(model: nn.Module, tokenizer: Tokenizer, out: str | Path, config: Mapping[str, Any], **info: Any) -> Path:
    """Write ``model`` (built from the constructor ``config``), its tokenizer, and ``info``
    (JSON values for ``config.json``) into the directory ``out``; returns it."""
    out = Path(out)
    try:  # what load_exported will accept
        check_stored_config(config, "config", EXPORTED_MODEL)
    except StoredConfigError as e:
        raise ExportError(str(e)) from e
    aliases = tied_names(model)
    state = {name: tensor for name, tensor in model.state_dict().items() if name not in aliases}
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, **info, "model": dict(config)}
    try:
        text = json.dumps(document, indent=2)
    except TypeError as e:
        raise ExportError(f"the config of {type(model).__name__} is not plain JSON: {e}") from e
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in state.items()}, out / WEIGHTS, metadata={"format": "pt"})
    as_created(out / WEIGHTS)  # safetensors writes it through a temporary file, 0o600: as its neighbours
    tokenizer.save(out / TOKENIZER)
    (out / CONFIG).write_text(text + "\n", encoding="utf-8")
    return out


def export_task(task: Any, out: str | Path) -> Path:
    """Export a trained mmtx task (what :func:`mmtx.checkpoint.load_task` returns): its model,
    tokenizer, the image size it was trained at, its decoding settings and answer vocabulary.
    Low-rank adapters (``task.lora``) are merged into the weights first (in place)."""
    merge_adapters(task)
    model = task.model
    info: dict[str, Any] = {"task": f"{type(task).__module__}.{type(task).__qualname__}"}
    vision = _vision_tower(model)
    if vision is not None:
        size = (getattr(task, "data_config", None) or {}).get("image_size") or vision.image_size
        info.update(image_size=size, image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD))
    if getattr(task, "generation", None) is not None:
        info["generation"] = _model_settings(dataclasses.asdict(task.generation))
    if getattr(task, "answers", None):
        info["answers"] = list(task.answers)
    return export(model, task.tokenizer, out, model_config(task.hparams["model"], model), **info)


def model_config(config: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """The constructor config that rebuilds ``model``, from the ``config`` it was built with.

    What a task filled in at build time (the tokenizer's ``vocab_size`` and ``pad_id``, a
    classifier's ``num_answers`` ...) is read back from the model's attributes of the same
    names where the config leaves them out or null and they differ from the constructor's
    default; a tower loaded from pretrained files (:mod:`mmtx.pretrained`) is replaced by the
    plain architecture it was built with (``build_config``), so the export needs no other file.
    """
    built = getattr(model, "build_config", None)
    if isinstance(built, dict):
        return dict(built)
    if "_target_" not in config:
        raise ExportError(f"no _target_ in the config of {type(model).__name__}")
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and "_target_" in value:
            if not hasattr(model, key):
                raise ExportError(f"config key {key!r} has no matching attribute in {type(model).__name__}")
            out[key] = model_config(value, getattr(model, key))
        else:
            out[key] = value
    for name, default in constructor_parameters(locate(config["_target_"]))[0].items():
        value = getattr(model, name, None)
        if out.get(name) is None and isinstance(value, (bool, int, float, str, list, tuple)) and value != default:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _model_settings(generation: Mapping[str, Any]) -> dict[str, Any]:
    """Decoding settings less `MACHINE_SETTINGS` (the CPU layout: the decoding machine's choice)."""
    return {k: v for k, v in generation.items() if k not in MACHINE_SETTINGS}


def _vision_tower(model: nn.Module) -> nn.Module | None:
    for path in ("encoder", "backbone.vision"):
        module: Any = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if module is not None and hasattr(module, "image_size"):
            return module
    return None


# ------------------------------------------------------------------------------------ reading


def load_exported(path: str | Path, device: str | torch.device = "cpu") -> Exported:
    """Rebuild an exported model (eval mode, on ``device``) with its tokenizer; see the module doc."""
    path = Path(path)
    config = read_export_config(path)
    tokenizer, tensors = _tokenizer(path), _weights(path)
    model = _built_to_fit(lambda: build(config["model"]), tensors, str(path / WEIGHTS))
    load_weights(model, tensors, str(path / WEIGHTS))
    return Exported(model.to(device).eval(), tokenizer, config)


def task_from_export(path: str | Path) -> Any:
    """The mmtx task an export was written from, rebuilt from its three files (eval mode):
    what ``mmtx-caption``, ``mmtx-vqa`` and ``mmtx-eval`` load in place of a checkpoint.

    Its ``data_config`` holds only the image size the model was trained at.
    """
    path = Path(path)
    config = read_export_config(path)
    name = config.get("task")
    if not isinstance(name, str) or not name.startswith("mmtx.tasks."):
        raise ExportError(f"{path / CONFIG}: records no mmtx task ('task'): load the bare model with load_exported")
    try:
        cls = stored_class(name, TASK, f"{path / CONFIG}: task")
    except StoredConfigError as e:  # not a task class, or renamed or removed since the export was written
        raise ExportError(str(e)) from e
    tokenizer = _tokenizer(path)
    arguments = {key: config[key] for key in ("answers", "generation") if key in config}
    if "generation" in arguments:  # exports before MACHINE_SETTINGS recorded the then-default layout
        arguments["generation"] = _model_settings(arguments["generation"])
    data_config = {"image_size": config["image_size"]} if "image_size" in config else None
    tensors = _weights(path)

    def build() -> Any:
        return cls(model=config["model"], tokenizer=tokenizer.to_str(), data_config=data_config, **arguments)

    task = _built_to_fit(build, tensors, str(path / WEIGHTS), lambda task: task.model)
    load_weights(task.model, tensors, str(path / WEIGHTS))
    return task.eval()


def _built_to_fit(
    build: Callable[[], Any],
    tensors: Mapping[str, Tensor],
    source: str,
    model: Callable[[Any], nn.Module] = lambda m: m,
) -> Any:
    """``build()``, once the same build on the meta device (no memory, no time) has shown that
    the config makes a model the stored ``tensors`` fit: a config.json that asks for a huge model
    beside small weights is refused before any memory is taken."""
    with torch.device("meta"):
        try:
            shell = model(build())
        except Exception as e:  # Hydra wraps the constructor's refusal: name the innermost
            while e.__cause__ is not None:
                e = e.__cause__  # type: ignore[assignment]
            raise ExportError(f"{source}: its {CONFIG} does not build a model ({type(e).__name__}: {e})") from e
        check_weights(shell, tensors, source)
    return build()


def _tokenizer(path: Path) -> Tokenizer:
    """The export's tokenizer, its ``tokenizer.json`` checked as data first (`check_tokenizer_json`)."""
    file = path / TOKENIZER
    try:
        check_tokenizer_json(file.read_text(encoding="utf-8"), str(file))
    except OSError as e:
        raise ExportError(f"{file}: cannot read ({e})") from e
    except StoredConfigError as e:
        raise ExportError(str(e)) from e
    return Tokenizer.from_file(file)


def read_export_config(path: Path) -> dict[str, Any]:
    """The checked ``config.json`` of the export directory ``path``."""
    config_path = path / CONFIG
    if not config_path.is_file():
        raise ExportError(f"{path}: not an mmtx export (no {CONFIG})")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ExportError(f"{config_path}: cannot read ({type(e).__name__}: {e})") from e
    if not isinstance(config, dict) or config.get("format") != FORMAT or not isinstance(config.get("model"), dict):
        raise ExportError(f"{config_path}: not an mmtx export config (format {FORMAT!r} with a 'model')")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise ExportError(f"{config_path}: format_version {config['format_version']} is newer than this mmtx reads")
    try:  # only mmtx.models classes may be built; everything else is plain data
        for key, value in config.items():
            check_stored_config(value, f"{config_path}: {key}", EXPORTED_MODEL if key == "model" else PLAIN)
    except StoredConfigError as e:
        raise ExportError(str(e)) from e
    return config


def _weights(path: Path) -> dict[str, Tensor]:
    try:
        return read_weights(path / WEIGHTS)
    except PretrainedError as e:  # missing or unreadable
        raise ExportError(str(e)) from e


def load_weights(model: nn.Module, tensors: Mapping[str, Tensor], source: str) -> None:
    """Load ``tensors`` (tied weights under their first name only) into ``model``, exactly:
    every tensor present, none unknown, every shape right (`check_weights`)."""
    aliases = check_weights(model, tensors, source)
    model.load_state_dict({**tensors, **{alias: tensors[name] for alias, name in aliases.items()}})


def check_weights(model: nn.Module, tensors: Mapping[str, Tensor], source: str) -> dict[str, str]:
    """Refuse ``tensors`` unless they are exactly ``model``'s (names and shapes; tied weights
    under their first name only); returns the tied names (alias -> first name)."""
    aliases = tied_names(model)
    own = {name: t for name, t in model.state_dict().items() if name not in aliases}
    missing, unknown = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unknown:
        raise ExportError(
            f"{source} does not match {type(model).__name__}: missing {missing[:5]}, unknown {unknown[:5]}"
        )
    for name, tensor in tensors.items():
        if tensor.shape != own[name].shape:
            raise ExportError(
                f"{source}: '{name}' has shape {tuple(tensor.shape)}, the model needs {tuple(own[name].shape)}"
            )
    return aliases
