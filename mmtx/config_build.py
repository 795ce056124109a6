"""Objects built from the configs mmtx writes, in plain Python.

A config is a tree of mappings: a node with ``_target_`` is built by calling that class (or
function) with its other keys, each built first; ``_partial_: true`` gives a `functools.partial`
instead (a decoder that its parent finishes with the widths it knows). That is the part of
Hydra's ``instantiate`` that mmtx's configs use, and all that `mmtx.stored_config` admits in a
file. Written out here (a dozen lines) so that a task builds its model, and an export loads, with
torch alone: Hydra composes the command line's configs in `mmtx.cli` and the start-up check, and
nowhere below them.

A constructor's error leaves the builder as it was raised, marked with the dotted key of the node
whose constructor raised it (`failed_node`), so that the start-up check can name the config keys
without reading any message.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_NODE = "mmtx_config_node"  # the attribute a constructor's error is marked with
_OPTIONS = ("_target_", "_partial_")


def build(config: Mapping[str, Any], *, key: str = "", **overrides: Any) -> Any:
    """``config`` built, ``overrides`` merged in first: a mapping merges into the node of that
    name (``decoder={"vocab_size": 9}`` sets the decoder's vocabulary and keeps its other keys).
    ``key`` is where ``config`` sits in the caller's own config (``model``): the prefix of the
    nodes an error is marked with."""
    return _build(_merged(config, overrides), key)


def failed_node(error: BaseException) -> str | None:
    """The dotted key of the config node whose constructor raised ``error`` (``model.encoder``),
    or None if no build raised it."""
    return getattr(error, _NODE, None)


def locate(path: str) -> Callable[..., Any]:
    """The class or function ``module.name`` names (one import, one attribute)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(f"cannot import {path!r}: {e}") from e


def _merged(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(config)
    for name, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(name), Mapping):
            out[name] = _merged(out[name], value)
        else:
            out[name] = value
    return out


def _build(node: Any, key: str) -> Any:
    if isinstance(node, Mapping):
        arguments = {
            name: _build(value, f"{key}.{name}" if key else str(name))
            for name, value in node.items()
            if name not in _OPTIONS
        }
        if "_target_" not in node:
            return arguments
        target = locate(node["_target_"])
        if node.get("_partial_"):
            return functools.partial(_marked, target, key, arguments)
        return _marked(target, key, arguments)
    if isinstance(node, Sequence) and not isinstance(node, str):
        return [_build(value, f"{key}.{i}" if key else str(i)) for i, value in enumerate(node)]
    return node


def _marked(target: Callable[..., Any], key: str, arguments: dict[str, Any], **more: Any) -> Any:
    """``target(**arguments, **more)``; an error it raises is marked with ``key`` unless a node
    inside already marked it (the innermost constructor is the one that refused)."""
    try:
        return target(**arguments, **more)
    except Exception as error:
        if failed_node(error) is None:
            setattr(error, _NODE, key)
        raise
