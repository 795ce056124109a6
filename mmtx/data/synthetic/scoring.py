"""Caption scoring on drawn scenes: reads a caption back into the shapes and relations it states
and checks them against the scene it describes.

n-gram metrics such as CIDEr reward fluent but wrong captions too, so a captioner on drawn data
is also scored on truth: `caption_scores` gives the share of captions that name every shape
right and state only true relations (`caption_is_correct`), and the share of the relations they
state that hold (`relation_judgements`). The reader knows the words every generator writes
(`mmtx.data.synthetic.scenes`) and reads any `ShapeScene`, so the shapes and the grid scenes
share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from mmtx.data.synthetic.scenes import (
    _COLUMN_WORDS,
    _KIND_WORDS,
    _RELATION_WORDS,
    _ROW_WORDS,
    _SIZE_WORDS,
    COLORS,
    ShapeScene,
)

# The words of the generators' phrases, by meaning.
_WORD = re.compile(r"[a-z0-9]+")  # lowercase words; punctuation only separates them
_SIZE_OF = {word: size for size, words in _SIZE_WORDS.items() for word in words}
_KIND_OF = {word: kind for kind, words in _KIND_WORDS.items() for word in words}
_RELATION_OF = {tuple(p.split()): rel for rel, phrases in _RELATION_WORDS.items() for p in phrases}
_RELATION_LENGTHS = sorted({len(p) for p in _RELATION_OF}, reverse=True)  # longest match first
# Words that claim something, so they may only stand inside a complete noun or relation phrase:
# the data set's colour, size, kind and relation words, their plurals, and look-alikes it never
# draws (a caption calling a shape "orange" or "huge" states something the scene cannot back).
_CLAIM_WORDS = frozenset(
    {*COLORS, *_SIZE_OF, *_KIND_OF}
    | ({word for phrase in _RELATION_OF for word in phrase} - {"to", "the", "on", "of"})
    | {word + ("es" if word.endswith("x") else "s") for word in _KIND_OF}
    | {"orange", "pink", "black", "gray", "grey", "brown", "cyan", "magenta", "violet", "gold", "silver"}
    | {"rectangle", "oval", "ellipse", "star", "diamond", "hexagon", "pentagon", "cube", "sphere", "dot"}
    | {"medium", "huge", "giant", "bigger", "smaller", "larger", "biggest", "smallest", "largest"}
    | {"beside", "near", "next", "between", "behind", "inside", *_ROW_WORDS, *_COLUMN_WORDS}
)


# What can be wrong in a caption, in the order `caption_error` checks it.
ERRORS = ("stray word", "shapes named", "size", "kind", "place", "relation")


def caption_is_correct(caption: str, scene: ShapeScene) -> bool:
    """Whether `caption` names every shape of `scene` once, each with its true size, colour
    and kind, and states only true relations, the way every generated caption does.

    Words are read lowercase with punctuation ignored. A noun phrase is "SIZE COLOUR KIND"
    (with the generator's synonyms); a relation phrase (longest match first) must stand
    between two noun phrases A ... r ... B and hold as ``scene.relation(A, B) == r``; a place
    right after a noun phrase ("at the top left") must be its shape's cell in a grid scene.
    Other words are free ("a", "there is", "on a dark background"), except words that
    claim something (`_CLAIM_WORDS`) outside a complete phrase: "a red ball" or "an orange
    box" are wrong, as is a relation with no shape on one side.
    """
    return caption_error(caption, scene) is None


def caption_error(caption: str, scene: ShapeScene) -> str | None:
    """The first of `ERRORS` that makes `caption` wrong for `scene`, None when it is correct
    (`caption_is_correct`): a claiming word outside a phrase, the shapes named (each colour of
    the scene once, no other), a size, a kind, a place, a relation."""
    items, stray = _parse_caption(caption)
    if stray:
        return "stray word"
    index = {shape.color: k for k, shape in enumerate(scene.shapes)}  # colours are unique per scene
    named = [item for item in items if isinstance(item, _NounPhrase)]
    if sorted(phrase.color for phrase in named) != sorted(index):  # each shape once, nothing else
        return "shapes named"
    shapes = [scene.shapes[index[phrase.color]] for phrase in named]
    if any(phrase.size != shape.size for phrase, shape in zip(named, shapes)):
        return "size"
    if any(phrase.kind != shape.kind for phrase, shape in zip(named, shapes)):
        return "kind"
    cells = getattr(scene, "cells", None)  # only grid scenes have places to be judged by
    for phrase, place in zip(items, items[1:]):
        if isinstance(place, _Place) and (cells is None or cells[index[phrase.color]] != place.cell):
            return "place"
    if not all(a is not None and b is not None and _holds(scene, index, a, rel, b) for a, rel, b in _stated(items)):
        return "relation"
    return None


def relation_judgements(caption: str, scene: ShapeScene) -> list[bool]:
    """Whether each relation `caption` states between two shapes of `scene` holds, in text order.

    A relation counts when it stands between two noun phrases A ... r ... B (as
    `caption_is_correct` reads them) whose colours name two different shapes of the scene,
    whatever the rest of the caption says; it holds when ``scene.relation(A, B) == r``. A
    relation with no shape on one side, or naming a colour the scene lacks, is not counted:
    `caption_is_correct` judges those captions wrong anyway.
    """
    items, _ = _parse_caption(caption)
    index = {shape.color: k for k, shape in enumerate(scene.shapes)}
    return [
        _holds(scene, index, a, rel, b) for a, rel, b in _stated(items)
        if a is not None and b is not None and a.color in index and b.color in index and a.color != b.color
    ]  # fmt: skip


def caption_scores(predictions: Mapping[int, str], scenes: Mapping[int, ShapeScene]) -> dict[str, float]:
    """How true predicted captions are of their drawn scenes.

    ``correctness``: the share (0..1) of captions that `caption_is_correct` judges right;
    ``relations_stated``: how many relations the captions state between two shapes of their
    scene (`relation_judgements`); ``relation_accuracy``: the share (0..1) of those that hold,
    absent when none is stated. A captioner that relates the right shapes on the right axis
    but picks the side by chance scores about 0.5 there, however correct its nouns.

    `predictions` maps image ids to one caption each; `scenes` (e.g.
    `mmtx.data.synthetic.shapes.shapes_val_scenes`) must hold every predicted id and may hold
    more, so a partial evaluation can be scored.
    """
    if not predictions:
        raise ValueError("predictions is empty: nothing to score")
    unknown = [image_id for image_id in predictions if image_id not in scenes]
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
        raise ValueError(f"predictions without scenes: {len(unknown)} id(s), first {shown}")
    for image_id, caption in predictions.items():
        if not isinstance(caption, str):
            raise ValueError(f"predictions[{image_id!r}] must be a str, got {type(caption).__name__}")
    correct = sum(caption_is_correct(caption, scenes[image_id]) for image_id, caption in predictions.items())
    judged = [
        held for image_id, caption in predictions.items() for held in relation_judgements(caption, scenes[image_id])
    ]
    accuracy = {"relation_accuracy": sum(judged) / len(judged)} if judged else {}
    return {"correctness": correct / len(predictions), **accuracy, "relations_stated": float(len(judged))}


def caption_correctness(predictions: Mapping[int, str], scenes: Mapping[int, ShapeScene]) -> float:
    """The share (0..1) of predicted captions that `caption_is_correct` judges right (`caption_scores`)."""
    return caption_scores(predictions, scenes)["correctness"]


class _Place(NamedTuple):
    """A caption's "at the top left" after a noun phrase: the (row, column) of a grid cell."""

    cell: tuple[int, int]


class _NounPhrase(NamedTuple):
    """A caption's "big red ball", read back as (size, colour, kind) names of a `Shape`."""

    size: str
    color: str
    kind: str


def _parse_caption(caption: str) -> tuple[list[_NounPhrase | _Place | str], bool]:
    """The noun phrases, their places ("at the top left", right after a phrase) and relations
    ("left", ...) of `caption` in text order, and whether a claiming word stands outside a
    complete phrase."""
    words = _WORD.findall(caption.lower())
    items: list[_NounPhrase | str] = []
    stray = False
    i = 0
    while i < len(words):
        size, color, kind = (words[i : i + 3] + ["", "", ""])[:3]
        if size in _SIZE_OF and color in COLORS and kind in _KIND_OF:
            items.append(_NounPhrase(_SIZE_OF[size], color, _KIND_OF[kind]))
            i += 3
            at, the, row, column = (words[i : i + 4] + ["", "", "", ""])[:4]
            if (at, the) == ("at", "the") and row in _ROW_WORDS and column in _COLUMN_WORDS:
                items.append(_Place((_ROW_WORDS.index(row), _COLUMN_WORDS.index(column))))
                i += 4
            continue
        length = next((n for n in _RELATION_LENGTHS if tuple(words[i : i + n]) in _RELATION_OF), 0)
        if length:
            items.append(_RELATION_OF[tuple(words[i : i + length])])
            i += length
        else:
            stray = stray or words[i] in _CLAIM_WORDS
            i += 1
    return items, stray


def _stated(items: list[_NounPhrase | _Place | str]) -> Iterator[tuple[_NounPhrase | None, str, _NounPhrase | None]]:
    """Each relation of a parsed caption as (A, r, B): the noun phrases before and after it,
    None where there is none ("left of a big red ball": left of what?)."""
    subject: _NounPhrase | None = None
    pending: list[str] = []  # relations since `subject`, waiting for the next phrase
    for item in items:
        if isinstance(item, _Place):
            continue
        if isinstance(item, _NounPhrase):
            yield from ((subject, rel, item) for rel in pending)
            subject, pending = item, []
        else:
            pending.append(item)
    yield from ((subject, rel, None) for rel in pending)


def _holds(scene: ShapeScene, index: dict[str, int], a: _NounPhrase, rel: str, b: _NounPhrase) -> bool:
    """Whether the shape coloured as `a` stands `rel` of the one coloured as `b` (`index`: colour -> shape)."""
    i, j = index[a.color], index[b.color]
    return i != j and scene.relation(i, j) == rel
