"""Annotation JSON read entry by entry, with errors that name the file and the entry.

What the caption and VQA readers share: `AnnotationError` (a problem, in one line, e.g.
``captions_val2014.json: annotations[17].caption: expected a string, got null``),
`EntryProblems` (problems with single entries, raised together or handed to a ``skipped``
list, and texts cut to the text limit), typed access to an entry's keys, file names kept
inside their image root, and atomic writes.

Annotation files are untrusted (often scraped): a whole file may be large (COCO's and VQA's
run to hundreds of MB), but each caption, question and answer keeps at most ``max_chars``
characters (the `TextLimit` a reader is given, from ``data.max_text_chars``), so that one huge
entry costs neither a tokenizer pass per batch nor a metric's memory; the cut texts are counted
and logged per file, and listed in the `TextLimit`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from mmtx.data.bad_data import listing
from mmtx.file_modes import as_created

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 2000  # data.max_text_chars by default: COCO's longest caption has a few hundred


@dataclass
class TextLimit:
    """The most characters a caption, question or answer keeps, and each text a reader given this
    limit cut to it (``"FILE: ENTRY"``, its length), for a data module's report."""

    max_chars: int = MAX_TEXT_CHARS
    cut: list[tuple[str, int]] = field(default_factory=list)


class AnnotationError(ValueError):
    """An annotation file is missing, not JSON, or does not have the expected structure."""


class EntryProblems:
    """Problems with single entries of one annotation file: raised together at the end, or
    handed to the caller's ``skipped`` list (the entries are then left out). Also counts the
    texts its reader cut to ``limit`` (`bounded`; None: a fresh `TextLimit` of `MAX_TEXT_CHARS`),
    to log them per file at the end and list them in ``limit.cut``."""

    def __init__(self, file: Path, skipped: list[str] | None, limit: TextLimit | None = None) -> None:
        self.file, self.skipped = file, skipped
        self.found: list[str] = []
        self.limit = TextLimit() if limit is None else limit
        self.cut: dict[Path, list[int]] = {}  # file -> the lengths of its texts cut

    def add(self, problem: AnnotationError | str) -> None:
        self.found.append(str(problem))

    def bounded(self, text: str, where: str, file: Path | None = None) -> str:
        """``text`` (of entry ``where`` of ``file``, default this reader's file) cut to the text
        limit's ``max_chars``; a cut is counted. Call it once the entry is known to be good."""
        if len(text) <= self.limit.max_chars:
            return text
        file = self.file if file is None else file
        self.cut.setdefault(file, []).append(len(text))
        self.limit.cut.append((f"{file}: {where}", len(text)))
        return text[: self.limit.max_chars]

    def finish(self) -> None:
        """Log the texts cut (one line per file), then hand the problems over, or raise them as
        one AnnotationError."""
        for file, lengths in self.cut.items():
            log.warning(
                "%s: cut %d text(s) longer than data.max_text_chars=%d characters (the longest has %d)",
                file,
                len(lengths),
                self.limit.max_chars,
                max(lengths),
            )
        self.cut = {}
        if self.skipped is not None:
            self.skipped.extend(self.found)
        elif len(self.found) == 1:
            raise AnnotationError(self.found[0])
        elif self.found:
            raise AnnotationError(f"{self.file}: {len(self.found)} bad entries:\n{listing(self.found)}")


def atomic_write_json(path: Path, document: Any) -> None:
    """Write JSON next to `path` and rename it into place, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False)
        as_created(tmp)  # mkstemp's 0o600: the mode open() would have given
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_text(file: Path, what: str = "annotation file") -> str:
    """The text of ``file``; bytes that are not UTF-8 survive as lone surrogates
    (``surrogateescape``), so that inside a string they are blamed on that entry alone."""
    if file.exists() and not file.is_file():  # a folder, a device (/dev/zero), a pipe: endless or nothing
        raise AnnotationError(f"{file}: {what} is not a regular file")
    try:
        return file.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    except FileNotFoundError:
        raise AnnotationError(f"{file}: {what} not found") from None
    except OSError as err:
        raise AnnotationError(f"{file}: cannot read {what}: {err}") from err


def load_json_object(file: Path) -> dict[str, Any]:
    """The JSON object in ``file`` (its text as `read_text` gives it)."""
    text = read_text(file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        position = f"line {err.lineno} column {err.colno}"
        odd = ord(text[err.pos]) if err.pos < len(text) else 0
        if 0xDC80 <= odd <= 0xDCFF:  # surrogateescape's stand-in for a byte that is not UTF-8
            raise AnnotationError(f"{file}: not UTF-8 text at {position} (byte 0x{odd - 0xDC00:02x})") from err
        raise AnnotationError(f"{file}: invalid JSON at {position}: {err.msg}") from err
    except RecursionError as err:
        raise AnnotationError(f"{file}: invalid JSON: nested too deeply") from err
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise AnnotationError(f"{file}: invalid JSON: {err}") from err
    return as_object(data, file, "top level")


def invalid_text(text: str) -> str | None:
    """Why ``text`` is not valid Unicode (None if it is): a byte that was not UTF-8, or a
    lone surrogate from a ``\\ud800``-style escape, which no tokenizer can encode."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = ord(text[err.start])
        if 0xDC80 <= char <= 0xDCFF:  # surrogateescape's stand-in for a raw byte
            return f"byte 0x{char - 0xDC00:02x} at character {err.start} is not UTF-8"
        return f"lone surrogate U+{char:04X} at character {err.start} is not valid Unicode"
    return None


def as_object(value: Any, file: Path, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AnnotationError(f"{file}: {where}: expected a JSON object, got {json_type(value)}")
    return value


def require(entry: dict[str, Any], key: str, kind: type, file: Path, where: str) -> Any:
    """`entry[key]`, which must exist and be of JSON type `kind` (bool is not an int here)."""
    label = f"{where}.{key}" if where else key
    if key not in entry:
        raise AnnotationError(f"{file}: {label}: missing key {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise AnnotationError(f"{file}: {label}: expected {_JSON_TYPES[kind]}, got {json_type(value)}")
    if kind is int and not _INT64[0] <= value <= _INT64[1]:
        raise AnnotationError(f"{file}: {label}: {value} is out of range (ids are 64-bit integers)")
    if kind is str and (reason := invalid_text(value)):
        raise AnnotationError(f"{file}: {label}: {reason}")
    return value


def optional(entry: dict[str, Any], key: str, kind: type, file: Path, where: str) -> Any:
    return require(entry, key, kind, file, where) if entry.get(key) is not None else None


_INT64 = (-(2**63), 2**63 - 1)
_JSON_TYPES = {int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def join_inside(root: Path, relative: str, file: Path, where: str) -> Path:
    """`root / relative`, refusing names that are empty, absolute or climb out with '..'."""
    if "\0" in relative:
        raise AnnotationError(f"{file}: {where}: file name {relative!r} contains a NUL byte")
    for flavour in (PurePosixPath(relative), PureWindowsPath(relative)):
        if not relative or flavour.is_absolute() or flavour.anchor or ".." in flavour.parts:
            raise AnnotationError(f"{file}: {where}: file name {relative!r} escapes the image root {root}")
    return root / relative
