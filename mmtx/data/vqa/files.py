"""Read and write the official VQA v2 format (questions JSON + annotations JSON) as `VqaRecord`s.

A questions file holds ``questions[]`` with ``question_id``, ``image_id`` and ``question``, and
a ``data_subtype`` such as ``val2014``; its annotations file holds ``annotations[]`` with the
ten ``answers[].answer`` of each question and its ``answer_type`` / ``question_type``. Test
splits come without annotations. Images are found by id in one folder, named as COCO names
them (``COCO_val2014_000000123456.jpg``) or by the bare id (``000000123456.jpg``, ``123456.png``).

Like the caption readers, `read_vqa` checks everything up front and fails with an
`AnnotationError` that names the file and the entries or ids at fault, or, given a
``skipped`` list, leaves the bad entries out and describes them there. Answers are kept as the
annotators typed them: the official accuracy decides when to normalise them
(`mmtx.metrics.vqa`). Questions and answers longer than the reader's ``limit`` (a
`mmtx.data.annotations.TextLimit`; none given: `MAX_TEXT_CHARS`) are cut to it and listed in
``limit.cut``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
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
    load_json_object,
    optional,
    require,
)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_REPORTED_IDS = 5  # how many offending ids an error message lists


@dataclass(frozen=True)
class VqaRecord:
    """One question about one image with its ground-truth answers (none for a test split)."""

    question_id: int
    image_id: int
    path: Path
    question: str
    answers: tuple[str, ...]
    answer_type: str | None  # "yes/no", "number" or "other" in VQA v2
    question_type: str | None  # the question's first words, e.g. "what color is the"


def read_vqa(
    questions: str | os.PathLike,
    annotations: str | os.PathLike | None,
    images: str | os.PathLike,
    skipped: list[str] | None = None,
    limit: TextLimit | None = None,
) -> list[VqaRecord]:
    """Read an official VQA questions file, its annotations file if given, and locate the images.

    Returns one record per question, sorted by question id. Every question needs an
    annotation with at least one answer (annotations for questions not in the file are
    ignored, so a subset of the questions can be evaluated) and every image id needs exactly
    one file directly inside `images`; the folder is listed once.

    Bad entries raise one `AnnotationError` naming them all. With a ``skipped`` list they are
    left out instead (a question whose annotation is bad or absent goes too) and described
    there; an image id with no file then keeps the path it would have under its COCO name,
    for the image check to report as missing.
    """
    questions_file, root = Path(questions), Path(images)
    data = load_json_object(questions_file)
    entries = require(data, "questions", list, questions_file, "")
    subtype = optional(data, "data_subtype", str, questions_file, "")
    problems = EntryProblems(questions_file, skipped, limit)

    parsed: dict[int, tuple[int, str]] = {}  # question id -> (image id, question)
    for i, entry in enumerate(entries):
        where = f"questions[{i}]"
        try:
            entry = as_object(entry, questions_file, where)
            question_id = require(entry, "question_id", int, questions_file, where)
            image_id = require(entry, "image_id", int, questions_file, where)
            text = " ".join(require(entry, "question", str, questions_file, where).split())
            if question_id in parsed:
                raise AnnotationError(f"{questions_file}: {where}.question_id: duplicate question id {question_id}")
            if not text:
                raise AnnotationError(f"{questions_file}: {where}.question: empty question")
            parsed[question_id] = (image_id, problems.bounded(text, f"{where}.question"))
        except AnnotationError as err:
            problems.add(err)
    problems.finish()

    if annotations is not None:
        labels = _read_annotations(Path(annotations), parsed, questions_file, skipped, limit)
        parsed = {question_id: parsed[question_id] for question_id in labels}
    else:
        labels = {}
    paths = _locate_images(root, {image_id for image_id, _ in parsed.values()}, subtype, questions_file, skipped)
    return [
        VqaRecord(question_id, image_id, paths[image_id], text, *labels.get(question_id, ((), None, None)))
        for question_id, (image_id, text) in sorted(parsed.items())
        if image_id in paths
    ]  # an image with several files is left out (in `skipped`)


def write_vqa(
    records: Iterable[VqaRecord],
    questions_path: str | os.PathLike,
    annotations_path: str | os.PathLike | None,
    data_subtype: str,
) -> None:
    """Write `records` as an official VQA questions file and, unless `annotations_path` is None
    (a test split), an annotations file; each atomically.

    Image paths are not stored (the format finds images by id), so name the files as
    `read_vqa` looks for them. ``multiple_choice_answer`` is the most frequent answer, the
    first one given on a tie.
    """
    question_entries: list[dict[str, Any]] = []
    annotation_entries: list[dict[str, Any]] = []
    seen: set[int] = set()
    for record in records:
        if record.question_id in seen:
            raise ValueError(f"duplicate question id {record.question_id} while writing {questions_path}")
        seen.add(record.question_id)
        question = {"image_id": record.image_id, "question": record.question, "question_id": record.question_id}
        question_entries.append(question)
        if annotations_path is None:
            continue
        if not record.answers:
            raise ValueError(f"question {record.question_id} has no answers to write to {annotations_path}")
        types = (("question_type", record.question_type), ("answer_type", record.answer_type))
        annotation_entries.append({
            "question_id": record.question_id, "image_id": record.image_id,
            **{key: value for key, value in types if value is not None},
            "answers": [{"answer": answer, "answer_confidence": "yes", "answer_id": k}
                        for k, answer in enumerate(record.answers, start=1)],
            "multiple_choice_answer": Counter(record.answers).most_common(1)[0][0],
        })  # fmt: skip

    header = {"info": {"description": "written by mmtx"}, "license": {}, "data_subtype": data_subtype}
    atomic_write_json(Path(questions_path), {**header, "task_type": "Open-Ended", "questions": question_entries})
    if annotations_path is not None:
        atomic_write_json(Path(annotations_path), {**header, "annotations": annotation_entries})


def _read_annotations(
    file: Path,
    questions: dict[int, tuple[int, str]],
    questions_file: Path,
    skipped: list[str] | None,
    limit: TextLimit | None,
) -> dict[int, tuple[tuple[str, ...], str | None, str | None]]:
    """{question id: (answers, answer type, question type)} for the questions of `questions`
    that have a good annotation (all of them, or an AnnotationError, unless skipping); answers
    longer than ``limit`` are cut as in `read_vqa`."""
    data = load_json_object(file)
    entries = require(data, "annotations", list, file, "")
    problems = EntryProblems(file, skipped, limit)
    labels: dict[int, tuple[tuple[str, ...], str | None, str | None]] = {}
    seen: set[int] = set()
    for i, entry in enumerate(entries):
        where = f"annotations[{i}]"
        try:
            entry = as_object(entry, file, where)
            question_id = require(entry, "question_id", int, file, where)
            if question_id not in questions:
                continue
            if question_id in seen:
                raise AnnotationError(f"{file}: {where}.question_id: duplicate question id {question_id}")
            seen.add(question_id)  # from here on, a problem is this question's only report
            image_id = require(entry, "image_id", int, file, where)
            if image_id != questions[question_id][0]:
                raise AnnotationError(
                    f"{file}: {where}.image_id: image id {image_id}, but question {question_id} in "
                    f"{questions_file} is about image {questions[question_id][0]}"
                )
            answer_type = optional(entry, "answer_type", str, file, where)
            question_type = optional(entry, "question_type", str, file, where)
            answers = _answers(require(entry, "answers", list, file, where), file, where, problems)
            labels[question_id] = (answers, answer_type, question_type)
        except AnnotationError as err:
            problems.add(err)

    unanswered = [question_id for question_id in questions if question_id not in seen]
    if unanswered:
        problems.add(
            f"{file}: no annotation for {len(unanswered)} question(s) of {questions_file}, "
            f"e.g. question ids {_some(unanswered)}"
        )
    problems.finish()
    return labels


def _answers(entries: list[Any], file: Path, where: str, problems: EntryProblems) -> tuple[str, ...]:
    """The ``answer`` strings of an ``answers`` list (checked in one pass; VQA v2 train has 4M),
    cut to the text limit."""
    answers = tuple(entry.get("answer") if isinstance(entry, dict) else None for entry in entries)
    if not answers:
        raise AnnotationError(f"{file}: {where}.answers: no answers")
    if not all(isinstance(answer, str) and not invalid_text(answer) for answer in answers):
        for k, entry in enumerate(entries):  # find the culprit for the message
            at = f"{where}.answers[{k}]"
            require(as_object(entry, file, at), "answer", str, file, at)
    if max(map(len, answers)) > problems.limit.max_chars:
        answers = tuple(problems.bounded(answer, f"{where}.answers[{k}].answer") for k, answer in enumerate(answers))
    return answers


def _locate_images(
    root: Path, image_ids: set[int], subtype: str | None, questions_file: Path, skipped: list[str] | None = None
) -> dict[int, Path]:
    """{image id: its file} for `image_ids`, from one listing of `root`.

    An id with no file, or with several, is an AnnotationError; with a ``skipped`` list, an id
    with no file gets the path of its COCO name instead (for the image check to report as
    missing) and an id with several files is left out and described in ``skipped``.
    """
    strict = skipped is None
    found: dict[int, list[Path]] = {}
    try:
        with os.scandir(root) as listing:
            for item in listing:
                image_id = _image_id(item.name, subtype)
                if image_id is not None and item.is_file():
                    found.setdefault(image_id, []).append(root / item.name)
    except OSError as err:
        raise AnnotationError(f"{root}: cannot list the image folder of {questions_file}: {err.strerror}") from err

    missing = sorted(image_id for image_id in image_ids if image_id not in found)
    if missing and strict:
        example = f"COCO_{subtype}_{missing[0]:012d}.jpg, " if subtype else ""
        raise AnnotationError(
            f"{root}: no image file for {len(missing)} image id(s) of {questions_file}, e.g. ids "
            f"{_some(missing)}; expected names like {example}{missing[0]:012d}.jpg or {missing[0]}.png"
        )
    clashes = sorted(image_id for image_id in image_ids if len(found.get(image_id, ())) > 1)
    for image_id in clashes:
        names = ", ".join(sorted(path.name for path in found[image_id]))
        if strict:
            raise AnnotationError(f"{root}: several files for image id {image_id}: {names}")
        skipped.append(f"{root}: several files for image id {image_id}: {names}")  # type: ignore[union-attr]
    paths = {image_id: found[image_id][0] for image_id in image_ids if len(found.get(image_id, ())) == 1}
    stem = f"COCO_{subtype}_" if subtype else ""
    paths.update({image_id: root / f"{stem}{image_id:012d}.jpg" for image_id in missing})
    return paths


def _image_id(name: str, subtype: str | None) -> int | None:
    """The image id an image file's name stands for (see the module docs), or None for other files."""
    return image_id_from_name(name, subtype) if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES else None


def image_id_from_name(name: str, subtype: str | None = None) -> int | None:
    """The COCO image id a file name stands for, or None: ``COCO_val2014_000000123456.jpg``
    (with ``subtype`` given, of that one only) or the bare id, ``000000123456.jpg``, ``123456.png``."""
    stem = os.path.splitext(name)[0]
    if re.fullmatch(r"[0-9]+", stem):
        return int(stem)
    coco = re.fullmatch(r"COCO_(.+)_([0-9]{12})", stem)
    if coco and (subtype is None or coco[1] == subtype):
        return int(coco[2])
    return None


def _some(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids)[:_REPORTED_IDS])
