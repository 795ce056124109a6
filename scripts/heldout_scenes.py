"""Held-out shape scenes: draw them, and score a captioner's sentences about them.

mmtx tunes its captioner on its own shapes and grid generators. This script is a separate
generator, written apart from them with its own words, sizes, colours and layout, so that a
captioner can be measured on scenes it was not tuned on. It needs only numpy and Pillow.

Each image (96-160 px on its longer side; 1:1, 4:3, 3:4 or 16:9) has its own dark background
with a faint gradient and noise, and one to three shapes in distinct cells of a 3x3 layout.
A shape is small or large; a circle, square, triangle, diamond or star; red, orange, yellow,
green, blue, purple or white. No two shapes of an image share size, colour and kind, so a
description such as "the large blue square" names one shape. Images with one shape are
captioned with where it is ("a small red circle in the top left corner"); images with more
relate a random pair by a relation that holds on the grid ("the large blue square is below
the small red circle"): left of / right of compare columns, above / below compare rows.

Commands::

    python scripts/heldout_scenes.py draw OUT --seed 0 --train 3000 --val 300
    python scripts/heldout_scenes.py score OUT predictions.json [--split val]
    python scripts/heldout_scenes.py score OUT --references

``draw`` writes ``OUT/{train,val}/<image id>.png``, COCO captions ``OUT/captions_{split}.json``,
VQA v2 ``OUT/questions_{split}.json`` and ``OUT/annotations_{split}.json``, and the scenes
themselves, ``OUT/scenes_{split}.json`` (each shape's kind, colour, size, row, column and COCO
box ``[x, y, width, height]``). Every image depends only on the seed, its split and its index.

``score`` reads captions in the COCO results format (``[{"image_id": int, "caption": str}]``,
one per image) and prints one JSON line: how many captions are ``entirely_true`` (every shape
named exists with that size, colour and kind, and every stated place and relation holds; a
sentence outside the generator's grammar is not true), how many state a relation between two
shapes found in the scene and how many of those hold, per relation word, and what the captions
that are not true get wrong first (``not_true_first``; for a kind, ``kind_first_wrong_by_size``
counts the sizes of the shapes taken for another kind). ``--references`` scores each image's
first reference caption, a check of the scorer itself (all true).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

SPLITS = ("train", "val")
SPLIT_ID_OFFSET = {"train": 0, "val": 1_000_000}  # image ids stay distinct across splits
MAX_IMAGES = 999_999
MAX_PREDICTIONS_BYTES = 50 * 1024 * 1024
CAPTIONS_PER_IMAGE = 5

ASPECTS = ((1, 1), (4, 3), (3, 4), (16, 9))  # width : height
SIZES = ("small", "large")
SIZE_SCALE = {"small": 0.24, "large": 0.42}  # half-extent over the smaller side of a cell
KINDS = ("circle", "square", "triangle", "diamond", "star")
COLOURS = {
    "red": (222, 45, 38),
    "orange": (244, 138, 28),
    "yellow": (238, 218, 52),
    "green": (48, 186, 72),
    "blue": (52, 104, 236),
    "purple": (148, 62, 204),
    "white": (236, 236, 232),
}

# Place words of each cell (row, column), as the captions say them; the scorer reads any mix
# of row and column words (see `_read_place`).
PLACES = {
    (0, 0): ("top left corner", "upper left corner", "top left"),
    (0, 1): ("top middle", "top center"),
    (0, 2): ("top right corner", "upper right corner", "top right"),
    (1, 0): ("middle left", "center left"),
    (1, 1): ("middle", "center", "centre"),
    (1, 2): ("middle right", "center right"),
    (2, 0): ("bottom left corner", "lower left corner", "bottom left"),
    (2, 1): ("bottom middle", "bottom center"),
    (2, 2): ("bottom right corner", "lower right corner", "bottom right"),
}
RELATIONS = ("left of", "right of", "above", "below")
RELATION_WORDS = {  # what the captions say for each relation
    "left of": ("to the left of", "left of"),
    "right of": ("to the right of", "right of"),
    "above": ("above", "over"),
    "below": ("below", "under"),
}
RELATION_TEMPLATES = ("{a} {rel} {b}", "{the_a} is {rel} {the_b}", "there is {a} {rel} {b}")
PLACE_TEMPLATES = ("{a} in the {place}", "{the_a} is in the {place}", "in the {place} there is {a}")


@dataclass(frozen=True)
class Shape:
    """One drawn shape: its words, its cell of the 3x3 layout and its COCO box."""

    kind: str
    colour: str
    size: str
    row: int
    column: int
    box: tuple[float, float, float, float]

    def words(self) -> str:
        return f"{self.size} {self.colour} {self.kind}"


def holds(relation: str, a: Shape, b: Shape) -> bool:
    """Whether ``a <relation> b`` holds on the grid (columns for left/right, rows for above/below)."""
    if relation == "left of":
        return a.column < b.column
    if relation == "right of":
        return a.column > b.column
    if relation == "above":
        return a.row < b.row
    if relation == "below":
        return a.row > b.row
    raise ValueError(f"unknown relation {relation!r}")


def _article(words: str) -> str:
    return ("an " if words[0] in "aeiou" else "a ") + words


def _pick(rng: np.random.Generator, options: tuple | list) -> Any:
    return options[int(rng.integers(len(options)))]


# ---------------------------------------------------------------------------------------- drawing


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A dark colour of its own with a faint linear gradient and a little noise."""
    base = rng.uniform(4, 48, size=3)
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    ramp = (xs / width - 0.5) * np.cos(angle) + (ys / height - 0.5) * np.sin(angle)
    amplitude = rng.uniform(0, 22, size=3)
    pixels = base + ramp[..., None] * amplitude + rng.normal(0, rng.uniform(1, 4), size=(height, width, 3))
    return np.clip(pixels, 0, 90).astype(np.uint8)


def _outline(kind: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The polygon of a shape centred on (cx, cy) with half-extent r (a circle: its box corners)."""
    if kind == "circle":
        return [(cx - r, cy - r), (cx + r, cy + r)]
    if kind == "square":
        s = 0.86 * r
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if kind == "triangle":
        return [(cx, cy - r), (cx + 0.96 * r, cy + 0.8 * r), (cx - 0.96 * r, cy + 0.8 * r)]
    if kind == "diamond":
        return [(cx, cy - r), (cx + 0.78 * r, cy), (cx, cy + r), (cx - 0.78 * r, cy)]
    if kind == "star":
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, r, 0.45 * r)
        return [(cx + q * np.cos(t), cy + q * np.sin(t)) for q, t in zip(radii, angles)]
    raise ValueError(f"unknown kind {kind!r}")


def draw_scene(rng: np.random.Generator) -> tuple[Image.Image, list[Shape]]:
    """One image and its shapes, drawn from `rng` alone."""
    aw, ah = ASPECTS[int(rng.integers(len(ASPECTS)))]
    longest = int(rng.integers(128 if (aw, ah) == (16, 9) else 96, 161))  # 16:9 keeps shapes legible
    width, height = (longest, round(longest * ah / aw)) if aw >= ah else (round(longest * aw / ah), longest)
    image = Image.fromarray(_background(rng, width, height))
    pen = ImageDraw.Draw(image)
    cell_w, cell_h = width / 3, height / 3

    count = int(rng.integers(1, 4))
    cells = rng.choice(9, size=count, replace=False)
    used: set[tuple[str, str, str]] = set()
    shapes: list[Shape] = []
    for cell in cells:
        while True:
            words = (_pick(rng, SIZES), _pick(rng, list(COLOURS)), _pick(rng, KINDS))
            if words not in used:
                used.add(words)
                break
        size, colour, kind = words
        row, column = divmod(int(cell), 3)
        r = SIZE_SCALE[size] * min(cell_w, cell_h) * rng.uniform(0.9, 1.05)
        slack_x, slack_y = max(cell_w / 2 - r - 1, 0), max(cell_h / 2 - r - 1, 0)
        cx = (column + 0.5) * cell_w + rng.uniform(-1, 1) * slack_x
        cy = (row + 0.5) * cell_h + rng.uniform(-1, 1) * slack_y
        fill = tuple(int(np.clip(c + rng.integers(-14, 15), 0, 255)) for c in COLOURS[colour])
        points = _outline(kind, cx, cy, r)
        if kind == "circle":
            pen.ellipse(points, fill=fill)
        else:
            pen.polygon(points, fill=fill)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        box = (round(min(xs), 1), round(min(ys), 1), round(max(xs) - min(xs), 1), round(max(ys) - min(ys), 1))
        shapes.append(Shape(kind, colour, size, row, column, box))
    return image, shapes


def caption_scene(rng: np.random.Generator, shapes: list[Shape]) -> list[str]:
    """Five captions: where a lone shape is, or a true relation between a random ordered pair."""
    captions = []
    for _ in range(CAPTIONS_PER_IMAGE):
        if len(shapes) == 1:
            shape = shapes[0]
            place = _pick(rng, PLACES[(shape.row, shape.column)])
            template = _pick(rng, PLACE_TEMPLATES)
            captions.append(template.format(a=_article(shape.words()), the_a=f"the {shape.words()}", place=place))
            continue
        i, j = rng.choice(len(shapes), size=2, replace=False)
        a, b = shapes[int(i)], shapes[int(j)]
        relation = _pick(rng, [rel for rel in RELATIONS if holds(rel, a, b)])
        template = _pick(rng, RELATION_TEMPLATES)
        captions.append(
            template.format(
                a=_article(a.words()),
                b=_article(b.words()),
                the_a=f"the {a.words()}",
                the_b=f"the {b.words()}",
                rel=_pick(rng, RELATION_WORDS[relation]),
            )
        )
    return captions


def _plural(kind: str) -> str:
    return kind + "s"


def question_scene(rng: np.random.Generator, shapes: list[Shape]) -> list[tuple[str, str, str, str]]:
    """Three to five (question, answer, question type, answer type) about counts, colours,
    existence and which shape stands where."""
    colours, kinds = list(COLOURS), list(KINDS)
    present = {(s.colour, s.kind) for s in shapes}
    candidates: list[tuple[str, str, str, str]] = [
        ("how many shapes are there?", str(len(shapes)), "how many", "number")
    ]

    colour = _pick(rng, [s.colour for s in shapes]) if rng.random() < 0.5 else _pick(rng, colours)
    count = sum(s.colour == colour for s in shapes)
    candidates.append((f"how many {colour} shapes are there?", str(count), "how many", "number"))
    kind = _pick(rng, [s.kind for s in shapes]) if rng.random() < 0.5 else _pick(rng, kinds)
    count = sum(s.kind == kind for s in shapes)
    candidates.append((f"how many {_plural(kind)} are there?", str(count), "how many", "number"))

    lone = [s for s in shapes if sum(t.kind == s.kind for t in shapes) == 1]
    if lone:
        shape = _pick(rng, lone)
        candidates.append((f"what color is the {shape.kind}?", shape.colour, "what color is the", "other"))

    kind = _pick(rng, [s.kind for s in shapes]) if rng.random() < 0.5 else _pick(rng, kinds)
    answer = "yes" if any(s.kind == kind for s in shapes) else "no"
    candidates.append((f"is there {_article(kind)}?", answer, "is there a", "yes/no"))
    if rng.random() < 0.5:
        colour, kind = _pick(rng, sorted(present))
    else:
        colour, kind = _pick(rng, colours), _pick(rng, kinds)
    answer = "yes" if (colour, kind) in present else "no"
    candidates.append((f"is there {_article(f'{colour} {kind}')}?", answer, "is there a", "yes/no"))

    shape = _pick(rng, shapes)
    place = PLACES[(shape.row, shape.column)][0]
    candidates.append((f"what shape is in the {place}?", shape.kind, "what", "other"))

    where = []  # (relation, reference) with exactly one shape standing there
    for reference in shapes:
        for relation in RELATIONS:
            standing = [s for s in shapes if s is not reference and holds(relation, s, reference)]
            if len(standing) == 1:
                where.append((relation, reference, standing[0]))
    if where:
        relation, reference, shape = _pick(rng, where)
        phrase = RELATION_WORDS[relation][0]
        question = f"what shape is {phrase} the {reference.words()}?"
        candidates.append((question, shape.kind, "what", "other"))

    first, rest = candidates[0], candidates[1:]
    chosen = int(rng.integers(3, 6)) - 1
    order = rng.permutation(len(rest))[:chosen]
    return [first] + [rest[int(k)] for k in sorted(order)]


def draw_split(out: Path, split: str, count: int, seed: int) -> dict[str, int]:
    """Draw one split into `out`; returns how many images, captions and questions it wrote."""
    folder = out / split
    folder.mkdir(parents=True, exist_ok=True)
    images, captions, questions, annotations, scenes = [], [], [], [], []
    for index in range(count):
        rng = np.random.default_rng([seed, SPLITS.index(split), index])
        image, shapes = draw_scene(rng)
        image_id = SPLIT_ID_OFFSET[split] + index + 1
        file_name = f"{image_id:012d}.png"
        image.save(folder / file_name, compress_level=1)
        images.append({"id": image_id, "file_name": file_name, "width": image.width, "height": image.height})
        for caption in caption_scene(rng, shapes):
            captions.append({"id": len(captions) + 1, "image_id": image_id, "caption": caption})
        for k, (question, answer, question_type, answer_type) in enumerate(question_scene(rng, shapes)):
            question_id = image_id * 1000 + k
            questions.append({"image_id": image_id, "question": question, "question_id": question_id})
            annotations.append({
                "question_id": question_id,
                "image_id": image_id,
                "question_type": question_type,
                "answer_type": answer_type,
                "multiple_choice_answer": answer,
                "answers": [{"answer": answer, "answer_confidence": "yes", "answer_id": n} for n in range(1, 11)],
            })  # fmt: skip
        scenes.append({
            "image_id": image_id,
            "file_name": file_name,
            "width": image.width,
            "height": image.height,
            "shapes": [
                {"kind": s.kind, "colour": s.colour, "size": s.size, "row": s.row, "column": s.column, "box": list(s.box)}
                for s in shapes
            ],
        })  # fmt: skip

    info = {"description": f"held-out shape scenes, seed {seed}, {split}"}
    header = {"info": info, "license": {}, "data_type": "heldout_scenes", "data_subtype": split}
    _write_json(
        out / f"captions_{split}.json", {"info": info, "licenses": [], "images": images, "annotations": captions}
    )
    _write_json(out / f"questions_{split}.json", {**header, "task_type": "Open-Ended", "questions": questions})
    _write_json(out / f"annotations_{split}.json", {**header, "annotations": annotations})
    _write_json(out / f"scenes_{split}.json", {"info": info, "images": scenes})
    return {"images": len(images), "captions": len(captions), "questions": len(questions)}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------- reading

SIZE_WORDS = {"small": "small", "little": "small", "tiny": "small", "large": "large", "big": "large"}
COLOUR_WORDS = {**{c: c for c in COLOURS}, "violet": "purple"}
KIND_WORDS = {**{k: k for k in KINDS}, "rhombus": "diamond"}
DETERMINERS = {"a", "an", "the", "one"}
VERBS = {"is", "sits", "lies", "stands", "appears", "located", "placed", "positioned", "sitting", "lying", "standing"}
LEADS = (("there", "is"), ("there", "are"), ("an", "image", "of"), ("a", "picture", "of"), ("a", "photo", "of"))
RELATION_PHRASES = sorted(
    [
        *((tuple(f"{lead} left of".split()), "left of") for lead in ("to the", "on the", "at the", "")),
        *((tuple(f"{lead} right of".split()), "right of") for lead in ("to the", "on the", "at the", "")),
        *(((word,), "above") for word in ("above", "over")),
        (("higher", "than"), "above"),
        *(((word,), "below") for word in ("below", "under", "beneath", "underneath")),
        (("lower", "than"), "below"),
    ],
    key=lambda item: -len(item[0]),
)
PREPOSITIONS = {"in", "at", "on", "near"}
ROW_WORDS = {"top": 0, "upper": 0, "bottom": 2, "lower": 2}
COLUMN_WORDS = {"left": 0, "right": 2}
MIDDLE_WORDS = {"middle", "center", "centre", "central"}
PLACE_FILLERS = {"the", "of", "corner", "side", "part", "edge", "hand", "image", "picture", "frame"}


@dataclass(frozen=True)
class Mention:
    """A shape as a caption names it; a missing size or colour matches any."""

    kind: str
    size: str | None
    colour: str | None

    def matches(self, shape: Shape) -> bool:
        return (
            shape.kind == self.kind
            and self.size in (None, shape.size)
            and self.colour in (None, shape.colour)
        )  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """What a caption says: a shape and a place (row/column, None where unsaid), or a relation."""

    first: Mention
    relation: str | None = None
    second: Mention | None = None
    row: int | None = None
    column: int | None = None


def _tokens(caption: str) -> list[str]:
    text = caption.lower().replace("there's", "there is").replace("-", " ")
    for mark in ".!?;:\"'":
        text = text.replace(mark, " ")
    return text.replace(",", " , ").split()


def _read_mention(tokens: list[str], i: int) -> tuple[Mention, int] | None:
    """A determiner, at most one size and one colour word in any order, and a kind."""
    if i >= len(tokens) or tokens[i] not in DETERMINERS:
        return None
    size = colour = None
    for j in range(i + 1, len(tokens)):
        word = tokens[j]
        if word in KIND_WORDS:
            return Mention(KIND_WORDS[word], size, colour), j + 1
        if word in SIZE_WORDS and size is None:
            size = SIZE_WORDS[word]
        elif word in COLOUR_WORDS and colour is None:
            colour = COLOUR_WORDS[word]
        else:
            return None
    return None


def _read_place(words: list[str]) -> tuple[int | None, int | None] | None:
    """(row, column) of place words such as "top left corner" or "middle"; an unsaid axis is
    the middle one when a middle word is there ("top middle"), else free ("on the left")."""
    row = column = None
    middle = False
    for word in words:
        if word in ROW_WORDS:
            if row is not None and row != ROW_WORDS[word]:
                return None
            row = ROW_WORDS[word]
        elif word in COLUMN_WORDS:
            if column is not None and column != COLUMN_WORDS[word]:
                return None
            column = COLUMN_WORDS[word]
        elif word in MIDDLE_WORDS:
            middle = True
        elif word not in PLACE_FILLERS:
            return None
    if middle:
        row = 1 if row is None else row
        column = 1 if column is None else column
    if row is None and column is None:
        return None
    return row, column


def _skip(tokens: list[str], i: int, words: set[str]) -> int:
    while i < len(tokens) and tokens[i] in words:
        i += 1
    return i


def read_caption(caption: str) -> Claim | None:
    """The claim of a caption in the generator's grammar (with a few synonyms), or None."""
    tokens = _tokens(caption)
    if len(tokens) >= 3 and tokens[0] in PREPOSITIONS and tokens[1] == "the":  # "in the middle there is a ..."
        end = next((k for k in range(2, len(tokens)) if tokens[k] in {",", "there", "is", "sits", "lies"}), None)
        if end is None:
            return None
        place = _read_place(tokens[2:end])
        i = _skip(tokens, end, {","})
        if tokens[i : i + 2] == ["there", "is"]:
            i += 2
        else:
            i = _skip(tokens, i, VERBS)
        mention = _read_mention(tokens, i)
        if place is None or mention is None or mention[1] != len(tokens):
            return None
        return Claim(mention[0], row=place[0], column=place[1])

    i = 0
    for lead in LEADS:
        if tuple(tokens[: len(lead)]) == lead:
            i = len(lead)
            break
    first = _read_mention(tokens, i)
    if first is None:
        return None
    mention, i = first
    i = _skip(tokens, i, VERBS)
    for phrase, relation in RELATION_PHRASES:
        if tuple(tokens[i : i + len(phrase)]) == phrase:
            second = _read_mention(tokens, i + len(phrase))
            if second is None or second[1] != len(tokens):
                return None
            return Claim(mention, relation=relation, second=second[0])
    if i + 1 < len(tokens) and tokens[i] in PREPOSITIONS and tokens[i + 1] == "the":
        place = _read_place(tokens[i + 2 :])
        if place is not None:
            return Claim(mention, row=place[0], column=place[1])
    return None


def judge(caption: str, shapes: list[Shape]) -> dict[str, Any]:
    """How one caption fares on its scene: parsed, entirely true, its relation (if it states one
    between two shapes found in the scene) with whether it holds, and what a caption that is not
    true gets wrong first (``wrong`` and ``wrong_size``, from ``first_wrong``; both None for a
    true caption)."""
    claim = read_caption(caption)
    verdict: dict[str, Any] = {"parsed": claim is not None, "true": False, "relation": None, "place": False}
    if claim is None:
        return {**verdict, "wrong": "unparsed", "wrong_size": None}
    firsts = [s for s in shapes if claim.first.matches(s)]
    seconds = [s for s in shapes if claim.second is not None and claim.second.matches(s)]
    if claim.relation is None:
        verdict["place"] = bool(firsts)
        verdict["true"] = any(
            claim.row in (None, s.row) and claim.column in (None, s.column) for s in firsts
        )  # fmt: skip
    elif firsts and seconds:
        right = any(holds(claim.relation, a, b) for a in firsts for b in seconds if a is not b)
        verdict.update(true=right, relation=claim.relation, relation_right=right)
    verdict["wrong"], verdict["wrong_size"] = (None, None) if verdict["true"] else first_wrong(claim, shapes)
    return verdict


def first_wrong(claim: Claim, shapes: list[Shape]) -> tuple[str, str | None]:
    """What a claim that is not true gets wrong first: ``kind`` (a shape it names is not there,
    though one of that size and colour is), returned with the size of the shape it took for
    another kind (``either`` when it states no size and the scene has both); ``size or colour``
    (no shape of that size and colour); else ``relation or place``."""
    for mention in (claim.first, claim.second):
        if mention is None or any(mention.matches(s) for s in shapes):
            continue
        sizes = {s.size for s in shapes if mention.size in (None, s.size) and mention.colour in (None, s.colour)}
        if not sizes:
            return "size or colour", None
        return "kind", sizes.pop() if len(sizes) == 1 else "either"
    return "relation or place", None


# ---------------------------------------------------------------------------------------- scoring


def _refuse(path: Path, why: str) -> SystemExit:
    return SystemExit(f"{path}: {why}".replace("\n", " "))


def load_predictions(path: Path) -> list[tuple[int, str]]:
    """(image id, caption) pairs of a COCO results file, or SystemExit naming the file."""
    try:
        size = path.stat().st_size
        if size > MAX_PREDICTIONS_BYTES:
            raise _refuse(
                path, f"{size} bytes, over the {MAX_PREDICTIONS_BYTES // 2**20} MB a predictions file may have"
            )
        data = json.loads(path.read_bytes())
    except OSError as err:
        raise _refuse(path, f"cannot read the predictions: {err.strerror or err}") from None
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _refuse(path, f"not valid JSON ({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(data, list):
        raise _refuse(path, f"predictions are a JSON list of {{image_id, caption}}, not a {type(data).__name__}")
    return _pairs(path, data, "entry")


def _pairs(path: Path, entries: list[Any], what: str) -> list[tuple[int, str]]:
    """(image id, caption) of each entry, or SystemExit naming the first that is not one."""
    pairs = []
    for k, entry in enumerate(entries):
        image_id = entry.get("image_id") if isinstance(entry, dict) else None
        caption = entry.get("caption") if isinstance(entry, dict) else None
        if not isinstance(image_id, int) or isinstance(image_id, bool) or not isinstance(caption, str):
            raise _refuse(path, f"{what} {k} is not an object with an int image_id and a str caption")
        pairs.append((image_id, caption))
    return pairs


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise _refuse(path, f"cannot read it ({type(err).__name__}); was it written by `draw`?") from None


def load_scenes(out: Path, split: str) -> dict[int, list[Shape]]:
    """{image id: its shapes} of a split that `draw` wrote."""
    path = out / f"scenes_{split}.json"
    data = _read_json(path)
    try:
        scenes = {
            entry["image_id"]: [
                Shape(s["kind"], s["colour"], s["size"], s["row"], s["column"], tuple(s["box"]))
                for s in entry["shapes"]
            ]
            for entry in data["images"]
        }
    except (KeyError, TypeError) as err:
        raise _refuse(path, f"not a scenes file of `draw` ({type(err).__name__}: {err})") from None
    for image_id, shapes in scenes.items():
        for shape in shapes:
            if shape.kind not in KINDS or shape.colour not in COLOURS or shape.size not in SIZES:
                raise _refuse(path, f"image {image_id!r} has a shape `draw` does not draw: {shape.words()!r}")
    return scenes


def first_references(out: Path, split: str) -> list[tuple[int, str]]:
    """The first reference caption of each image of a split, as predictions."""
    path = out / f"captions_{split}.json"
    data = _read_json(path)
    annotations = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(annotations, list) or not annotations:
        raise _refuse(path, "not a COCO captions file: no list of annotations")
    first: dict[int, str] = {}
    for image_id, caption in _pairs(path, annotations, "annotation"):
        first.setdefault(image_id, caption)
    return sorted(first.items())


def score(scenes: dict[int, list[Shape]], predictions: list[tuple[int, str]]) -> dict[str, Any]:
    """Scores of one caption per image; images without one count as not true."""
    seen: dict[int, str] = {}
    duplicates = unknown = 0
    for image_id, caption in predictions:
        if image_id not in scenes:
            unknown += 1
        elif image_id in seen:
            duplicates += 1  # the first caption of an image is the one scored
        else:
            seen[image_id] = caption
    per_relation = {relation: {"said": 0, "right": 0} for relation in RELATIONS}
    true = parsed = places = 0
    wrong: dict[str, int] = {}
    kind_by_size = dict.fromkeys((*SIZES, "either"), 0)
    for image_id, caption in seen.items():
        verdict = judge(caption, scenes[image_id])
        true += verdict["true"]
        if verdict["wrong"] is not None:
            wrong[verdict["wrong"]] = wrong.get(verdict["wrong"], 0) + 1
        if verdict["wrong"] == "kind":
            kind_by_size[verdict["wrong_size"]] += 1
        parsed += verdict["parsed"]
        places += verdict["place"]
        if verdict["relation"] is not None:
            per_relation[verdict["relation"]]["said"] += 1
            per_relation[verdict["relation"]]["right"] += verdict["relation_right"]
    stated = sum(counts["said"] for counts in per_relation.values())
    right = sum(counts["right"] for counts in per_relation.values())
    return {
        "captions_scored": len(seen),
        "images": len(scenes),
        "missing": len(scenes) - len(seen),
        "duplicates": duplicates,
        "unknown_image_ids": unknown,
        "parsed": parsed,
        "entirely_true": round(true / len(scenes), 4) if scenes else None,
        "places_stated": places,
        "relations_stated": stated,
        "relations_right": round(right / stated, 4) if stated else None,
        "relations": per_relation,
        "not_true_first": dict(sorted(wrong.items())),
        "kind_first_wrong_by_size": kind_by_size,
    }


# ---------------------------------------------------------------------------------------- command line


def _draw(args: argparse.Namespace) -> None:
    if args.seed < 0:
        raise SystemExit(f"--seed {args.seed}: give a seed of 0 or more")
    for name, count in (("--train", args.train), ("--val", args.val)):
        if not 0 <= count <= MAX_IMAGES:
            raise SystemExit(f"{name} {count}: give 0 to {MAX_IMAGES} images")
    start = time.perf_counter()
    written = {
        split: draw_split(args.out, split, count, args.seed) for split, count in zip(SPLITS, (args.train, args.val))
    }
    seconds = time.perf_counter() - start
    parts = ", ".join(
        f"{split} {n['images']} images / {n['captions']} captions / {n['questions']} questions"
        for split, n in written.items()
    )
    print(f"wrote {parts} to {args.out} (seed {args.seed}) in {seconds:.1f}s")


def _score(args: argparse.Namespace) -> None:
    if args.references == (args.predictions is not None):
        raise SystemExit("score: give either a predictions file or --references")
    scenes = load_scenes(args.out, args.split)
    if args.references:
        predictions, source = first_references(args.out, args.split), "references"
    else:
        predictions, source = load_predictions(args.predictions), str(args.predictions)
    print(json.dumps({"split": args.split, "predictions": source, **score(scenes, predictions)}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Held-out shape scenes, drawn apart from mmtx's own generators, to measure a captioner on\n"
        "scenes it was not tuned on. Each image holds 1-3 shapes in a 3x3 layout:\n"
        f"  sizes   {', '.join(SIZES)}\n  kinds   {', '.join(KINDS)}\n  colours {', '.join(COLOURS)}\n"
        "captioned as 'a small red circle in the top left corner' (one shape) or\n"
        "'the large blue square is below the small red circle' (a true relation between two).\n\n"
        "draw writes the images with COCO captions, VQA v2 questions and the scenes;\n"
        "score checks one caption per image against the scenes and prints one JSON line.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  %(prog)s draw OUT --seed 0 --train 3000 --val 300\n"
        "  %(prog)s score OUT predictions.json --split val\n  %(prog)s score OUT --references",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    draw = commands.add_parser(
        "draw",
        help="draw images with COCO captions, VQA v2 questions and the scenes",
        description="Write OUT/{train,val}/*.png, captions_{split}.json (COCO), questions_{split}.json and "
        "annotations_{split}.json (VQA v2) and scenes_{split}.json (each shape's kind, colour, size, "
        "row, column, box). The same seed gives the same files.",
    )
    draw.add_argument("out", type=Path, metavar="OUT", help="folder to write into (created if needed)")
    draw.add_argument("--seed", type=int, default=0, help="seed of every image (default 0)")
    draw.add_argument("--train", type=int, default=3000, help="number of train images (default 3000)")
    draw.add_argument("--val", type=int, default=300, help="number of val images (default 300)")
    draw.set_defaults(run=_draw)
    scoring = commands.add_parser(
        "score",
        help="score one caption per image against the scenes; prints one JSON line",
        description='Score captions in the COCO results format ([{"image_id": int, "caption": str}], one per '
        "image) against OUT/scenes_{split}.json. entirely_true: every shape named exists with that size, "
        "colour and kind and every place and relation stated holds (a sentence outside the generator's "
        "grammar is not true; images without a caption count as not true). relations_stated: captions "
        "relating two shapes found in the scene; relations_right: the fraction of those that hold, and "
        "per relation word how many were said and right; not_true_first: what the others get wrong first "
        "(unparsed, kind, size or colour, relation or place), and kind_first_wrong_by_size the size of the "
        "shape taken for another kind.",
    )
    scoring.add_argument("out", type=Path, metavar="OUT", help="a folder written by draw")
    scoring.add_argument("predictions", type=Path, nargs="?", help="COCO results JSON (at most 50 MB)")
    scoring.add_argument("--split", choices=SPLITS, default="val", help="split to score (default val)")
    scoring.add_argument(
        "--references", action="store_true", help="score each image's first reference caption (checks the scorer)"
    )
    scoring.set_defaults(run=_score)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
