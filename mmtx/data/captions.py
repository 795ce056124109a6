"""Read the official caption annotation formats (COCO, Karpathy splits) into `CaptionRecord`s.

The readers validate every entry they return, up front, and report problems as an
`AnnotationError` naming the file and the offending entries, e.g.
``captions_val2014.json: annotations[17].caption: expected a string, got null``, so that a
bad download fails at start-up instead of as a KeyError deep inside a data loader worker.
A problem with the whole file (not found, not JSON, no ``images`` array) is raised at once;
problems with single entries (missing keys, wrong types, duplicate ids, empty or non-UTF-8
text, unknown image ids) are collected and raised together, or, when the caller passes a
``skipped`` list, the entries are left out and one line per problem is appended to it.
Image files are not opened or checked for existence here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from mmtx.data.bad_data import listing

KARPATHY_TRAIN_EXTRA = "restval"  # Karpathy's convention: "train" also takes these images


@dataclass(frozen=True)
class CaptionRecord:
    """One image and all its reference captions (possibly none, e.g. for a test split)."""

    image_id: int
    path: Path
    captions: tuple[str, ...]


class AnnotationError(ValueError):
    """An annotation file is missing, not JSON, or does not have the expected structure."""


class EntryProblems:
    """Problems with single entries of one annotation file: raised together at the end, or
    handed to the caller's ``skipped`` list (the entries are then left out)."""

    def __init__(self, file: Path, skipped: list[str] | None) -> None:
        self.file, self.skipped = file, skipped
        self.found: list[str] = []

    def add(self, problem: AnnotationError | str) -> None:
        self.found.append(str(problem))

    def finish(self) -> None:
        """Hand the problems over, or raise them as one AnnotationError."""
        if self.skipped is not None:
            self.skipped.extend(self.found)
        elif len(self.found) == 1:
            raise AnnotationError(self.found[0])
        elif self.found:
            raise AnnotationError(f"{self.file}: {len(self.found)} bad entries:\n{listing(self.found)}")


def read_coco_captions(
    annotations: str | os.PathLike, images: str | os.PathLike, skipped: list[str] | None = None
) -> list[CaptionRecord]:
    """Read an official COCO captions file (``captions_<split>.json``).

    Returns one record per entry of ``images[]``, sorted by image id, with
    ``path = images / file_name`` and the captions of that image in file order, with
    whitespace normalised. Images without captions are kept with an empty tuple (the
    caller decides whether that is an error for its split). Bad entries raise one
    `AnnotationError` naming them all, or with a ``skipped`` list are left out (an image
    entry with its captions; a repeated image id keeps its first entry) and described there.
    """
    file = Path(annotations)
    root = Path(images)
    data = _load_json_object(file)
    image_entries = _require(data, "images", list, file, "")
    ann_entries = _require(data, "annotations", list, file, "")
    problems = EntryProblems(file, skipped)

    paths: dict[int, Path] = {}
    dropped: set[int] = set()  # ids of image entries left out: their captions go too, unreported
    for i, entry in enumerate(image_entries):
        where = f"images[{i}]"
        try:
            entry = _as_object(entry, file, where)
            image_id = _require(entry, "id", int, file, where)
            if image_id in paths:
                raise AnnotationError(f"{file}: {where}.id: duplicate image id {image_id}")
            dropped.add(image_id)
            file_name = _require(entry, "file_name", str, file, where)
            paths[image_id] = _join_inside(root, file_name, file, f"{where}.file_name")
            dropped.discard(image_id)
        except AnnotationError as err:
            problems.add(err)

    captions: dict[int, list[str]] = {image_id: [] for image_id in paths}
    for i, entry in enumerate(ann_entries):
        where = f"annotations[{i}]"
        try:
            entry = _as_object(entry, file, where)
            image_id = _require(entry, "image_id", int, file, where)
            if image_id in dropped:
                continue
            text = _require(entry, "caption", str, file, where)
            if image_id not in captions:
                raise AnnotationError(f"{file}: {where}.image_id: image id {image_id} is not in images[]")
            captions[image_id].append(_clean_caption(text, file, f"{where}.caption"))
        except AnnotationError as err:
            problems.add(err)

    problems.finish()
    return [CaptionRecord(image_id, paths[image_id], tuple(captions[image_id])) for image_id in sorted(paths)]


def read_karpathy(
    annotations: str | os.PathLike, images: str | os.PathLike, split: str, skipped: list[str] | None = None
) -> list[CaptionRecord]:
    """Read one split of a Karpathy ``dataset_{coco,flickr8k,flickr30k}.json`` file.

    ``split="train"`` also includes the ``restval`` images. The image id is ``cocoid``
    when present, else ``imgid``; ``path = images / filepath / filename`` (``filepath`` is
    absent in the Flickr files); each caption is the sentence's ``raw`` text, or its
    ``tokens`` joined by spaces when ``raw`` is missing. Records are sorted by image id.
    Bad entries (and bad sentences) raise or are skipped as in `read_coco_captions`.
    """
    file = Path(annotations)
    root = Path(images)
    data = _load_json_object(file)
    entries = _require(data, "images", list, file, "")
    problems = EntryProblems(file, skipped)

    splits: list[str | None] = []
    for i, entry in enumerate(entries):
        try:
            splits.append(_require(_as_object(entry, file, f"images[{i}]"), "split", str, file, f"images[{i}]"))
        except AnnotationError as err:
            splits.append(None)
            problems.add(err)
    present = sorted({s for s in splits if s is not None})
    wanted = {split, KARPATHY_TRAIN_EXTRA} if split == "train" else {split}
    if not wanted & set(present):
        unsplit = f"; entries without a valid split:\n{listing(problems.found)}" if problems.found else ""
        raise AnnotationError(
            f"{file}: no images in split {split!r}; splits present: {', '.join(present)}{unsplit}"
        )

    records: dict[int, CaptionRecord] = {}
    for i, entry in enumerate(entries):
        if splits[i] not in wanted:
            continue
        where = f"images[{i}]"
        try:
            if entry.get("cocoid") is not None:
                image_id = _require(entry, "cocoid", int, file, where)
            else:
                image_id = _require(entry, "imgid", int, file, where)
            if image_id in records:
                raise AnnotationError(f"{file}: {where}: duplicate image id {image_id} in split {split!r}")
            filename = _require(entry, "filename", str, file, where)
            filepath = _optional(entry, "filepath", str, file, where)
            relative = f"{filepath}/{filename}" if filepath else filename
            path = _join_inside(root, relative, file, f"{where}.filepath/filename")
            sentences = _require(entry, "sentences", list, file, where)
        except AnnotationError as err:
            problems.add(err)
            continue
        captions = []
        for j, sentence in enumerate(sentences):
            try:
                captions.append(_karpathy_sentence(sentence, file, f"{where}.sentences[{j}]"))
            except AnnotationError as err:
                problems.add(err)
        records[image_id] = CaptionRecord(image_id, path, tuple(captions))
    problems.finish()
    return [records[image_id] for image_id in sorted(records)]


def write_coco_captions(
    records: Iterable[CaptionRecord],
    path: str | os.PathLike,
    images: str | os.PathLike,
    sizes: Mapping[int, tuple[int, int]] | None = None,
    info: Mapping[str, Any] | None = None,
) -> None:
    """Write `records` as an official COCO captions JSON file, atomically.

    ``file_name`` is each record's path relative to `images` (so `read_coco_captions(path,
    images)` returns the same records); `sizes` optionally maps image id -> (width, height).
    Annotation ids are assigned 1, 2, ... in record order.
    """
    root = Path(images)
    image_entries: list[dict[str, Any]] = []
    ann_entries: list[dict[str, Any]] = []
    seen: set[int] = set()
    for record in records:
        if record.image_id in seen:
            raise ValueError(f"duplicate image id {record.image_id} while writing {path}")
        seen.add(record.image_id)
        try:
            file_name = record.path.relative_to(root).as_posix()
        except ValueError:
            raise ValueError(f"image {record.path} (id {record.image_id}) is not under {root}") from None
        entry: dict[str, Any] = {"id": record.image_id, "file_name": file_name}
        if sizes is not None and record.image_id in sizes:
            entry["width"], entry["height"] = sizes[record.image_id]
        image_entries.append(entry)
        for caption in record.captions:
            ann_entries.append({"id": len(ann_entries) + 1, "image_id": record.image_id, "caption": caption})

    document = {"info": dict(info or {}), "licenses": [], "images": image_entries, "annotations": ann_entries}
    _atomic_write_json(Path(path), document)


def _atomic_write_json(path: Path, document: Any) -> None:
    """Write JSON next to `path` and rename it into place, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_json_object(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; bytes that are not UTF-8 survive as lone surrogates
    (``surrogateescape``), so that inside a string they are blamed on that entry alone."""
    try:
        text = file.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    except FileNotFoundError:
        raise AnnotationError(f"{file}: annotation file not found") from None
    except OSError as err:
        raise AnnotationError(f"{file}: cannot read annotation file: {err}") from err
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
    return _as_object(data, file, "top level")


def _invalid_text(text: str) -> str | None:
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


def _as_object(value: Any, file: Path, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AnnotationError(f"{file}: {where}: expected a JSON object, got {_json_type(value)}")
    return value


def _require(entry: dict[str, Any], key: str, kind: type, file: Path, where: str) -> Any:
    """`entry[key]`, which must exist and be of JSON type `kind` (bool is not an int here)."""
    label = f"{where}.{key}" if where else key
    if key not in entry:
        raise AnnotationError(f"{file}: {label}: missing key {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise AnnotationError(f"{file}: {label}: expected {_JSON_TYPES[kind]}, got {_json_type(value)}")
    if kind is int and not _INT64[0] <= value <= _INT64[1]:
        raise AnnotationError(f"{file}: {label}: {value} is out of range (ids are 64-bit integers)")
    if kind is str and (reason := _invalid_text(value)):
        raise AnnotationError(f"{file}: {label}: {reason}")
    return value


def _optional(entry: dict[str, Any], key: str, kind: type, file: Path, where: str) -> Any:
    return _require(entry, key, kind, file, where) if entry.get(key) is not None else None


_INT64 = (-(2**63), 2**63 - 1)
_JSON_TYPES = {int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _clean_caption(text: str, file: Path, where: str) -> str:
    """Collapse runs of whitespace (COCO captions contain stray newlines and double spaces)."""
    caption = " ".join(text.split())
    if not caption:
        raise AnnotationError(f"{file}: {where}: empty caption")
    return caption


def _karpathy_sentence(sentence: Any, file: Path, where: str) -> str:
    sentence = _as_object(sentence, file, where)
    raw = _optional(sentence, "raw", str, file, where)
    if raw is not None and raw.strip():
        return _clean_caption(raw, file, f"{where}.raw")
    tokens = _require(sentence, "tokens", list, file, where)
    if not all(isinstance(token, str) and not _invalid_text(token) for token in tokens):
        raise AnnotationError(f"{file}: {where}.tokens: expected an array of UTF-8 strings")
    return _clean_caption(" ".join(tokens), file, f"{where}.tokens")


def _join_inside(root: Path, relative: str, file: Path, where: str) -> Path:
    """`root / relative`, refusing names that are empty, absolute or climb out with '..'."""
    if "\0" in relative:
        raise AnnotationError(f"{file}: {where}: file name {relative!r} contains a NUL byte")
    for flavour in (PurePosixPath(relative), PureWindowsPath(relative)):
        if not relative or flavour.is_absolute() or flavour.anchor or ".." in flavour.parts:
            raise AnnotationError(f"{file}: {where}: file name {relative!r} escapes the image root {root}")
    return root / relative
