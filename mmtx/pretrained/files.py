"""Finding and reading pretrained weight files: ``.safetensors`` (also sharded), ``.bin``/``.pth``
(always ``torch.load(weights_only=True)``), and the ``config.json`` beside them."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

log = logging.getLogger(__name__)

# what a directory may hold, in the order they are looked for (Hugging Face and timm names)
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)  # fmt: skip
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


class PretrainedError(ValueError):
    """Pretrained weights that are missing, unreadable, or not of a layout mmtx can import."""


@dataclass
class Pretrained:
    """The tensors of a pretrained checkpoint, the ``config.json`` found with them, and where from."""

    tensors: dict[str, Tensor]
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def read_pretrained(path: str | Path) -> Pretrained:
    """Read a directory (``model.safetensors`` / ``pytorch_model.bin``, sharded or not, plus
    ``config.json``) or one weights file (``config.json`` is read from its folder if there)."""
    path = Path(path).expanduser()
    if path.is_dir():
        weights = next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)
        if weights is None:
            raise PretrainedError(f"{path}: no weights in this directory (looked for {', '.join(WEIGHT_FILES)})")
    elif path.is_file():
        weights = path
    else:
        raise PretrainedError(f"pretrained weights not found: {path}")
    config_path = weights.parent / "config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    return Pretrained(read_weights(weights), config, str(weights))


def read_weights(path: Path) -> dict[str, Tensor]:
    """The state dict in ``path``: a weights file or a ``*.index.json`` naming its shards."""
    if path.name.endswith(".index.json"):
        weight_map = _read_json(path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise PretrainedError(f"{path}: no 'weight_map' in this shard index")
        tensors: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_weights(path.parent / shard))
        return tensors
    if path.suffix not in WEIGHT_SUFFIXES:
        raise PretrainedError(f"{path}: unknown weights format (expected one of {', '.join(WEIGHT_SUFFIXES)})")
    if not path.is_file():
        raise PretrainedError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        try:
            return load_file(path)
        except (SafetensorError, OSError) as e:
            raise PretrainedError(f"{path}: not a readable safetensors file ({e})") from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickled code, truncated archive, not a torch file ...
        raise PretrainedError(f"cannot read {path} with torch.load(weights_only=True): {type(e).__name__}: {e}") from e
    for key in ("state_dict", "model"):  # training checkpoints that wrap the weights
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise PretrainedError(f"{path} does not hold a state dict of tensors")
    return state


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PretrainedError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise PretrainedError(f"{path} does not hold a JSON object")
    return data
