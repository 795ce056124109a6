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
recompute it for a written data set, and `caption_scores` scores a captioner's predictions
against it: the share of captions that name every shape right and state only true relations
(n-gram metrics such as CIDEr reward fluent but wrong captions too), and the share of the
relations they state that hold. The scorer reads any `ShapeScene`, so the grid scenes
(`mmtx.data.synthetic.grid`) share it.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, permutations
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from mmtx.data.captions.files import CaptionRecord, write_coco_captions
from mmtx.data.synthetic.build import build_once

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
RELATION_RATIO = 2.0  # the dominant axis offset must be at least this times the other one
MAX_CAPTION_WORDS = 16
MIN_IMAGE_SIZE = 32  # the smallest scenes drawn

# Half the side of a shape's bounding square, as a fraction of the image size. Small and
# large do not overlap (at most 0.08 vs at least 0.15), so "small" / "large" is never a guess.
_HALF_EXTENT = {"small": (0.06, 0.08), "large": (0.15, 0.19)}
_SQUARE_FILL = 0.85  # a square fills 85% of its box side, so its area is close to the circle's
_COLOR_JITTER = 12  # per-channel jitter of the drawn colour, for a little realism
_GAP_PX = 2.0  # minimum empty space between two shapes' boxes
_SUPERSAMPLE = 4  # draw at 4x and box-downsample: anti-aliased edges

_SIZE_WORDS = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
_KIND_WORDS = {"circle": ("circle", "ball"), "square": ("square", "box"), "triangle": ("triangle",)}
_RELATION_WORDS = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}

# Caption templates by number of shapes; {0}, {1}, {2} are bare noun phrases ("big red ball").
# Relational ones state "{0} {r} {1}"; a third shape goes first or after "and there is", so
# "left of a b and a c" never reads as "left of both".
_PLAIN_TEMPLATES = {
    1: ("a {0}", "there is a {0}", "a picture of a {0}", "a {0} on a dark background", "a single {0}"),
    2: ("a {0} and a {1}", "there are a {0} and a {1}", "a picture of a {0} and a {1}",
        "a {0} and a {1} on a dark background"),
    3: ("a {0} with a {1} and a {2}", "a {0} and a {1} and a {2}", "there are a {0} a {1} and a {2}"),
}
_RELATION_TEMPLATES = {
    2: ("a {0} {r} a {1}", "there is a {0} {r} a {1}", "a {0} is {r} a {1}", "a picture of a {0} {r} a {1}"),
    3: ("a {2} and a {0} {r} a {1}", "there is a {2} and a {0} {r} a {1}", "a {2} with a {0} {r} a {1}",
        "a {0} is {r} a {1} and there is a {2}"),
}

_FORMAT = "mmtx-shapes"
_FORMAT_VERSION = 1  # bump when drawing or captioning changes, so cached data sets are rebuilt
_VAL_ID_BASE = 10_000_000  # val image ids start here: unique across splits and stable
_ID_BASES = {"train": 0, "val": _VAL_ID_BASE}  # image id = base + index + 1
SPLITS: tuple[str, ...] = tuple(_ID_BASES)  # the splits a drawn data set has (`drawn_images`)
MAX_SPLIT_SIZE = _VAL_ID_BASE - 1  # the most images a split may have: train ids stay below val ones

# Reading captions back (`caption_is_correct`): words in the generator's phrases, by meaning.
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
    | {"beside", "near", "next", "between", "behind", "inside", "top", "bottom"}
)


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


def draw_scene(
    rng: random.Random, image_size: int, num_captions: int = 5
) -> tuple[Image.Image, list[str], Scene]:
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
        caption = templated_caption(scene, rng, rng.choice(relations) if with_relation else None)
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


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}={value!r} must be an integer {bounds}")


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
    meta = dict(format=_FORMAT, version=_FORMAT_VERSION, num_train=num_train, num_val=num_val,
                image_size=image_size, seed=seed, captions_per_image=captions_per_image)
    layout = {split: (root / f"captions_{split}.json", root / split) for split in _ID_BASES}
    build_once(root, meta, chain.from_iterable(layout.values()), _build, "shapes data set", draw)
    return layout


def scenes_for(split: str, count: int, image_size: int, seed: int) -> dict[int, Scene]:
    """The ground truth of the first `count` images of `split` of the data set that
    `generate_shapes` writes with `image_size` and `seed`, by image id.

    Each image's scene is the first thing drawn from its own random stream, so it is
    recomputed from (seed, split, index, image_size) without drawing any pixels.
    """
    _id_base(split)  # a clear error for an unknown split
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
    _id_base(split)
    meta = source if isinstance(source, Mapping) else json.loads(Path(source, "meta.json").read_text(encoding="utf-8"))
    if not isinstance(meta, Mapping) or (meta.get("format"), meta.get("version")) != (_FORMAT, _FORMAT_VERSION):
        raise ValueError(f"{source!r} does not describe a {_FORMAT} data set of version {_FORMAT_VERSION}")
    return scenes_for(split, meta[f"num_{split}"], meta["image_size"], meta["seed"])


def caption_is_correct(caption: str, scene: ShapeScene) -> bool:
    """Whether `caption` names every shape of `scene` once, each with its true size, colour
    and kind, and states only true relations, the way every generated caption does.

    Words are read lowercase with punctuation ignored. A noun phrase is "SIZE COLOUR KIND"
    (with the generator's synonyms); a relation phrase (longest match first) must stand
    between two noun phrases A ... r ... B and hold as ``scene.relation(A, B) == r``.
    Other words are free ("a", "there is", "on a dark background"), except words that
    claim something (`_CLAIM_WORDS`) outside a complete phrase: "a red ball" or "an orange
    box" are wrong, as is a relation with no shape on one side.
    """
    items, stray = _parse_caption(caption)
    if stray:
        return False
    index = {shape.color: k for k, shape in enumerate(scene.shapes)}  # colours are unique per scene
    named = [item for item in items if isinstance(item, _NounPhrase)]
    if sorted(phrase.color for phrase in named) != sorted(index):  # each shape once, nothing else
        return False
    for phrase in named:
        shape = scene.shapes[index[phrase.color]]
        if (phrase.size, phrase.kind) != (shape.size, shape.kind):
            return False
    return all(a is not None and b is not None and _holds(scene, index, a, rel, b) for a, rel, b in _stated(items))


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

    `predictions` maps image ids to one caption each; `scenes` (e.g. `shapes_val_scenes`)
    must hold every predicted id and may hold more, so a partial evaluation can be scored.
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
    judged = [held for image_id, caption in predictions.items() for held in relation_judgements(caption, scenes[image_id])]
    accuracy = {"relation_accuracy": sum(judged) / len(judged)} if judged else {}
    return {"correctness": correct / len(predictions), **accuracy, "relations_stated": float(len(judged))}


def caption_correctness(predictions: Mapping[int, str], scenes: Mapping[int, ShapeScene]) -> float:
    """The share (0..1) of predicted captions that `caption_is_correct` judges right (`caption_scores`)."""
    return caption_scores(predictions, scenes)["correctness"]


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


def drawn_rgb(color: str, rng: random.Random) -> tuple[int, int, int]:
    """The colour a shape named `color` is drawn in: the named one with a little jitter per channel."""
    jitter = (rng.randint(-_COLOR_JITTER, _COLOR_JITTER) for _ in range(3))
    return tuple(min(255, max(0, c + d)) for c, d in zip(COLORS[color], jitter))  # type: ignore[return-value]


def _box_gap(center: tuple[float, float], half: float, other: Shape) -> float:
    """Empty space between a square box and `other`'s box along the axis that separates them."""
    return max(abs(center[0] - other.center[0]), abs(center[1] - other.center[1])) - half - other.half


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
    plain: Mapping[int, tuple[str, ...]] = _PLAIN_TEMPLATES,
    relational: Mapping[int, tuple[str, ...]] = _RELATION_TEMPLATES,
) -> str:
    """One caption naming every shape, from a template for the scene's number of shapes; states
    `relation` (i, rel, j) when given: shape i goes to ``{0}``, j to ``{1}``, the phrase to ``{r}``."""
    shapes = list(scene.shapes)
    if relation is None:
        rng.shuffle(shapes)
        template, rel_words = rng.choice(plain[len(shapes)]), ""
    else:
        i, rel, j = relation
        shapes = [shapes[i], shapes[j]] + [s for k, s in enumerate(shapes) if k not in (i, j)]
        template, rel_words = rng.choice(relational[len(shapes)]), relation_phrase(rel, rng)
    return template.format(*(noun_phrase(s, rng) for s in shapes), r=rel_words)


class _NounPhrase(NamedTuple):
    """A caption's "big red ball", read back as (size, colour, kind) names of `Shape`."""

    size: str
    color: str
    kind: str


def _parse_caption(caption: str) -> tuple[list[_NounPhrase | str], bool]:
    """The noun phrases and relations ("left", ...) of `caption` in text order, and whether
    a claiming word stands outside a complete phrase."""
    words = _WORD.findall(caption.lower())
    items: list[_NounPhrase | str] = []
    stray = False
    i = 0
    while i < len(words):
        size, color, kind = (words[i:i + 3] + ["", "", ""])[:3]
        if size in _SIZE_OF and color in COLORS and kind in _KIND_OF:
            items.append(_NounPhrase(_SIZE_OF[size], color, _KIND_OF[kind]))
            i += 3
            continue
        length = next((n for n in _RELATION_LENGTHS if tuple(words[i:i + n]) in _RELATION_OF), 0)
        if length:
            items.append(_RELATION_OF[tuple(words[i:i + length])])
            i += length
        else:
            stray = stray or words[i] in _CLAIM_WORDS
            i += 1
    return items, stray


def _stated(items: list[_NounPhrase | str]) -> Iterator[tuple[_NounPhrase | None, str, _NounPhrase | None]]:
    """Each relation of a parsed caption as (A, r, B): the noun phrases before and after it,
    None where there is none ("left of a big red ball": left of what?)."""
    subject: _NounPhrase | None = None
    pending: list[str] = []  # relations since `subject`, waiting for the next phrase
    for item in items:
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


def _build(staging: Path, meta: dict[str, Any]) -> None:
    """Draw every image of both splits into `staging` and write their annotation files."""
    image_size = meta["image_size"]
    records: dict[str, list[CaptionRecord]] = {split: [] for split in _ID_BASES}
    for split, image_id, rng in drawn_images(staging, meta, "shapes scenes"):
        image, captions, _ = draw_scene(rng, image_size, meta["captions_per_image"])
        path = staging / split / f"{image_id:08d}.png"
        image.save(path, format="PNG", compress_level=1)
        records[split].append(CaptionRecord(image_id, path, tuple(captions)))
    for split, written in records.items():
        sizes = {record.image_id: (image_size, image_size) for record in written}
        info = {"description": f"mmtx shapes scenes, {split} split", "version": _FORMAT_VERSION}
        write_coco_captions(written, staging / f"captions_{split}.json", staging / split, sizes=sizes, info=info)
