"""Experiment loggers: Weights & Biases (offline when there is no account), CSV."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger


def wandb_credentials() -> bool:
    """True when W&B can log online: an API key in the environment or a ``wandb login`` netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc(os.environ.get("NETRC", Path.home() / ".netrc"))
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].rstrip("/")
    return auth.authenticators(host) is not None


def wandb_logger(project: str = "mmtx", save_dir: str = ".", mode: str = "auto", **kwargs: Any) -> WandbLogger:
    """A :class:`WandbLogger` that runs offline unless credentials exist (``mode=auto``).

    An offline run is written to ``save_dir/wandb/offline-run-*`` and can be uploaded later with
    ``wandb sync DIR``. ``mode`` may also be ``online``, ``offline`` or ``disabled``; a
    ``WANDB_MODE`` environment variable wins over ``auto``.
    """
    if mode not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"logger.mode={mode!r} is not one of auto, online, offline, disabled")
    if mode == "auto":
        mode = os.environ.get("WANDB_MODE") or ("online" if wandb_credentials() else "offline")
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    # keep W&B's staging files (e.g. the images of logged tables) with the run, not in ~/.local
    os.environ.setdefault("WANDB_DATA_DIR", str(Path(save_dir) / "wandb"))
    return WandbLogger(project=project, save_dir=save_dir, offline=mode == "offline", mode=mode, **kwargs)
