"""Read the official caption annotation formats (COCO, Karpathy splits) into `CaptionRecord`s.

The readers validate every entry they return, up front, and report problems as an
`AnnotationError` naming the file and the offending entries, e.g.
``captions_val2014.json: annotations[17].caption: expected a string, got null``, so that a
bad download fails at start-up instead of as a KeyError deep inside a data loader worker.
A problem with the whole file (not found, not JSON, no ``images`` array) is raised at once;
problems with single entries (missing keys, wrong types, duplicate ids, empty or non-UTF-8
text, unknown image ids) are collected and raised together, or, when the caller passes a
``skipped`` list, the entries are left out and one line per problem is appended to it.
A caption longer than the readers' ``limit`` (a `mmtx.data.annotations.TextLimit`; none given:
`MAX_TEXT_CHARS`) is cut to it and listed in ``limit.cut``, and a JSONL line longer than
`MAX_LINE_CHARS` or a CSV row the csv module refuses is a bad row.
Image files are not opened or checked for existence here.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmtx.data.annotations import (
    AnnotationError,
    EntryProblems,
    TextLimit,
    as_object,
    atomic_write_json,
    invalid_text,
    join_inside,
    json_type,
    load_json_object,
    optional,
    read_text,
    require,
)
from mmtx.data.bad_data import listing

KARPATHY_TRAIN_EXTRA = "restval"  # Karpathy's convention: "train" also takes these images
MAX_LINE_CHARS = 2**20  # the longest JSONL line of a pairs file: a few captions take a few kB


@dataclass(frozen=True)
class CaptionRecord:
    """One image and all its reference captions (possibly none, e.g. for a test split)."""

    image_id: int
    path: Path
    captions: tuple[str, ...]


def read_coco_captions(
    annotations: str | os.PathLike,
    images: str | os.PathLike,
    skipped: list[str] | None = None,
    limit: TextLimit | None = None,
) -> list[CaptionRecord]:
    """Read an official COCO captions file (``captions_<split>.json``).

    Returns one record per entry of ``images[]``, sorted by image id, with
    ``path = images / file_name`` and the captions of that image in file order, with
    whitespace normalised. Images without captions are kept with an empty tuple (the
    caller decides whether that is an error for its split). Bad entries raise one
    `AnnotationError` naming them all, or with a ``skipped`` list are left out (an image
    entry with its captions; a repeated image id keeps its first entry) and described there.
    """
    file, root = Path(annotations), Path(images)
    data = load_json_object(file)
    image_entries = require(data, "images", list, file, "")
    ann_entries = require(data, "annotations", list, file, "")
    problems = EntryProblems(file, skipped, limit)

    paths: dict[int, Path] = {}
    dropped: set[int] = set()  # ids of image entries left out: their captions go too, unreported
    for i, entry in enumerate(image_entries):
        where = f"images[{i}]"
        try:
            entry = as_object(entry, file, where)
            image_id = require(entry, "id", int, file, where)
            if image_id in paths:
                raise AnnotationError(f"{file}: {where}.id: duplicate image id {image_id}")
            dropped.add(image_id)
            file_name = require(entry, "file_name", str, file, where)
            paths[image_id] = join_inside(root, file_name, file, f"{where}.file_name")
            dropped.discard(image_id)
        except AnnotationError as err:
            problems.add(err)

    captions: dict[int, list[str]] = {image_id: [] for image_id in paths}
    for i, entry in enumerate(ann_entries):
        where = f"annotations[{i}]"
        try:
            entry = as_object(entry, file, where)
            image_id = require(entry, "image_id", int, file, where)
            if image_id in dropped:
                continue
            text = require(entry, "caption", str, file, where)
            if image_id not in captions:
                raise AnnotationError(f"{file}: {where}.image_id: image id {image_id} is not in images[]")
            caption = _clean_caption(text, file, f"{where}.caption")
            captions[image_id].append(problems.bounded(caption, f"{where}.caption"))
        except AnnotationError as err:
            problems.add(err)

    problems.finish()
    return [CaptionRecord(image_id, paths[image_id], tuple(captions[image_id])) for image_id in sorted(paths)]


def read_pairs(
    file: str | os.PathLike,
    images: str | os.PathLike,
    skipped: list[str] | None = None,
    limit: TextLimit | None = None,
) -> list[CaptionRecord]:
    """Read a file of (image, caption) rows: JSONL (one object per line), CSV (a header row) or
    Parquet (``image`` and ``caption`` columns; needs pyarrow, the extra ``mmtx[parquet]``).

    ``image`` is a path relative to ``images``; ``caption`` a string, or in JSONL a list of
    strings. Rows naming the same image add to its captions; image ids are 1, 2, ... in order of
    first appearance. Bad rows (named by line) raise or are skipped as in `read_coco_captions`.
    """
    file, root = Path(file), Path(images)
    if file.suffix.lower() not in (".jsonl", ".csv", ".parquet"):
        raise AnnotationError(
            f"{file}: a pairs file is .jsonl, .csv or .parquet, not {file.suffix or 'without a suffix'}"
        )
    problems = EntryProblems(file, skipped, limit)
    captions: dict[Path, list[str]] = {}
    for where, row in _rows(file):
        try:
            if isinstance(row, AnnotationError):
                raise row
            row = as_object(row, file, where)
            path = join_inside(root, require(row, "image", str, file, where), file, f"{where}.image")
            given = row.get("caption")
            texts = given if isinstance(given, list) and given else [require(row, "caption", str, file, where)]
            for k, text in enumerate(texts):  # a list's items: strings of valid text, as `require` checks one
                problem = invalid_text(text) if isinstance(text, str) else f"expected a string, got {json_type(text)}"
                if problem:
                    raise AnnotationError(f"{file}: {where}.caption[{k}]: {problem}")
            cleaned = [_clean_caption(t, file, f"{where}.caption") for t in texts]  # before the image is added
            captions.setdefault(path, []).extend(problems.bounded(t, f"{where}.caption") for t in cleaned)
        except AnnotationError as err:
            problems.add(err)
    problems.finish()
    return [CaptionRecord(k + 1, path, tuple(texts)) for k, (path, texts) in enumerate(captions.items())]


def _rows(file: Path) -> Iterator[tuple[str, Any]]:
    """("line N", row) for each row of a JSONL or CSV file (("row N", row) of a Parquet file); a
    JSONL line that is not JSON or longer than `MAX_LINE_CHARS`, or a CSV row the csv module
    refuses (e.g. a field over ``csv.field_size_limit()``), gives its `AnnotationError` as the
    row, to be reported with the other bad rows."""
    if file.suffix.lower() == ".parquet":
        yield from _parquet_rows(file)
        return
    text = read_text(file, "pairs file")
    if file.suffix.lower() == ".csv":
        yield from _csv_rows(file, text)
        return
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE_CHARS:
            yield (
                f"line {number}",
                AnnotationError(
                    f"{file}: line {number}: {len(line)} characters, over the {MAX_LINE_CHARS} a JSONL line may have"
                ),
            )
        elif line.strip():
            try:
                yield f"line {number}", json.loads(line)
            except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than Python recurses
                yield f"line {number}", AnnotationError(f"{file}: line {number}: invalid JSON: {err}")


def _csv_rows(file: Path, text: str) -> Iterator[tuple[str, Any]]:
    """The rows of a CSV file's ``text`` as `_rows` gives them; the line of a row the reader
    refuses is its last line read (the rest of that line is passed over)."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames
    except csv.Error as err:
        raise AnnotationError(f"{file}: line {reader.reader.line_num}: unreadable CSV header: {err}") from None
    if not header or not {"image", "caption"} <= set(header):
        raise AnnotationError(f"{file}: the CSV header must name the columns image and caption")
    rows = iter(reader)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as err:  # the reader goes on from the next line
            number = reader.reader.line_num  # DictReader.line_num is only updated by a good row
            yield f"line {number}", AnnotationError(f"{file}: line {number}: unreadable CSV row: {err}")
            continue
        yield f"line {reader.line_num}", row


def _parquet_rows(file: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise AnnotationError(f"{file}: reading Parquet needs pyarrow: pip install 'mmtx[parquet]'") from None
    if not file.is_file():
        raise AnnotationError(f"{file}: pairs file not found")
    try:
        table = pq.read_table(file, columns=["image", "caption"])
    except Exception as err:  # pyarrow's errors: ArrowInvalid, OSError, KeyError for a missing column
        raise AnnotationError(
            f"{file}: cannot read its image and caption columns ({type(err).__name__}: {err})"
        ) from err
    for number, row in enumerate(table.to_pylist(), 1):
        yield f"row {number}", row


def read_karpathy(
    annotations: str | os.PathLike,
    images: str | os.PathLike,
    split: str,
    skipped: list[str] | None = None,
    limit: TextLimit | None = None,
) -> list[CaptionRecord]:
    """Read one split of a Karpathy ``dataset_{coco,flickr8k,flickr30k}.json`` file.

    ``split="train"`` also includes the ``restval`` images. The image id is ``cocoid``
    when present, else ``imgid``; ``path = images / filepath / filename`` (``filepath`` is
    absent in the Flickr files); each caption is the sentence's ``raw`` text, or its
    ``tokens`` joined by spaces when ``raw`` is missing. Records are sorted by image id.
    Bad entries (and bad sentences) raise or are skipped as in `read_coco_captions`.
    """
    file, root = Path(annotations), Path(images)
    data = load_json_object(file)
    entries = require(data, "images", list, file, "")
    problems = EntryProblems(file, skipped, limit)

    splits: list[str | None] = []
    for i, entry in enumerate(entries):
        try:
            splits.append(require(as_object(entry, file, f"images[{i}]"), "split", str, file, f"images[{i}]"))
        except AnnotationError as err:
            splits.append(None)
            problems.add(err)
    present = sorted({s for s in splits if s is not None})
    wanted = {split, KARPATHY_TRAIN_EXTRA} if split == "train" else {split}
    if not wanted & set(present):
        unsplit = f"; entries without a valid split:\n{listing(problems.found)}" if problems.found else ""
        raise AnnotationError(f"{file}: no images in split {split!r}; splits present: {', '.join(present)}{unsplit}")

    records: dict[int, CaptionRecord] = {}
    for i, entry in enumerate(entries):
        if splits[i] not in wanted:
            continue
        where = f"images[{i}]"
        try:
            image_id = require(entry, "cocoid" if entry.get("cocoid") is not None else "imgid", int, file, where)
            if image_id in records:
                raise AnnotationError(f"{file}: {where}: duplicate image id {image_id} in split {split!r}")
            filename = require(entry, "filename", str, file, where)
            filepath = optional(entry, "filepath", str, file, where)
            relative = f"{filepath}/{filename}" if filepath else filename
            path = join_inside(root, relative, file, f"{where}.filepath/filename")
            sentences = require(entry, "sentences", list, file, where)
        except AnnotationError as err:
            problems.add(err)
            continue
        captions = []
        for j, sentence in enumerate(sentences):
            try:
                text = _karpathy_sentence(sentence, file, f"{where}.sentences[{j}]")
                captions.append(problems.bounded(text, f"{where}.sentences[{j}]"))
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
    atomic_write_json(Path(path), document)


def _clean_caption(text: str, file: Path, where: str) -> str:
    """Collapse runs of whitespace (COCO captions contain stray newlines and double spaces)."""
    caption = " ".join(text.split())
    if not caption:
        raise AnnotationError(f"{file}: {where}: empty caption")
    return caption


def _karpathy_sentence(sentence: Any, file: Path, where: str) -> str:
    sentence = as_object(sentence, file, where)
    raw = optional(sentence, "raw", str, file, where)
    if raw is not None and raw.strip():
        return _clean_caption(raw, file, f"{where}.raw")
    tokens = require(sentence, "tokens", list, file, where)
    if not all(isinstance(token, str) and not invalid_text(token) for token in tokens):
        raise AnnotationError(f"{file}: {where}.tokens: expected an array of UTF-8 strings")
    return _clean_caption(" ".join(tokens), file, f"{where}.tokens")
