"""What the command-line apps share: the config directory, loggers, callbacks, tokenizers."""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mmtx.callbacks import NonFiniteLossError
from mmtx.checkpoint import CheckpointError
from mmtx.config_check import ConfigError
from mmtx.data.bad_data import BadDataError
from mmtx.data.captions import AnnotationError
from mmtx.data.images import ImageLoadError
from mmtx.data.tokenizer import Tokenizer, TokenizerError
from mmtx.generation import GenerationConfig
from mmtx.hardware import cpu_precision

log = logging.getLogger("mmtx")

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "conf")  # mmtx/conf, package data of the wheel

# ${mmtx.cpu_precision:} in trainer presets: bf16 autocast where the CPU has it natively, else fp32
OmegaConf.register_new_resolver("mmtx.cpu_precision", cpu_precision, replace=True)

# problems with the user's files or settings: reported in one line, not as a traceback
USER_ERRORS = (
    AnnotationError, CheckpointError, ImageLoadError, TokenizerError, FileNotFoundError, NonFiniteLossError,
    ConfigError, BadDataError,
)


def friendly_errors(fn: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """Exit with ``mmtx: <message>`` (status 1) when ``fn`` fails on bad input."""

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig) -> Any:
        try:
            return fn(cfg)
        except USER_ERRORS as e:
            sys.exit(f"mmtx: {e}")

    return wrapper


def instantiate_dict(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every ``_target_`` entry of a ``name: {_target_: ...}`` group (loggers, callbacks)."""
    if not cfg:
        return []
    return [instantiate(node) for node in cfg.values() if isinstance(node, DictConfig) and "_target_" in node]


def build_tokenizer(cfg: DictConfig, texts: list[str]) -> Tokenizer:
    """Load ``cfg.path`` if given, else train a vocabulary on ``texts`` (the training captions)."""
    if cfg.path:
        return Tokenizer.from_file(cfg.path)
    if not texts:
        raise ConfigError("tokenizer: no training captions to learn a vocabulary from (set tokenizer.path)")
    return Tokenizer.train(texts, vocab_size=cfg.vocab_size, kind=cfg.kind, min_frequency=cfg.min_frequency)


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def make_trainer(cfg: DictConfig, loggers: list, callbacks: list) -> L.Trainer:
    return instantiate(cfg.trainer, logger=loggers or False, callbacks=callbacks)


def generation_override(config: GenerationConfig, overrides: DictConfig | None) -> GenerationConfig:
    """``config`` with the non-null ``generation.*`` values given on the command line."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return dataclasses.replace(config, **given) if given else config
