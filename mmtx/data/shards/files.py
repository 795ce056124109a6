"""WebDataset tar shards as img2dataset and ``mmtx-shards`` write them: per sample ``KEY.jpg``
(or ``.jpeg``, ``.png``, ``.webp``) with ``KEY.txt`` and/or ``KEY.json``.

mmtx reads a split's shards by random access: `read_shards` indexes every shard once (the tar
headers give each member's offset; the small text members are read on the way) and a sample's
image is then one seek and one read (`mmtx.data.images.FileSlice`). The ``webdataset`` library's
loaders instead stream each shard from start to end, split the shards among processes and mix
samples in a shuffle buffer. Random access lets the sampler of the folder-based data sets order
the shard samples too (`mmtx.data.sampling`): a full shuffle of the split, every sample once per
epoch for any number of processes and loader workers whether or not the shards divide among
them, and a resumed run that continues with the next unseen sample. The price: shards must be
uncompressed tar files on a local or mounted file system (img2dataset writes them so).

Shards are untrusted: a ``.txt`` or ``.json`` member whose header gives more than
`MAX_MEMBER_BYTES` is not read (its sample is a bad one), and captions, questions and answers
longer than the readers' ``limit`` (a `mmtx.data.annotations.TextLimit`; none given:
`MAX_TEXT_CHARS`) are cut to it and listed in ``limit.cut``.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from braceexpand import braceexpand
from tqdm import tqdm
from webdataset.tariterators import base_plus_ext

from mmtx.config_error import is_int
from mmtx.data.annotations import AnnotationError, EntryProblems, TextLimit, invalid_text
from mmtx.data.captions.files import CaptionRecord
from mmtx.data.images import FileSlice
from mmtx.data.vqa.files import VqaRecord

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # the first one a sample has is its image
SHARD_LIST = "shards.json"  # what mmtx-shards writes beside its shards: {split: {shards, samples}}
MAX_MEMBER_BYTES = 2**20  # the largest .txt or .json member read: a sample's text takes a few kB
Shards = str | os.PathLike | Iterable[str | os.PathLike]  # what `shard_paths` takes


def shard_paths(shards: Shards) -> list[Path]:
    """The shard files ``shards`` names: a path, a brace pattern (``shards/{00000..00099}.tar``),
    a list of either, or a ``shards.json`` written by mmtx-shards (its shards of every split,
    in order; pick one split with ``DIR/shards.json:train``)."""
    specs = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
    paths: list[Path] = []
    for spec in map(str, specs):
        name, _, split = spec.rpartition(":") if ".json:" in spec else (spec, "", "")
        if name.endswith(".json"):
            paths += _listed(Path(name), split or None)
        else:
            paths += [Path(p) for p in braceexpand(spec)]
    return paths


def _listed(file: Path, split: str | None) -> list[Path]:
    try:
        listing = json.loads(file.read_text())
    except FileNotFoundError:
        raise AnnotationError(f"{file}: shard list not found") from None
    except (OSError, ValueError, RecursionError) as err:
        raise AnnotationError(f"{file}: not a shard list ({type(err).__name__}: {err})") from err
    splits = listing.get("splits", {}) if isinstance(listing, dict) else {}
    if split is not None and split not in splits:
        raise AnnotationError(f"{file}: no split {split!r} (it lists {', '.join(splits) or 'none'})")
    chosen = [splits[split]] if split else list(splits.values())
    return [file.parent / name for entry in chosen for name in entry.get("shards", [])]


def read_shards(
    shards: Shards, skipped: list[str] | None = None, limit: TextLimit | None = None
) -> list[CaptionRecord]:
    """One `CaptionRecord` per sample of ``shards`` (see `shard_paths`), its image a `FileSlice`.

    A sample's captions are its ``.json``'s ``captions`` (a list: all of the image's references),
    else its ``.txt``, else its ``.json``'s ``caption``. Its ``image_id`` is its ``.json``'s
    ``image_id`` when every sample has a distinct one (mmtx-shards keeps COCO's ids), else its
    position in the split (0, 1, ...). Samples without an image or a caption, unreadable text
    and shards that are missing, compressed or cut short are problems named by shard and key:
    raised together, or left out and described in ``skipped`` (the samples of a shard before
    the point where it is cut short are kept); so is a text member over `MAX_MEMBER_BYTES`.
    """
    samples = _read(shards, skipped, limit, _captions)
    ids = [_image_id(meta) for _, meta, _ in samples]
    if None in ids or len(set(ids)) < len(ids):
        ids = list(range(len(samples)))
    return [CaptionRecord(i, image, captions) for i, (image, _, captions) in zip(ids, samples)]


def read_vqa_shards(
    shards: Shards, skipped: list[str] | None = None, limit: TextLimit | None = None
) -> list[VqaRecord]:
    """One `VqaRecord` per question of ``shards``: each sample's ``.json`` holds its ``image_id``
    and ``questions``, a list of VQA v2 entries (``question_id``, ``question``, ``answers``: the
    annotators' answers, optional ``answer_type`` / ``question_type``), as mmtx-shards writes
    them from VQA v2 files. Bad samples and shards are problems as in `read_shards`; so is a
    question id met twice."""
    seen: set[int] = set()
    samples = _read(
        shards, skipped, limit, lambda path, key, meta, texts, problems: _questions(path, key, meta, seen, problems)
    )
    return [VqaRecord(q["question_id"], meta["image_id"], image, q["question"], q["answers"],
                      q.get("answer_type"), q.get("question_type"))
            for image, meta, questions in samples for q in questions]  # fmt: skip


T = TypeVar("T")


def _read(
    shards: Shards,
    skipped: list[str] | None,
    limit: TextLimit | None,
    parse: Callable[[Path, str, dict[str, Any], dict[str, bytes], EntryProblems], T],
) -> list[tuple[FileSlice, dict[str, Any], T]]:
    """(image, ``.json`` object, ``parse(shard, key, .json object, texts, problems)``) for every good
    sample of ``shards``, texts cut to ``limit``; what `_image_and_meta` or ``parse`` raise is
    collected as in `read_shards`."""
    paths = shard_paths(shards)
    if not paths:
        raise AnnotationError(f"{shards}: names no shard file")
    samples: list[tuple[FileSlice, dict[str, Any], T]] = []
    named = Path(str(shards)) if isinstance(shards, (str, os.PathLike)) else paths[0].parent
    problems = EntryProblems(named, skipped, limit)
    for path in tqdm(paths, desc="indexing shards", unit="shard", file=sys.stderr, disable=None, leave=False):
        for key, members, texts in _samples(path, problems):
            try:
                image, meta = _image_and_meta(path, key, members, texts)
                samples.append((image, meta, parse(path, key, meta, texts, problems)))
            except AnnotationError as err:
                problems.add(err)
    problems.finish()
    return samples


def _samples(path: Path, problems: EntryProblems) -> Iterable[tuple[str, dict[str, tarfile.TarInfo], dict[str, bytes]]]:
    """(key, {extension: member}, {extension: text bytes}) for each sample of the shard, in order;
    a sample with a text member over `MAX_MEMBER_BYTES` is a problem, and that member is not read."""
    members: dict[str, dict[str, tarfile.TarInfo]] = {}
    texts: dict[str, dict[str, bytes]] = {}
    refused: set[str] = set()  # keys of samples with a text member too large to read
    try:
        size = path.stat().st_size
        with tarfile.open(path, mode="r:") as tar:  # uncompressed only: random access needs it
            for info in tar:
                key, extension = base_plus_ext(info.name) if info.isfile() else (None, None)
                if key is None:
                    continue
                extension = extension.lower()
                if info.offset_data + info.size > size:
                    members.pop(key, None)  # the sample it belongs to is incomplete
                    raise EOFError(f"{key}.{extension} is cut short")
                members.setdefault(key, {})[extension] = info
                if extension in ("txt", "json") and info.size > MAX_MEMBER_BYTES:
                    refused.add(key)
                    problems.add(
                        f"{path}: {key}.{extension}: {info.size} bytes, over the {MAX_MEMBER_BYTES} "
                        "a text member may have"
                    )
                elif extension in ("txt", "json"):
                    texts.setdefault(key, {})[extension] = tar.extractfile(info).read()  # type: ignore[union-attr]
    except FileNotFoundError:
        problems.add(f"{path}: shard not found")
    except (tarfile.TarError, OSError, EOFError) as err:
        compressed = isinstance(err, tarfile.ReadError) and not members
        reason = "not an uncompressed tar file" if compressed else f"{type(err).__name__}: {err}"
        problems.add(f"{path}: unreadable after {len(members)} samples ({reason})")
    for key, found in members.items():
        if key not in refused:
            yield key, found, texts.get(key, {})


def _image_and_meta(
    path: Path, key: str, members: dict[str, tarfile.TarInfo], texts: dict[str, bytes]
) -> tuple[FileSlice, dict[str, Any]]:
    extension = next((e for e in IMAGE_EXTENSIONS if e in members), None)
    if extension is None:
        raise AnnotationError(f"{path}: {key}: no image ({', '.join('.' + e for e in IMAGE_EXTENSIONS)})")
    info = members[extension]
    meta: dict[str, Any] = {}
    if "json" in texts:
        try:
            meta = json.loads(texts["json"])
        except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than Python recurses
            raise AnnotationError(f"{path}: {key}.json: not JSON ({type(err).__name__}: {err})") from err
        if not isinstance(meta, dict):
            raise AnnotationError(f"{path}: {key}.json: expected an object")
    return FileSlice(path, info.offset_data, info.size, info.name), meta


def _captions(
    path: Path, key: str, meta: dict[str, Any], texts: dict[str, bytes], problems: EntryProblems
) -> tuple[str, ...]:
    if isinstance(meta.get("captions"), list) and meta["captions"]:
        given, where = meta["captions"], f"{key}.json captions"
    elif "txt" in texts:
        given, where = [texts["txt"].decode("utf-8", errors="surrogateescape")], f"{key}.txt"
    elif "caption" in meta:
        given, where = [meta["caption"]], f"{key}.json caption"
    else:
        raise AnnotationError(f"{path}: {key}: no caption (a .txt, or caption/captions in its .json)")
    captions = []
    for text in given:
        problem = "expected a string" if not isinstance(text, str) else invalid_text(text)
        caption = " ".join(text.split()) if isinstance(text, str) else ""
        if problem or not caption:
            raise AnnotationError(f"{path}: {where}: {problem or 'empty caption'}")
        captions.append(caption)
    return tuple(problems.bounded(caption, where, path) for caption in captions)


def _image_id(meta: dict[str, Any]) -> int | None:
    image_id = meta.get("image_id")
    return image_id if is_int(image_id) else None


def _questions(
    path: Path, key: str, meta: dict[str, Any], seen: set[int], problems: EntryProblems
) -> list[dict[str, Any]]:
    """The checked ``questions`` of a VQA sample's ``.json`` (question ids not in ``seen``, added to
    it), their texts cut to the text limit."""
    where = f"{path}: {key}.json"
    if _image_id(meta) is None:
        raise AnnotationError(f"{where}: image_id: expected an integer, got {meta.get('image_id')!r}")
    questions = meta.get("questions")
    if not isinstance(questions, list) or not questions:
        raise AnnotationError(f"{where}: questions: expected a non-empty list of VQA questions")
    checked, ids = [], set()
    for i, entry in enumerate(questions):
        at = f"{where}: questions[{i}]"
        if not isinstance(entry, dict):
            raise AnnotationError(f"{at}: expected an object")
        question_id, question, answers = entry.get("question_id"), entry.get("question"), entry.get("answers")
        if not is_int(question_id):
            raise AnnotationError(f"{at}.question_id: expected an integer, got {question_id!r}")
        if question_id in seen or question_id in ids:
            raise AnnotationError(f"{at}.question_id: duplicate question id {question_id}")
        problem = "expected a string" if not isinstance(question, str) else invalid_text(question)
        if problem or not question.split():
            raise AnnotationError(f"{at}.question: {problem or 'empty question'}")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise AnnotationError(f"{at}.answers: expected a non-empty list of answer strings")
        types = {name: entry.get(name) for name in ("answer_type", "question_type")}
        if any(value is not None and not isinstance(value, str) for value in types.values()):
            raise AnnotationError(f"{at}: answer_type and question_type must be strings")
        ids.add(question_id)
        checked.append({"question_id": question_id, "question": " ".join(question.split()),
                        "answers": tuple(answers), **types})  # fmt: skip
    seen.update(ids)  # only once the whole sample is good: a skipped sample claims no id
    for i, question in enumerate(checked):
        at = f"{key}.json questions[{i}]"
        question["question"] = problems.bounded(question["question"], f"{at}.question", path)
        question["answers"] = tuple(
            problems.bounded(answer, f"{at}.answers[{k}]", path) for k, answer in enumerate(question["answers"])
        )
    return checked
