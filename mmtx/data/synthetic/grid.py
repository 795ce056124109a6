"""Grid scenes: a second caption data set of shapes, drawn by other rules than the shapes scenes,
so that a captioner tuned on those can be measured on a generator it was not tuned on.

Each image is `LONG_SIDES` px along its long side in one of the `ASPECTS` (1:1, 4:3, 3:4,
16:9), written at its own size: the data module squashes it to ``data.image_size`` like any
COCO image. Its background is a dark colour of random hue, plain or blended into a second one.
It shows 1-3 shapes with the shapes scenes' colours, kinds and sizes (colours unique per scene),
each in its own cell of a 3x3 grid, moved from the cell's centre by up to `JITTER` of the
cell's width and height, and sized by the cell's shorter side.

Relations follow the grid (`GridScene.relation`): a shape is left or right of another when
their cells share a row, above or below when they share a column; two shapes in different rows
and columns stand in none. The jitter keeps a related pair clear: in the squashed image, shapes
one row apart are at least 1 - 2 * `JITTER` cells apart that way and at most 2 * `JITTER`
cells apart the other, more than the shapes scenes' `RELATION_RATIO` asks.

Each image gets five captions (``captions_per_image``). When some pair of its shapes is related,
every caption states the relation of such a pair, drawn at random and phrased from either side
("a small red circle to the left of a large blue square", "the big blue box is right of the tiny
red ball"); a third shape is named first or in a clause of its own, never after the relation's
object. A scene without a related pair gets captions that name its shapes only. Every caption
names every shape with its size, colour and kind, in the shapes scenes' words
(`mmtx.data.synthetic.scenes`), so their scorer (`mmtx.data.synthetic.scoring.caption_scores`)
reads these captions too; the templates and orders differ, so a captioner tuned on the shapes
scenes is tested on binding, not on vocabulary.

`generate_grid` writes the data set in the official COCO captions format, as `generate_shapes`
does; `scenes_for` and `grid_scenes` recompute the ground truth of a written one.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mmtx.data.captions.files import CaptionRecord, write_coco_captions
from mmtx.data.synthetic.build import build_once
from mmtx.data.synthetic.scenes import (
    _COLUMN_WORDS,
    _ROW_WORDS,
    COLORS,
    KINDS,
    MAX_SPLIT_SIZE,
    SIZES,
    SPLITS,
    Shape,
    ShapeScene,
    check_int,
    drawn_images,
    drawn_rgb,
    image_id_of,
    image_rng,
    noun_phrase,
    render,
    templated_caption,
)

ASPECTS: tuple[tuple[int, int], ...] = ((1, 1), (4, 3), (3, 4), (16, 9))  # width : height
LONG_SIDES: tuple[int, ...] = (96, 128, 160)  # pixels along an image's longer side
GRID = 3  # rows and columns
JITTER = 0.12  # a shape's centre moves up to this share of its cell's width (height) from the cell's centre
MAX_CAPTION_WORDS = 20

# Half the side of a shape's bounding square, as a share of its cell's shorter side. With the
# jitter a box stays inside its cell (0.34 + 0.12 < 0.5), and small and large never meet.
_HALF_OF_CELL = {"small": (0.13, 0.17), "large": (0.28, 0.34)}
_DARK = (10, 70)  # each background channel is drawn from this range: every shape colour stands out

# Caption templates by number of shapes; {0}, {1}, {2} are bare noun phrases ("big red ball").
# Relational ones state "{0} {r} {1}"; the third shape comes first or in its own clause.
_RELATION_TEMPLATES = {
    2: (
        "a {0} {r} a {1}",
        "the {0} is {r} the {1}",
        "a {0} sits {r} a {1}",
        "we see a {0} {r} a {1}",
        "in this image the {0} is {r} the {1}",
    ),
    3: (
        "we see a {2} and a {0} {r} a {1}",
        "a {2} as well as a {0} {r} a {1}",
        "the {0} is {r} the {1} and a {2} is elsewhere",
        "apart from a {2} the {0} sits {r} the {1}",
    ),
}
_PLAIN_TEMPLATES = {
    1: ("a {0}", "a lone {0}", "the image shows a {0}", "just a {0} in the picture", "one {0} on a dark background"),
    2: ("a {0} and a {1}", "the image shows a {0} and a {1}", "we see a {0} and a {1}", "a {0} together with a {1}"),
    3: (
        "a {0} a {1} and a {2}",
        "we see a {0} a {1} and a {2}",
        "the image shows a {0} a {1} and a {2}",
        "a {0} with a {1} and a {2}",
    ),
}

# What the captions say: "relations" state a relation of a related pair where there is one;
# "places" say where each shape stands ("a big red ball at the top left and ..."), which teaches
# a captioner to find a named shape before it has to relate two (docs/learning.md).
CAPTION_KINDS = ("relations", "places")

_FORMAT = "mmtx-grid"
_FORMAT_VERSION = 1  # bump when drawing or captioning changes, so cached data sets are rebuilt


@dataclass(frozen=True)
class GridScene(ShapeScene):
    """Ground truth of one grid image: its size in pixels, its shapes (centres and sizes in
    those pixels, colours unique) and the (row, column) cell of each, row 0 at the top."""

    width: int
    height: int
    shapes: tuple[Shape, ...]
    cells: tuple[tuple[int, int], ...]

    def relation(self, i: int, j: int) -> str | None:
        """Where shape `i` is relative to shape `j`: "left" / "right" when their cells share a
        row, "above" / "below" when they share a column, None when they share neither."""
        (row_i, col_i), (row_j, col_j) = self.cells[i], self.cells[j]
        if row_i == row_j and col_i != col_j:
            return "left" if col_i < col_j else "right"
        if col_i == col_j and row_i != row_j:
            return "above" if row_i < row_j else "below"
        return None


def image_dims(long_side: int, aspect: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of an image `long_side` px along its longer side with `aspect` (w, h)."""
    aw, ah = aspect
    return (long_side, round(long_side * ah / aw)) if aw >= ah else (round(long_side * aw / ah), long_side)


def draw_grid_scene(
    rng: random.Random, num_captions: int = 5, captions: str = "relations"
) -> tuple[Image.Image, list[str], GridScene]:
    """Draw one random grid scene: (RGB image at its own size, `num_captions` captions, GridScene).

    Everything comes from `rng`, the scene first, so the same seed gives the same pixels and
    captions and `scenes_for` recomputes the scene without drawing.
    """
    scene = _sample_scene(rng)
    image = render(background(rng, scene.width, scene.height), scene.shapes)
    return image, describe_grid_scene(scene, rng, num_captions, captions), scene


def describe_grid_scene(
    scene: GridScene, rng: random.Random, num_captions: int = 5, captions: str = "relations"
) -> list[str]:
    """Write `num_captions` distinct (where possible) lowercase captions for `scene`: each
    states one of its relations, drawn at random, when it has any; with ``captions="places"``
    each names every shape, in random order, with where it stands."""
    check_int("num_captions", num_captions, 1)
    check_caption_kind(captions)
    if captions == "places":
        return [place_caption(scene, rng) for _ in range(num_captions)]
    relations = scene.relations()  # both orders of each related pair
    captions: list[str] = []
    attempts = 0
    while len(captions) < num_captions:
        attempts += 1
        relation = rng.choice(relations) if relations else None
        caption = templated_caption(scene, rng, relation, _PLAIN_TEMPLATES, _RELATION_TEMPLATES)
        if caption not in captions or attempts > 40 * num_captions:  # few variants: allow repeats
            captions.append(caption)
    return captions


def place_caption(scene: GridScene, rng: random.Random) -> str:
    """ "a big red ball at the top left and a tiny blue box at the middle centre": every shape,
    in random order, with its cell's row and column."""
    order = list(range(len(scene.shapes)))
    rng.shuffle(order)
    return " and ".join(
        f"a {noun_phrase(scene.shapes[k], rng)} at the {_ROW_WORDS[scene.cells[k][0]]} {_COLUMN_WORDS[scene.cells[k][1]]}"
        for k in order
    )


def check_caption_kind(captions: str) -> None:
    if captions not in CAPTION_KINDS:
        raise ValueError(f"data.captions={captions!r} must be one of {', '.join(CAPTION_KINDS)}")


def check_spec(num_train: int, num_val: int, captions_per_image: int, captions: str = "relations", **_: Any) -> None:
    """Refuse counts and caption kinds `generate_grid` cannot draw, before anything is drawn."""
    check_int("num_train", num_train, 0, MAX_SPLIT_SIZE)
    check_int("num_val", num_val, 0, MAX_SPLIT_SIZE)
    check_int("captions_per_image", captions_per_image, 1)
    check_caption_kind(captions)


def generate_grid(
    root: str | os.PathLike,
    num_train: int,
    num_val: int,
    seed: int = 0,
    captions_per_image: int = 5,
    captions: str = "relations",
    draw: bool = True,
) -> dict[str, tuple[Path, Path]]:
    """Write (or reuse) a grid scenes data set under `root` in the official COCO captions format.

    The layout, caching and image ids are those of `mmtx.data.synthetic.shapes.generate_shapes`
    (``train/*.png``, ``val/*.png``, ``captions_{train,val}.json``, ``meta.json``), and each
    image is drawn from its own stream derived from (seed, split, index). The images keep their
    own sizes, recorded in the annotation files. ``captions``: what they say (`CAPTION_KINDS`).
    ``draw=False``: only reuse one already there.

    Returns {"train": (annotations_json, images_dir), "val": (annotations_json, images_dir)}.
    """
    root = Path(root)
    check_spec(num_train, num_val, captions_per_image, captions)
    meta = dict(
        format=_FORMAT,
        version=_FORMAT_VERSION,
        num_train=num_train,
        num_val=num_val,
        seed=seed,
        captions_per_image=captions_per_image,
        captions=captions,
    )
    layout = {split: (root / f"captions_{split}.json", root / split) for split in SPLITS}
    build_once(root, meta, chain.from_iterable(layout.values()), _build, "grid scenes data set", draw)
    return layout


def scenes_for(split: str, count: int, seed: int) -> dict[int, GridScene]:
    """The ground truth of the first `count` images of `split` of the data set `generate_grid`
    writes with `seed`, by image id, recomputed without drawing any pixels."""
    image_id_of(split, 0)  # a clear error for an unknown split
    check_int("count", count, 0)
    return {image_id_of(split, index): _sample_scene(image_rng(_FORMAT, seed, split, index)) for index in range(count)}


def grid_scenes(source: str | os.PathLike | Mapping[str, Any], split: str = "val") -> dict[int, GridScene]:
    """`scenes_for` every image of `split` of a written grid data set (its root, whose
    ``meta.json`` is read, or that meta dict), by image id; another format version is refused."""
    image_id_of(split, 0)
    meta = source if isinstance(source, Mapping) else json.loads(Path(source, "meta.json").read_text(encoding="utf-8"))
    if not isinstance(meta, Mapping) or (meta.get("format"), meta.get("version")) != (_FORMAT, _FORMAT_VERSION):
        raise ValueError(f"{source!r} does not describe a {_FORMAT} data set of version {_FORMAT_VERSION}")
    return scenes_for(split, meta[f"num_{split}"], meta["seed"])


def _sample_scene(rng: random.Random) -> GridScene:
    """An image size, then 1-3 shapes of distinct colours in distinct cells."""
    width, height = image_dims(rng.choice(LONG_SIDES), rng.choice(ASPECTS))
    count = rng.randint(1, 3)
    colors = rng.sample(list(COLORS), count)
    cells = rng.sample([(row, col) for row in range(GRID) for col in range(GRID)], count)
    return place_shapes(rng, width, height, colors, cells)


def place_shapes(
    rng: random.Random, width: int, height: int, colors: list[str], cells: list[tuple[int, int]]
) -> GridScene:
    """A scene of `width` x `height` px with one shape of each colour in its (row, column) cell:
    a random size and kind, jittered from the cell's centre."""
    cell_w, cell_h = width / GRID, height / GRID
    shapes = []
    for color, (row, col) in zip(colors, cells):
        size, kind = rng.choice(SIZES), rng.choice(KINDS)
        half = rng.uniform(*_HALF_OF_CELL[size]) * min(cell_w, cell_h)
        x = (col + 0.5 + rng.uniform(-JITTER, JITTER)) * cell_w
        y = (row + 0.5 + rng.uniform(-JITTER, JITTER)) * cell_h
        shapes.append(Shape(kind, color, size, (x, y), half, drawn_rgb(color, rng)))
    return GridScene(width, height, tuple(shapes), tuple(cells))


def background(rng: random.Random, width: int, height: int) -> np.ndarray:
    """A dark colour of random hue, plain or blended into a second one across or down the image."""
    first = np.array([rng.randint(*_DARK) for _ in range(3)], dtype=np.float32)
    pixels = np.broadcast_to(first, (height, width, 3))
    if rng.random() < 0.5:
        second = np.array([rng.randint(*_DARK) for _ in range(3)], dtype=np.float32)
        across = rng.random() < 0.5
        t = np.linspace(0.0, 1.0, width if across else height, dtype=np.float32)
        t = t[None, :, None] if across else t[:, None, None]
        pixels = np.broadcast_to(first + (second - first) * t, (height, width, 3))
    return np.rint(pixels).astype(np.uint8)


def _build(staging: Path, meta: dict[str, Any]) -> None:
    """Draw every image of both splits into `staging` and write their annotation files."""
    records: dict[str, list[CaptionRecord]] = {split: [] for split in SPLITS}
    sizes: dict[int, tuple[int, int]] = {}
    for split, image_id, rng in drawn_images(staging, meta, "grid scenes"):
        image, captions, _ = draw_grid_scene(rng, meta["captions_per_image"], meta["captions"])
        path = staging / split / f"{image_id:08d}.png"
        image.save(path, format="PNG", compress_level=1)
        records[split].append(CaptionRecord(image_id, path, tuple(captions)))
        sizes[image_id] = image.size
    for split, written in records.items():
        info = {"description": f"mmtx grid scenes, {split} split", "version": _FORMAT_VERSION}
        write_coco_captions(written, staging / f"captions_{split}.json", staging / split, sizes=sizes, info=info)
