"""Shape scenes: what the drawn caption data sets share, so each generator only adds its own rules.

A scene is a few `Shape`s (kind, colour, size, where) on a background; a `ShapeScene` says
where one of its shapes stands relative to another, each generator by its own rule. Every
generator names shapes and relations in the same words (`_SIZE_WORDS`, `_KIND_WORDS`,
`_RELATION_WORDS`, with synonyms) through `templated_caption`, so one scorer
(`mmtx.data.synthetic.scoring`) reads the captions of all of them. The data sets share a layout
too: a train and a val split with image ids unique across both, and one random stream per image
(`image_rng`), so any image, or just its scene, can be redrawn alone.
"""

from __future__ import annotations

import random
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from mmtx.config_error import ArgumentError, is_int

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 175, 60),
    "blue": (50, 90, 235),
    "yellow": (235, 215, 50),
    "purple": (155, 60, 205),
    "white": (240, 240, 240),
}
KINDS: tuple[str, ...] = ("circle", "square", "triangle")
SIZES: tuple[str, ...] = ("small", "large")
RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")

_SIZE_WORDS = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
_KIND_WORDS = {"circle": ("circle", "ball"), "square": ("square", "box"), "triangle": ("triangle",)}
_RELATION_WORDS = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}

# Where a grid scene's shape stands, by its cell's row and column ("at the top left").
_ROW_WORDS, _COLUMN_WORDS = ("top", "middle", "bottom"), ("left", "centre", "right")

_SQUARE_FILL = 0.85  # a square fills 85% of its box side, so its area is close to the circle's
_COLOR_JITTER = 12  # per-channel jitter of the drawn colour, for a little realism
_SUPERSAMPLE = 4  # draw at 4x and box-downsample: anti-aliased edges

_VAL_ID_BASE = 10_000_000  # val image ids start here: unique across splits and stable
_ID_BASES = {"train": 0, "val": _VAL_ID_BASE}  # image id = base + index + 1
SPLITS: tuple[str, ...] = tuple(_ID_BASES)  # the splits a drawn data set has (`drawn_images`)
MAX_SPLIT_SIZE = _VAL_ID_BASE - 1  # the most images a split may have: train ids stay below val ones


@dataclass(frozen=True)
class Shape:
    """One drawn shape; `center` is (x, y) in pixels with y pointing down."""

    kind: str
    color: str
    size: str
    center: tuple[float, float]
    half: float  # half the side of the shape's bounding square, in pixels
    rgb: tuple[int, int, int]  # the colour actually drawn (the named colour plus jitter)

    @property
    def box(self) -> tuple[float, float, float, float]:
        """Bounding square (x0, y0, x1, y1) in pixels."""
        x, y = self.center
        return (x - self.half, y - self.half, x + self.half, y + self.half)


class ShapeScene(ABC):
    """What the caption scorer reads of a drawn scene: its shapes (colours unique per scene)
    and where one stands relative to another."""

    shapes: tuple[Shape, ...]

    @abstractmethod
    def relation(self, i: int, j: int) -> str | None:
        """Where shape `i` is relative to shape `j` ("left", "right", "above", "below"), or None."""

    def relations(self) -> list[tuple[int, str, int]]:
        """All clear relations as (i, relation, j), both orders of each pair included."""
        pairs = permutations(range(len(self.shapes)), 2)
        return [(i, rel, j) for i, j in pairs if (rel := self.relation(i, j)) is not None]


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if not is_int(value) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ArgumentError(f"{{{name}!r}} must be an integer {bounds}", **{name: value})


def _id_base(split: str) -> int:
    """The image id base of `split` (ids are base + index + 1)."""
    if split not in _ID_BASES:
        raise ValueError(f"split must be one of {sorted(_ID_BASES)}, got {split!r}")
    return _ID_BASES[split]


def image_id_of(split: str, index: int) -> int:
    """The image id of the `index`-th image of `split`: unique across splits, never 0."""
    return _id_base(split) + index + 1


def image_rng(fmt: str, seed: int, split: str, index: int) -> random.Random:
    """The random stream the `index`-th image of `split` of a data set of format `fmt` is drawn
    from: its own, so the splits never share one and any image (or just its scene) can be redrawn alone."""
    return random.Random(f"{fmt}/{seed}/{split}/{index}")  # str seeds hash stably


def drawn_images(staging: Path, meta: Mapping[str, Any], desc: str) -> Iterator[tuple[str, int, random.Random]]:
    """(split, image id, random stream) of each image of both splits of the data set `meta`
    describes, in order, under a progress bar; makes each split's images folder in `staging`."""
    with tqdm(total=meta["num_train"] + meta["num_val"], desc=desc, unit="img", file=sys.stderr) as bar:
        for split in _ID_BASES:
            (staging / split).mkdir()
            for index in range(meta[f"num_{split}"]):
                yield split, image_id_of(split, index), image_rng(meta["format"], meta["seed"], split, index)
                bar.update()


def drawn_rgb(color: str, rng: random.Random) -> tuple[int, int, int]:
    """The colour a shape named `color` is drawn in: the named one with a little jitter per channel."""
    jitter = (rng.randint(-_COLOR_JITTER, _COLOR_JITTER) for _ in range(3))
    return tuple(min(255, max(0, c + d)) for c, d in zip(COLORS[color], jitter))  # type: ignore[return-value]


def render(background: np.ndarray, shapes: Iterable[Shape]) -> Image.Image:
    """Draw `shapes` on `background` (H, W, 3 uint8, any aspect) at `_SUPERSAMPLE`x and
    box-downsample: anti-aliased edges."""
    k = _SUPERSAMPLE
    height, width = background.shape[:2]
    canvas = Image.fromarray(background).resize((width * k, height * k), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(canvas)
    for shape in shapes:
        x0, y0, x1, y1 = (v * k for v in shape.box)
        if shape.kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=shape.rgb)
        elif shape.kind == "square":
            inset = (1.0 - _SQUARE_FILL) * shape.half * k
            draw.rectangle((x0 + inset, y0 + inset, x1 - inset, y1 - inset), fill=shape.rgb)
        else:  # triangle pointing up; its centroid (and the box centre) lie inside it
            draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=shape.rgb)
    return canvas.reduce(k)


def noun_phrase(shape: Shape, rng: random.Random) -> str:
    """ "little red box": size, colour and kind, with synonyms, without an article."""
    size, kind = rng.choice(_SIZE_WORDS[shape.size]), rng.choice(_KIND_WORDS[shape.kind])
    return f"{size} {shape.color} {kind}"


def relation_phrase(relation: str, rng: random.Random) -> str:
    """ "to the left of": one of the phrases for `relation` ("left", "right", "above", "below")."""
    return rng.choice(_RELATION_WORDS[relation])


def templated_caption(
    scene: ShapeScene,
    rng: random.Random,
    relation: tuple[int, str, int] | None,
    plain: Mapping[int, tuple[str, ...]],
    relational: Mapping[int, tuple[str, ...]],
) -> str:
    """One caption naming every shape, from the generator's templates for the scene's number of
    shapes: a `plain` one naming them in random order, or a `relational` one stating `relation`
    (i, rel, j) when given: shape i goes to ``{0}``, j to ``{1}``, the phrase to ``{r}``."""
    shapes = list(scene.shapes)
    if relation is None:
        rng.shuffle(shapes)
        template, rel_words = rng.choice(plain[len(shapes)]), ""
    else:
        i, rel, j = relation
        shapes = [shapes[i], shapes[j]] + [s for k, s in enumerate(shapes) if k not in (i, j)]
        template, rel_words = rng.choice(relational[len(shapes)]), relation_phrase(rel, rng)
    return template.format(*(noun_phrase(s, rng) for s in shapes), r=rel_words)
