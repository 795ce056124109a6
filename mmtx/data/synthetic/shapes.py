"""Shapes scenes: the embedded caption data set, drawn on the fly so no download is needed.

Each image shows 1-3 non-overlapping shapes (circle / square / triangle, small / large,
each in a different colour) on a dark, plain or lightly textured background. Each image
gets several reference captions that vary like human references (templates, synonyms,
relation phrased from either side) but only ever state what is drawn: every caption names
every shape with its size, colour and kind, and a spatial relation is only asserted
when one shape's centre is clearly (by `RELATION_RATIO`) left/right/above/below another's.
The vocabulary is ~40 words and captions are at most `MAX_CAPTION_WORDS` long, so a tiny
captioner learns the task on a CPU in minutes.

`generate_shapes` writes the data set in the official COCO captions format, so
`read_coco_captions` serves it like any real data set. `Scene` keeps the ground truth of
an image for tests and for generating VQA questions; `scenes_for` and `shapes_val_scenes`
recompute it for a written data set, so `mmtx.data.synthetic.scoring.caption_scores` can score
a captioner's predictions against it. The shapes, their words, the caption writer and the data
set layout are those every generator shares (`mmtx.data.synthetic.scenes`).
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
    render,
    templated_caption,
)

RELATION_RATIO = 2.0  # the dominant axis offset must be at least this times the other one
MAX_CAPTION_WORDS = 16
MIN_IMAGE_SIZE = 32  # the smallest scenes drawn

# Half the side of a shape's bounding square, as a fraction of the image size. Small and
# large do not overlap (at most 0.08 vs at least 0.15), so "small" / "large" is never a guess.
_HALF_EXTENT = {"small": (0.06, 0.08), "large": (0.15, 0.19)}
_GAP_PX = 2.0  # minimum empty space between two shapes' boxes

# Caption templates by number of shapes; {0}, {1}, {2} are bare noun phrases ("big red ball").
# Relational ones state "{0} {r} {1}"; a third shape goes first or after "and there is", so
# "left of a b and a c" never reads as "left of both".
_PLAIN_TEMPLATES = {
    1: ("a {0}", "there is a {0}", "a picture of a {0}", "a {0} on a dark background", "a single {0}"),
    2: (
        "a {0} and a {1}",
        "there are a {0} and a {1}",
        "a picture of a {0} and a {1}",
        "a {0} and a {1} on a dark background",
    ),
    3: ("a {0} with a {1} and a {2}", "a {0} and a {1} and a {2}", "there are a {0} a {1} and a {2}"),
}
_RELATION_TEMPLATES = {
    2: ("a {0} {r} a {1}", "there is a {0} {r} a {1}", "a {0} is {r} a {1}", "a picture of a {0} {r} a {1}"),
    3: (
        "a {2} and a {0} {r} a {1}",
        "there is a {2} and a {0} {r} a {1}",
        "a {2} with a {0} {r} a {1}",
        "a {0} is {r} a {1} and there is a {2}",
    ),
}

_FORMAT = "mmtx-shapes"
_FORMAT_VERSION = 1  # bump when drawing or captioning changes, so cached data sets are rebuilt


@dataclass(frozen=True)
class Scene(ShapeScene):
    """Ground truth of one image: its size and its shapes (colours are unique per scene)."""

    image_size: int
    shapes: tuple[Shape, ...]

    def relation(self, i: int, j: int) -> str | None:
        """Where shape `i` is relative to shape `j` ("left", "right", "above", "below"),
        or None when neither axis dominates by `RELATION_RATIO` (e.g. a diagonal)."""
        (ax, ay), (bx, by) = self.shapes[i].center, self.shapes[j].center
        dx, dy = bx - ax, by - ay
        if abs(dx) >= RELATION_RATIO * abs(dy):
            return "left" if dx > 0 else "right"
        if abs(dy) >= RELATION_RATIO * abs(dx):
            return "above" if dy > 0 else "below"
        return None


def draw_scene(rng: random.Random, image_size: int, num_captions: int = 5) -> tuple[Image.Image, list[str], Scene]:
    """Draw one random scene: (RGB image of image_size^2, `num_captions` captions, Scene).

    Everything comes from `rng`, so the same seed gives the same pixels and captions.
    """
    check_int("image_size", image_size, MIN_IMAGE_SIZE)
    scene = _sample_scene(rng, image_size)
    image = render(_background(rng, image_size), scene.shapes)
    return image, describe_scene(scene, rng, num_captions), scene


def describe_scene(scene: Scene, rng: random.Random, num_captions: int = 5) -> list[str]:
    """Write `num_captions` distinct (where possible) lowercase captions for `scene`.

    When the scene has a clear relation, at least one caption states one.
    """
    check_int("num_captions", num_captions, 1)
    relations = scene.relations()
    captions: list[str] = []
    attempts = 0
    while len(captions) < num_captions:  # every template set has captions short enough
        attempts += 1
        with_relation = bool(relations) and (not captions or rng.random() < 0.6)
        relation = rng.choice(relations) if with_relation else None
        caption = templated_caption(scene, rng, relation, _PLAIN_TEMPLATES, _RELATION_TEMPLATES)
        unique = caption not in captions or attempts > 40 * num_captions  # few variants: allow repeats
        if unique and len(caption.split()) <= MAX_CAPTION_WORDS:
            captions.append(caption)
    rng.shuffle(captions)
    return captions


def check_spec(num_train: int, num_val: int, image_size: int, captions_per_image: int, **_: Any) -> None:
    """Refuse counts and sizes `generate_shapes` cannot draw, before anything is drawn."""
    check_int("num_train", num_train, 0, MAX_SPLIT_SIZE)
    check_int("num_val", num_val, 0, MAX_SPLIT_SIZE)
    check_int("image_size", image_size, MIN_IMAGE_SIZE)
    check_int("captions_per_image", captions_per_image, 1)


def generate_shapes(
    root: str | os.PathLike,
    num_train: int,
    num_val: int,
    image_size: int = 64,
    seed: int = 0,
    captions_per_image: int = 5,
    draw: bool = True,
) -> dict[str, tuple[Path, Path]]:
    """Write (or reuse) a shapes data set under `root` in the official COCO captions format.

    Layout: ``train/*.png``, ``val/*.png``, ``captions_train.json``, ``captions_val.json``
    and ``meta.json``, built (or reused when ``meta.json`` records these parameters) by
    `mmtx.data.synthetic.build.build_once`. Each image is drawn from its own seed derived
    from (seed, split, index), so train and val never share a random stream.

    ``draw=False``: only reuse a data set already there (see `build_once`).

    Returns {"train": (annotations_json, images_dir), "val": (annotations_json, images_dir)}.
    """
    root = Path(root)
    check_spec(num_train, num_val, image_size, captions_per_image)
    meta = dict(
        format=_FORMAT,
        version=_FORMAT_VERSION,
        num_train=num_train,
        num_val=num_val,
        image_size=image_size,
        seed=seed,
        captions_per_image=captions_per_image,
    )
    layout = {split: (root / f"captions_{split}.json", root / split) for split in SPLITS}
    build_once(root, meta, chain.from_iterable(layout.values()), _build, "shapes data set", draw)
    return layout


def scenes_for(split: str, count: int, image_size: int, seed: int) -> dict[int, Scene]:
    """The ground truth of the first `count` images of `split` of the data set that
    `generate_shapes` writes with `image_size` and `seed`, by image id.

    Each image's scene is the first thing drawn from its own random stream, so it is
    recomputed from (seed, split, index, image_size) without drawing any pixels.
    """
    image_id_of(split, 0)  # a clear error for an unknown split
    check_int("count", count, 0)
    check_int("image_size", image_size, MIN_IMAGE_SIZE)
    return {
        image_id_of(split, index): _sample_scene(image_rng(_FORMAT, seed, split, index), image_size)
        for index in range(count)
    }


def shapes_val_scenes(source: str | os.PathLike | Mapping[str, Any], split: str = "val") -> dict[int, Scene]:
    """`scenes_for` every image of `split` of a written shapes data set, by image id.

    `source` is the data set's root (its ``meta.json`` is read) or that meta dict. Scenes
    of another format version may have been drawn differently, so they are refused.
    """
    image_id_of(split, 0)
    meta = source if isinstance(source, Mapping) else json.loads(Path(source, "meta.json").read_text(encoding="utf-8"))
    if not isinstance(meta, Mapping) or (meta.get("format"), meta.get("version")) != (_FORMAT, _FORMAT_VERSION):
        raise ValueError(f"{source!r} does not describe a {_FORMAT} data set of version {_FORMAT_VERSION}")
    return scenes_for(split, meta[f"num_{split}"], meta["image_size"], meta["seed"])


def _sample_scene(rng: random.Random, image_size: int) -> Scene:
    """Place 1-3 shapes with distinct colours so that their boxes keep `_GAP_PX` apart."""
    count = rng.randint(1, 3)
    colors = rng.sample(list(COLORS), count)
    while True:  # restart from scratch if the shapes drawn so far leave no room
        shapes: list[Shape] = []
        for color in colors:
            size, kind = rng.choice(SIZES), rng.choice(KINDS)
            half = rng.uniform(*_HALF_EXTENT[size]) * image_size
            for _ in range(50):
                x, y = (rng.uniform(half + 1, image_size - half - 1) for _ in range(2))
                if all(_box_gap((x, y), half, s) >= _GAP_PX for s in shapes):
                    shapes.append(Shape(kind, color, size, (x, y), half, drawn_rgb(color, rng)))
                    break
            else:
                break
        if len(shapes) == count:
            return Scene(image_size, tuple(shapes))


def _box_gap(center: tuple[float, float], half: float, other: Shape) -> float:
    """Empty space between a square box and `other`'s box along the axis that separates them."""
    return max(abs(center[0] - other.center[0]), abs(center[1] - other.center[1])) - half - other.half


def _background(rng: random.Random, size: int) -> np.ndarray:
    """A dark (so every shape colour stands out) plain, noisy or graded background."""
    gray = rng.randint(25, 70)
    base = np.array([gray + rng.randint(-8, 8) for _ in range(3)], dtype=np.float32)
    pixels = np.broadcast_to(base, (size, size, 3)).copy()
    style = rng.choice(("plain", "noise", "gradient"))
    if style == "noise":
        noise = np.random.default_rng(rng.getrandbits(64)).normal(0.0, 6.0, (size, size, 1))
        pixels += noise.astype(np.float32)
    elif style == "gradient":
        ramp = np.linspace(-1.0, 1.0, size, dtype=np.float32) * rng.uniform(8.0, 18.0)
        pixels += ramp[:, None, None] if rng.random() < 0.5 else ramp[None, :, None]
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _build(staging: Path, meta: dict[str, Any]) -> None:
    """Draw every image of both splits into `staging` and write their annotation files."""
    image_size = meta["image_size"]
    records: dict[str, list[CaptionRecord]] = {split: [] for split in SPLITS}
    for split, image_id, rng in drawn_images(staging, meta, "shapes scenes"):
        image, captions, _ = draw_scene(rng, image_size, meta["captions_per_image"])
        path = staging / split / f"{image_id:08d}.png"
        image.save(path, format="PNG", compress_level=1)
        records[split].append(CaptionRecord(image_id, path, tuple(captions)))
    for split, written in records.items():
        sizes = {record.image_id: (image_size, image_size) for record in written}
        info = {"description": f"mmtx shapes scenes, {split} split", "version": _FORMAT_VERSION}
        write_coco_captions(written, staging / f"captions_{split}.json", staging / split, sizes=sizes, info=info)
