"""What the commands share: their data's file paths, the groups they instantiate, the image size
and decoding settings of a checkpoint's task."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelSummary, ProgressBar
from omegaconf import DictConfig, ListConfig, OmegaConf

from mmtx.generation import GenerationConfig

log = logging.getLogger("mmtx")


def callbacks_for(trainer: DictConfig, callbacks: DictConfig | None) -> list[Any]:
    """The callbacks group's callbacks (`instantiate_dict`) less its progress bar and model summary
    where ``trainer.enable_progress_bar=false`` or ``trainer.enable_model_summary=false`` turns them
    off: Lightning refuses a progress bar beside the one, and runs a summary it is given whatever
    the other says."""
    off = tuple(
        kind
        for key, kind in (("enable_progress_bar", ProgressBar), ("enable_model_summary", ModelSummary))
        if trainer.get(key) is False
    )
    return [cb for cb in instantiate_dict(callbacks) if not (off and isinstance(cb, off))]


DATA_FILE_KEYS = ("annotations", "images", "questions", "file", "shards")  # the user's files in a data config


def absolute_data_paths(data: DictConfig) -> None:
    """Make the data config's file paths (and a generated set's ``root``) absolute, in place, so
    that the config a checkpoint records works from any directory."""
    for node in (data, *(data.get(split) for split in ("train", "val", "test"))):
        if not isinstance(node, DictConfig):
            continue
        for key in (*DATA_FILE_KEYS, "root"):
            value = node.get(key)
            if isinstance(value, str) and value:
                node[key] = _absolute(value)
            elif isinstance(value, ListConfig):  # e.g. a list of shards
                node[key] = [_absolute(str(v)) for v in value]


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def instantiate_dict(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every ``_target_`` entry of a ``name: {_target_: ...}`` group (loggers, callbacks)."""
    if not cfg:
        return []
    return [instantiate(node) for node in cfg.values() if isinstance(node, DictConfig) and "_target_" in node]


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def image_size(task: Any, given: int | None = None) -> int:
    """``given`` (the command line's ``image_size``), else the size ``task`` was trained at: its
    data config's, else its image tower's (a captioner's encoder, a VQA backbone's vision tower)."""
    tower = task.model.encoder if hasattr(task.model, "encoder") else task.model.backbone.vision
    return given or (task.data_config or {}).get("image_size") or tower.image_size


def generation_override(config: GenerationConfig, overrides: DictConfig | None) -> GenerationConfig:
    """``config`` with the non-null ``generation.*`` values given on the command line."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return dataclasses.replace(config, **given) if given else config
