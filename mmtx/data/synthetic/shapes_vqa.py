"""Shapes VQA: questions about shapes scenes, each with ten annotator-like answers, drawn on the fly.

The scenes are those of `mmtx.data.synthetic.shapes` (1-3 shapes, one colour each). Questions ask to
count (``how many circles are there?``), name a colour, shape or size (``what color is the
circle?``), check existence (``is there a red shape?``) or a spatial relation (``is the red
circle left of the blue square?``, ``what is above the green triangle?``). A question is only
asked when the scene answers it unambiguously: "the circle" must be the only circle, and a
relation must be clear by `mmtx.data.synthetic.shapes.RELATION_RATIO` (for "what is left of X?", no
other shape may be left of X at all). Answer types are balanced (yes/no, number, other in
turn) and yes/no answers are balanced.

Each question gets ten answers like VQA's annotators give: mostly the right one, sometimes a
synonym (``ball``, ``two``, ``little``) and about one in ten wrong; at most four of the ten
differ from the right answer, so it is always the majority. Everything comes from the seed.

`generate_shapes_vqa` writes the official VQA v2 format, so `mmtx.data.vqa.read_vqa` and the
official accuracy serve it like the real data set.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from mmtx.data.synthetic.build import build_once
from mmtx.data.synthetic.scenes import COLORS, KINDS, MAX_SPLIT_SIZE, SIZES, check_int, drawn_images
from mmtx.data.synthetic.shapes import MIN_IMAGE_SIZE, Scene, draw_scene
from mmtx.data.vqa.files import VqaRecord, write_vqa

ANSWERS_PER_QUESTION = 10
MAX_QUESTIONS_PER_IMAGE = 10  # every scene has well over this many answerable questions

_ANSWER_TYPES = ("yes/no", "number", "other")
_WRONG_RATE = 0.1  # an annotator answers wrongly
_SYNONYM_RATE = 0.1  # a right annotator words the answer differently
_MAX_DISSENT = 4  # at most this many of the ten answers differ from the right one

_NUMBER_WORDS = {0: ("none", "zero"), 1: ("one",), 2: ("two",), 3: ("three",)}  # scenes hold 1-3 shapes
_KIND_SYNONYMS = {"circle": ("ball",), "square": ("box",), "triangle": ()}
_SIZE_SYNONYMS = {"small": ("little", "tiny"), "large": ("big",)}
_COLOR_SYNONYMS = {"purple": ("violet",)}
_RELATION_WORDS = {"left": "left of", "right": "right of", "above": "above", "below": "below"}
_OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}

_FORMAT = "mmtx-shapes-vqa"
# Bump when questions, answers or the scenes of mmtx.data.synthetic.shapes change, so cached sets are rebuilt.
_FORMAT_VERSION = 1
_QUESTION_ID_STRIDE = 1000  # question id = image id * 1000 + index, as in VQA v2


@dataclass(frozen=True)
class ShapesQuestion:
    """One question about a scene: its right `answer` and the ten annotators' `answers`."""

    question: str
    answer: str
    answers: tuple[str, ...]
    answer_type: str  # "yes/no", "number" or "other"
    question_type: str  # the question's first words, as in VQA v2


@dataclass(frozen=True)
class _Candidate:
    """A question the scene answers unambiguously, with the ways annotators could answer it."""

    family: str  # what kind of question, so that sampling varies them
    question: str
    answer: str
    answer_type: str
    question_type: str
    synonyms: tuple[str, ...]  # also right, worded differently
    mistakes: tuple[str, ...]  # plausible wrong answers


def ask_about_scene(scene: Scene, rng: random.Random, count: int = 5) -> list[ShapesQuestion]:
    """`count` distinct questions about `scene`, answer types taken in turn from a random start
    (so a data set is balanced over yes/no, number and other), yes or no equally often."""
    check_int("count", count, 1, MAX_QUESTIONS_PER_IMAGE)
    pool = _candidates(scene)
    first = rng.randrange(len(_ANSWER_TYPES))
    asked = []
    for k in range(count):
        answer_type = _ANSWER_TYPES[(first + k) % len(_ANSWER_TYPES)]
        options = [c for c in pool if c.answer_type == answer_type] or pool
        if answer_type == "yes/no":
            wanted = rng.choice(("yes", "no"))
            options = [c for c in options if c.answer == wanted] or options
        family = rng.choice(sorted({c.family for c in options}))
        chosen = rng.choice([c for c in options if c.family == family])
        pool.remove(chosen)
        answers = _annotate(chosen, rng)
        asked.append(ShapesQuestion(chosen.question, chosen.answer, answers, chosen.answer_type, chosen.question_type))
    return asked


def check_spec(num_train: int, num_val: int, image_size: int, questions_per_image: int, **_: Any) -> None:
    """Refuse counts and sizes `generate_shapes_vqa` cannot draw, before anything is drawn."""
    check_int("num_train", num_train, 0, MAX_SPLIT_SIZE)
    check_int("num_val", num_val, 0, MAX_SPLIT_SIZE)
    check_int("image_size", image_size, MIN_IMAGE_SIZE)
    check_int("questions_per_image", questions_per_image, 1, MAX_QUESTIONS_PER_IMAGE)


def generate_shapes_vqa(
    root: str | os.PathLike,
    num_train: int,
    num_val: int,
    image_size: int = 64,
    seed: int = 0,
    questions_per_image: int = 5,
    draw: bool = True,
) -> dict[str, tuple[Path, Path, Path]]:
    """Write (or reuse) a shapes VQA data set under `root` in the official VQA v2 format.

    Layout: ``train/*.png``, ``val/*.png`` (named by the 12-digit image id),
    ``questions_{split}.json``, ``annotations_{split}.json`` and ``meta.json``, built or reused
    by `build_once`. Each image and its questions come from their own seed (seed, split, index).

    ``draw=False``: only reuse a data set already there (see `build_once`).

    Returns {split: (questions_json, annotations_json, images_dir)} for "train" and "val".
    """
    root = Path(root)
    check_spec(num_train, num_val, image_size, questions_per_image)
    meta = {
        "format": _FORMAT,
        "version": _FORMAT_VERSION,
        "num_train": num_train,
        "num_val": num_val,
        "image_size": image_size,
        "seed": seed,
        "questions_per_image": questions_per_image,
    }
    layout = {
        split: (root / f"questions_{split}.json", root / f"annotations_{split}.json", root / split)
        for split in ("train", "val")
    }
    build_once(root, meta, chain.from_iterable(layout.values()), _build, "shapes VQA data set", draw)
    return layout


def _candidates(scene: Scene) -> list[_Candidate]:
    """Every question of every family that `scene` answers unambiguously."""
    shapes = scene.shapes
    names = [f"{s.color} {s.kind}" for s in shapes]
    found: list[_Candidate] = []

    def count(family: str, question: str, n: int) -> None:
        wrong = tuple(str(m) for m in (n - 1, n + 1) if m >= 0)
        found.append(_Candidate(family, question, str(n), "number", "how many", _NUMBER_WORDS[n], wrong))

    def yes_no(family: str, question: str, question_type: str, truth: bool) -> None:
        answer, wrong = ("yes", "no") if truth else ("no", "yes")
        found.append(_Candidate(family, question, answer, "yes/no", question_type, (), (wrong,)))

    def color_of(family: str, question: str, color: str) -> None:
        wrong = tuple(c for c in COLORS if c != color)
        found.append(
            _Candidate(family, question, color, "other", "what color is the", _COLOR_SYNONYMS.get(color, ()), wrong)
        )

    count("count all", "how many shapes are there?", len(shapes))
    for kind in KINDS:
        count("count kind", f"how many {kind}s are there?", sum(s.kind == kind for s in shapes))
        yes_no("exists kind", f"is there a {kind}?", "is there a", any(s.kind == kind for s in shapes))
    for size in SIZES:
        count("count size", f"how many {size} shapes are there?", sum(s.size == size for s in shapes))
        yes_no("exists size", f"is there a {size} shape?", "is there a", any(s.size == size for s in shapes))
    for color in COLORS:
        count("count color", f"how many {color} shapes are there?", sum(s.color == color for s in shapes))
        yes_no("exists color", f"is there a {color} shape?", "is there a", any(s.color == color for s in shapes))
        for kind in KINDS:
            present = any(s.color == color and s.kind == kind for s in shapes)
            yes_no("exists colored kind", f"is there a {color} {kind}?", "is there a", present)

    for s in shapes:
        if sum(t.kind == s.kind for t in shapes) == 1:
            color_of("color of kind", f"what color is the {s.kind}?", s.color)
        elif sum(t.kind == s.kind and t.size == s.size for t in shapes) == 1:
            color_of("color of kind", f"what color is the {s.size} {s.kind}?", s.color)
        if sum(t.size == s.size for t in shapes) == 1:
            color_of("color of size", f"what color is the {s.size} shape?", s.color)
        other_kinds, other_size = tuple(k for k in KINDS if k != s.kind), tuple(z for z in SIZES if z != s.size)
        found.append(
            _Candidate(
                "kind of color",
                f"what shape is the {s.color} object?",
                s.kind,
                "other",
                "what shape is the",
                _KIND_SYNONYMS[s.kind],
                other_kinds,
            )
        )
        found.append(
            _Candidate(
                "size of shape",
                f"what size is the {s.color} {s.kind}?",
                s.size,
                "other",
                "what size is the",
                _SIZE_SYNONYMS[s.size],
                other_size,
            )
        )

    for i, relation, j in scene.relations():
        for asked in (relation, _OPPOSITE[relation]):
            yes_no(
                "relation", f"is the {names[i]} {_RELATION_WORDS[asked]} the {names[j]}?", "is the", asked == relation
            )
        if not any(_on_side(scene, k, j, relation) for k in range(len(shapes)) if k not in (i, j)):
            kind, color = shapes[i].kind, shapes[i].color
            synonyms = (kind, *(f"{color} {word}" for word in _KIND_SYNONYMS[kind]), f"the {names[i]}")
            wrong = tuple(names[k] for k in range(len(shapes)) if k != i)
            found.append(
                _Candidate(
                    "what is where",
                    f"what is {_RELATION_WORDS[relation]} the {names[j]}?",
                    names[i],
                    "other",
                    "what is",
                    synonyms,
                    wrong,
                )
            )
    return found


def _on_side(scene: Scene, k: int, j: int, relation: str) -> bool:
    """Whether shape `k`'s centre lies on the `relation` side of shape `j`'s at all."""
    (kx, ky), (jx, jy) = scene.shapes[k].center, scene.shapes[j].center
    return {"left": kx < jx, "right": kx > jx, "above": ky < jy, "below": ky > jy}[relation]


def _annotate(candidate: _Candidate, rng: random.Random) -> tuple[str, ...]:
    """Ten answers: right, a synonym (`_SYNONYM_RATE`) or wrong (`_WRONG_RATE`), at most
    `_MAX_DISSENT` of them other than the right answer."""
    answers = []
    for _ in range(ANSWERS_PER_QUESTION):
        draw = rng.random()
        if draw < _WRONG_RATE and candidate.mistakes:
            answers.append(rng.choice(candidate.mistakes))
        elif draw < _WRONG_RATE + _SYNONYM_RATE and candidate.synonyms:
            answers.append(rng.choice(candidate.synonyms))
        else:
            answers.append(candidate.answer)
    dissenting = [k for k, answer in enumerate(answers) if answer != candidate.answer]
    for k in dissenting[_MAX_DISSENT:]:
        answers[k] = candidate.answer
    return tuple(answers)


def _build(staging: Path, meta: dict[str, Any]) -> None:
    """Draw every image of both splits into `staging` and write their question/annotation files."""
    records: dict[str, list[VqaRecord]] = {"train": [], "val": []}
    for split, image_id, rng in drawn_images(staging, meta, "shapes VQA"):
        image, _, scene = draw_scene(rng, meta["image_size"], num_captions=1)
        path = staging / split / f"{image_id:012d}.png"
        image.save(path, format="PNG", compress_level=1)
        for k, q in enumerate(ask_about_scene(scene, rng, meta["questions_per_image"])):
            question_id = image_id * _QUESTION_ID_STRIDE + k
            records[split].append(
                VqaRecord(question_id, image_id, path, q.question, q.answers, q.answer_type, q.question_type)
            )
    for split, written in records.items():
        write_vqa(
            written,
            staging / f"questions_{split}.json",
            staging / f"annotations_{split}.json",
            data_subtype=f"shapes_{split}",
        )
