"""Files and folders written through a temporary one get the mode a plain ``open()`` or
``mkdir()`` gives them: 0o666 (0o777 for a folder) less the process's umask, readable by the
others a shared machine's umask lets read them. ``tempfile.mkstemp`` makes 0o600 files and
``mkdtemp`` 0o700 folders, and safetensors writes its file through such a temporary one."""

from __future__ import annotations

import os
from pathlib import Path


def umask() -> int:
    """The process's umask: from /proc where Linux shows it; elsewhere read by setting it (to the
    strictest value for the moment it takes) and setting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def as_created(path: str | os.PathLike) -> None:
    """Give ``path`` (a file or a folder) the mode it would have had if made by ``open()`` or
    ``mkdir()``."""
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask())
