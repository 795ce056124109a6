"""Checkpoint files that are either whole or absent: never a half-written ``last.ckpt``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes to a temporary file beside the target, syncs it to disk, then renames it over the target.

    A rename within a directory is atomic, so a run killed while saving leaves the previous
    checkpoint intact. Remote paths (``s3://...``) go through Lightning's default writer.

    Why not Lightning's own ``_atomic_save``: it serialises into memory, then writes through an
    fsspec transaction, whose local files are staged in the system temporary directory and moved
    over the target at commit, without an fsync. Where that directory is on another file system
    than the run (a node's local ``/tmp`` beside a shared run directory), the move is a copy,
    which a kill can leave half-written.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)  # the rename itself survives a power cut


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not possible on every platform/file system
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
