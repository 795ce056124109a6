"""Data sets mmtx draws itself: built once, in a temporary sibling folder, then moved into place.

A generated data set's folder holds a ``meta.json`` with its parameters (and a ``format`` name).
Asking again with the same parameters reuses it; other parameters rebuild it; a crash never
leaves half a data set, and a folder that is not such a data set is never overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mmtx.file_modes import as_created

log = logging.getLogger(__name__)


def build_once(
    root: Path,
    meta: dict[str, Any],
    files: Iterable[Path],
    build: Callable[[Path, dict[str, Any]], None],
    what: str,
    draw: bool = True,
) -> None:
    """Make ``root`` hold the data set ``meta`` describes, calling ``build(staging, meta)`` if it must.

    ``files`` are the paths a complete data set has under ``root``; ``what`` names the data set
    in errors and in the log. ``draw=False`` only reuses one (FileNotFoundError if it is not
    there): for a config read from a file, which must not decide where mmtx writes.
    """
    files = list(files)
    if _read_meta(root, meta["format"]) == meta and all(p.exists() for p in files):
        log.info("reusing the %s at %s", what, root)
        return
    if not draw:
        raise FileNotFoundError(
            f"{root} holds no {what} drawn with these settings ({_settings(meta)}), and mmtx "
            "draws none where a checkpoint says: give the data, e.g. data=shapes"
        )
    _check_replaceable(root, meta["format"], what)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    as_created(staging)  # mkdtemp's 0o700: the mode mkdir() would have given the data set's folder
    start = time.perf_counter()
    try:
        build(staging, meta)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if _read_meta(root, meta["format"]) == meta and all(p.exists() for p in files):
            return  # another process finished the same data set first
        _check_replaceable(root, meta["format"], what)
        stale = None
        if root.is_dir() and any(root.iterdir()):
            stale = root.with_name(f".{root.name}.stale-{secrets.token_hex(4)}")
            os.replace(root, stale)
        elif root.is_dir():
            root.rmdir()
        os.replace(staging, root)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful install
    log.info("wrote the %s to %s in %.1f s", what, root, time.perf_counter() - start)


def _settings(meta: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in meta.items() if k not in ("format", "version"))


def _read_meta(root: Path, fmt: str) -> dict[str, Any] | None:
    """The parsed ``meta.json`` of a data set of format ``fmt`` at ``root``, or None."""
    try:
        meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == fmt else None


def _check_replaceable(root: Path, fmt: str, what: str) -> None:
    """Refuse to replace anything but nothing, an empty directory or a data set of this format."""
    if not root.exists():
        return
    if not root.is_dir():
        raise FileExistsError(f"{root} exists and is not a directory; cannot write a {what} there")
    if any(root.iterdir()) and _read_meta(root, fmt) is None:
        raise FileExistsError(f"{root} is a non-empty directory that is not a {what}; refusing to overwrite it")
