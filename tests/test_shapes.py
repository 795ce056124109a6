"""Shapes scenes: deterministic drawing, captions grounded in the scene, and a safe, cached
generator whose files the COCO reader reads back."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmtx.data.captions import read_coco_captions
from mmtx.data.synthetic import shapes
from mmtx.data.synthetic.scenes import _RELATION_WORDS, _VAL_ID_BASE, COLORS, Shape
from mmtx.data.synthetic.scoring import caption_correctness, caption_is_correct
from mmtx.data.synthetic.shapes import (
    MAX_CAPTION_WORDS,
    Scene,
    draw_scene,
    generate_shapes,
    scenes_for,
    shapes_val_scenes,
)

SIZE_WORDS = {"small": "small", "little": "small", "tiny": "small", "large": "large", "big": "large"}
KIND_WORDS = {"circle": "circle", "ball": "circle", "square": "square", "box": "square", "triangle": "triangle"}
RELATION_WORDS = {
    "to the left of": "left",
    "on the left of": "left",
    "left of": "left",
    "to the right of": "right",
    "on the right of": "right",
    "right of": "right",
    "above": "above",
    "over": "above",
    "below": "below",
    "under": "below",
    "beneath": "below",
}
NOUN = rf"({'|'.join(SIZE_WORDS)}) ({'|'.join(COLORS)}) ({'|'.join(KIND_WORDS)})"
RELATION = "|".join(sorted(RELATION_WORDS, key=len, reverse=True))  # longest phrase first
STATED_RELATION = re.compile(rf"{NOUN} (?:is )?({RELATION}) a {NOUN}")


def _scenes(count: int, image_size: int = 64, seed: int = 0) -> list[tuple[Image.Image, list[str], Scene]]:
    rng = random.Random(seed)
    return [draw_scene(rng, image_size) for _ in range(count)]


def test_same_seed_same_scene_other_seed_other_scene() -> None:
    image_a, captions_a, scene_a = draw_scene(random.Random(7), 64)
    image_b, captions_b, scene_b = draw_scene(random.Random(7), 64)
    assert image_a.tobytes() == image_b.tobytes() and captions_a == captions_b and scene_a == scene_b
    image_c, captions_c, _ = draw_scene(random.Random(8), 64)
    assert image_c.tobytes() != image_a.tobytes() and captions_c != captions_a
    assert image_a.size == (64, 64) and image_a.mode == "RGB"


def test_scene_geometry_and_pixels_match_the_description() -> None:
    for image, _, scene in _scenes(150):
        assert 1 <= len(scene.shapes) <= 3
        assert len({s.color for s in scene.shapes}) == len(scene.shapes)  # colours identify shapes
        pixels = np.asarray(image).astype(int)
        for k, shape in enumerate(scene.shapes):
            x0, y0, x1, y1 = shape.box
            assert 0 <= x0 and 0 <= y0 and x1 <= 64 and y1 <= 64
            small, large = shape.half < 0.1 * 64, shape.half > 0.14 * 64
            assert (shape.size == "small" and small) or (shape.size == "large" and large)
            centre = pixels[int(shape.center[1]), int(shape.center[0])]
            assert np.abs(centre - shape.rgb).max() <= 2  # the shape is drawn where and how the scene says
            assert np.abs(np.array(shape.rgb) - COLORS[shape.color]).max() <= 12
            for other in scene.shapes[k + 1 :]:
                ox0, oy0, ox1, oy1 = other.box
                assert x1 < ox0 or ox1 < x0 or y1 < oy0 or oy1 < y0  # no overlap


def test_captions_are_grounded_in_the_scene() -> None:
    relations_stated = 0
    for _, captions, scene in _scenes(300):
        assert len(captions) == 5 and len(set(captions)) == 5
        by_color = {s.color: s for s in scene.shapes}
        for caption in captions:
            assert caption == caption.lower().strip() and len(caption.split()) <= MAX_CAPTION_WORDS
            mentioned = re.findall(NOUN, caption)
            # every drawn shape, and nothing else, with its true size and kind
            assert sorted(color for _, color, _ in mentioned) == sorted(by_color)
            for size, color, kind in mentioned:
                assert SIZE_WORDS[size] == by_color[color].size and KIND_WORDS[kind] == by_color[color].kind
            for stated in STATED_RELATION.finditer(caption):
                a, b = by_color[stated.group(2)], by_color[stated.group(6)]
                relation = RELATION_WORDS[stated.group(4)]
                (ax, ay), (bx, by) = a.center, b.center
                dx, dy = bx - ax, by - ay  # from a to b, image y pointing down
                expected = {
                    "left": dx > 2 * abs(dy),
                    "right": -dx > 2 * abs(dy),
                    "above": dy > 2 * abs(dx),
                    "below": -dy > 2 * abs(dx),
                }
                assert expected[relation], (caption, a.center, b.center)
                relations_stated += 1
        if scene.relations():
            assert any(STATED_RELATION.search(c) for c in captions)  # a clear relation gets said
    assert relations_stated > 300


def test_ambiguous_diagonal_has_no_relation() -> None:
    shape = Shape("circle", "red", "small", (10.0, 10.0), 4.0, (220, 40, 40))
    diagonal = Scene(64, (shape, Shape("square", "blue", "small", (40.0, 35.0), 4.0, (50, 90, 235))))
    assert diagonal.relation(0, 1) is None and diagonal.relations() == []
    rng = random.Random(0)
    assert not any(STATED_RELATION.search(c) for c in shapes.describe_scene(diagonal, rng, 5))

    beside = Scene(64, (shape, Shape("square", "blue", "small", (40.0, 14.0), 4.0, (50, 90, 235))))
    assert beside.relations() == [(0, "left", 1), (1, "right", 0)]


def test_vocabulary_is_small() -> None:
    captions = [caption for _, captions, _ in _scenes(400, seed=1) for caption in captions]
    words = {word for caption in captions for word in caption.split()}
    assert 25 <= len(words) < 60, sorted(words)


def test_generate_writes_coco_files_and_reuses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "shapes"
    files = generate_shapes(root, num_train=6, num_val=3, image_size=32, seed=3)
    assert files == {
        "train": (root / "captions_train.json", root / "train"),
        "val": (root / "captions_val.json", root / "val"),
    }
    train, val = (read_coco_captions(*files[split]) for split in ("train", "val"))
    assert len(train) == 6 and len(val) == 3
    assert not {r.image_id for r in train} & {r.image_id for r in val}  # ids unique across splits
    for record in train + val:
        assert len(record.captions) == 5
        with Image.open(record.path) as img:
            assert img.size == (32, 32) and img.mode == "RGB"
    with Image.open(train[0].path) as a, Image.open(val[0].path) as b:
        assert a.tobytes() != b.tobytes()  # train and val draw from different streams
    meta = json.loads((root / "meta.json").read_text())
    assert (meta["num_train"], meta["num_val"], meta["image_size"], meta["seed"]) == (6, 3, 32, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"]  # no staging directory left

    drawn = []
    monkeypatch.setattr(shapes, "draw_scene", lambda *a: drawn.append(a) or draw_scene(*a))
    stamp = train[0].path.stat().st_mtime_ns
    assert generate_shapes(root, num_train=6, num_val=3, image_size=32, seed=3) == files
    assert drawn == [] and train[0].path.stat().st_mtime_ns == stamp  # reused, not rewritten

    generate_shapes(root, num_train=6, num_val=2, image_size=32, seed=3)  # other parameters: rebuilt
    assert len(drawn) == 8 and len(read_coco_captions(*files["val"])) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"]


def test_generate_is_deterministic(tmp_path: Path) -> None:
    first = generate_shapes(tmp_path / "a", num_train=3, num_val=1, image_size=32, seed=5)
    second = generate_shapes(tmp_path / "b", num_train=3, num_val=1, image_size=32, seed=5)
    for split in ("train", "val"):
        records_a, records_b = read_coco_captions(*first[split]), read_coco_captions(*second[split])
        assert [r.captions for r in records_a] == [r.captions for r in records_b]
        assert all(a.path.read_bytes() == b.path.read_bytes() for a, b in zip(records_a, records_b))


def test_generate_refuses_foreign_directories_and_bad_arguments(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="mine"):
        generate_shapes(foreign, num_train=1, num_val=1, image_size=32)
    assert (foreign / "thesis.tex").read_text() == "precious"

    empty = tmp_path / "empty"
    empty.mkdir()
    generate_shapes(empty, num_train=1, num_val=0, image_size=32)  # an empty directory is fine
    assert len(read_coco_captions(empty / "captions_train.json", empty / "train")) == 1

    for bad in (dict(num_train=-1), dict(image_size=16), dict(captions_per_image=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            generate_shapes(tmp_path / "x", **{"num_train": 1, "num_val": 1, **bad})


# ---------------------------------------------------------------- caption correctness

OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}
OTHER_SIZE_WORD = {"small": "big", "large": "tiny"}
OTHER_KIND_WORD = {"circle": "box", "square": "triangle", "triangle": "ball"}


def _described(seeds: range, image_size: int = 64) -> list[tuple[Scene, list[str]]]:
    """Scenes with their generated captions, without rendering pixels."""
    described = []
    for seed in seeds:
        rng = random.Random(seed)
        scene = shapes._sample_scene(rng, image_size)
        described.append((scene, shapes.describe_scene(scene, rng, 5)))
    return described


def _mutations(caption: str, scene: Scene) -> dict[str, str]:
    """Wrong versions of a correct caption, by kind of mistake (only those that apply)."""
    first = re.search(NOUN, caption)
    assert first is not None
    size, color, kind = first.groups()
    start, end = first.span()
    true_size, true_kind = SIZE_WORDS[size], KIND_WORDS[kind]
    absent = next(c for c in COLORS if c not in {s.color for s in scene.shapes})
    mutated = {
        "wrong colour": caption[:start] + f"{size} {absent} {kind}" + caption[end:],
        "wrong size": caption[:start] + f"{OTHER_SIZE_WORD[true_size]} {color} {kind}" + caption[end:],
        "wrong kind": caption[:start] + f"{size} {color} {OTHER_KIND_WORD[true_kind]}" + caption[end:],
        "missing shape": caption[:start] + caption[end:],
        "duplicated shape": f"{caption} and a {first.group(0)}",
        "extra shape": f"{caption} and a {size} {absent} {kind}",
        "colour without a phrase": caption[:start] + f"{color} {kind}" + caption[end:],
        "look-alike colour": caption[:start] + f"{size} orange {kind}" + caption[end:],
    }
    others = [s.color for s in scene.shapes if s.color != color]
    if others:
        mutated["another shape's colour"] = caption[:start] + f"{size} {others[0]} {kind}" + caption[end:]
    if stated := re.search(rf"\b({RELATION})\b", caption):
        swapped = _RELATION_WORDS[OPPOSITE[RELATION_WORDS[stated.group(1)]]][0]
        mutated["swapped relation"] = caption[: stated.start()] + swapped + caption[stated.end() :]
        mutated["dangling relation"] = caption[: stated.end()]
    return mutated


def _scene_of_three() -> Scene:
    """Red left of blue, green above blue, red and green on a diagonal (no relation)."""
    return Scene(64, (
        Shape("circle", "red", "large", (10.0, 30.0), 9.0, (220, 40, 40)),
        Shape("square", "blue", "small", (50.0, 30.0), 4.0, (50, 90, 235)),
        Shape("triangle", "green", "small", (50.0, 5.0), 4.0, (40, 175, 60)),
    ))  # fmt: skip


def test_generated_captions_are_judged_correct() -> None:
    described = _described(range(400))
    assert sum(bool(scene.relations()) for scene, _ in described) > 150  # relations are well covered
    for scene, captions in described:
        for caption in captions:
            assert caption_is_correct(caption, scene), (caption, scene)
            assert caption_is_correct(caption.upper() + ".", scene)  # case and punctuation are ignored


def test_mutated_captions_are_judged_incorrect() -> None:
    tried: dict[str, int] = {}
    for scene, captions in _described(range(1000, 1150)):
        for caption in captions:
            for mistake, wrong in _mutations(caption, scene).items():
                assert not caption_is_correct(wrong, scene), (mistake, wrong, scene)
                tried[mistake] = tried.get(mistake, 0) + 1
    assert len(tried) == 11 and min(tried.values()) >= 100, tried


def test_caption_is_correct_reads_phrases_and_relations() -> None:
    scene = _scene_of_three()
    for right in (
        "A big red ball, to the left of a tiny blue box; and there is a small green triangle.",
        "a little green triangle above a small blue square and a large red circle",
        "a large red circle with a small blue box and a small green triangle",
        "a small green triangle and a big red ball left of a small blue square",
    ):
        assert caption_is_correct(right, scene), right
    for wrong in (
        "",
        "a big red ball left of a small blue box",  # the green triangle is missing
        "a big red ball left of a small blue box left of a small green triangle",  # blue is below green
        "a big red ball above a small green triangle and a small blue box",  # diagonal: no relation
        "a big red ball and a small blue box and a small green triangle on the left",  # "left" of nothing
        "above a big red ball and a small blue box and a small green triangle",
        "a big red ball and a small blue box and a small green triangle and a big red ball",
        "a big red ball and two small blue boxes and a small green triangle",
        "a big red ball and a small blue box and a small green triangle on a pink background",
    ):
        assert not caption_is_correct(wrong, scene), wrong


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            sorted(
                {
                    *SIZE_WORDS,
                    *COLORS,
                    *KIND_WORDS,
                    "left",
                    "of",
                    "to",
                    "the",
                    "above",
                    "a",
                    "and",
                    "is",
                    "orange",
                    ",",
                    "<unk>",
                }
            )
        ),
        max_size=16,
    )
)
def test_caption_is_correct_agrees_with_the_phrase_regex(words: list[str]) -> None:
    """On any word salad, a caption judged correct names exactly the scene's shapes truly."""
    scene = _scene_of_three()
    caption = " ".join(words)
    if caption_is_correct(caption, scene):
        mentioned = re.findall(NOUN, caption)
        assert sorted(color for _, color, _ in mentioned) == ["blue", "green", "red"]
        by_color = {s.color: s for s in scene.shapes}
        assert all(
            SIZE_WORDS[size] == by_color[color].size and KIND_WORDS[kind] == by_color[color].kind
            for size, color, kind in mentioned
        )


def test_scenes_for_recomputes_the_drawn_scenes() -> None:
    for split, base in (("train", 0), ("val", _VAL_ID_BASE)):
        recomputed = scenes_for(split, 20, 48, seed=4)
        assert list(recomputed) == [base + index + 1 for index in range(20)]
        for index in range(20):
            _, _, drawn = draw_scene(random.Random(f"mmtx-shapes/4/{split}/{index}"), 48)
            assert recomputed[base + index + 1] == drawn
    assert scenes_for("val", 3, 48, seed=5) != scenes_for("val", 3, 48, seed=4)
    assert scenes_for("val", 0, 48, seed=4) == {}
    for bad in (dict(split="test"), dict(count=-1), dict(image_size=16)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            scenes_for(**{"split": "val", "count": 1, "image_size": 48, "seed": 0, **bad})


def test_written_references_are_correct_for_their_recomputed_scenes(tmp_path: Path) -> None:
    root = tmp_path / "shapes"
    files = generate_shapes(root, num_train=4, num_val=3, image_size=32, seed=3)
    meta = json.loads((root / "meta.json").read_text())
    for split in ("train", "val"):
        records = read_coco_captions(*files[split])
        scenes = shapes_val_scenes(root, split)
        assert shapes_val_scenes(meta, split) == scenes
        assert sorted(scenes) == sorted(r.image_id for r in records)
        assert all(caption_is_correct(c, scenes[r.image_id]) for r in records for c in r.captions)
    assert sorted(shapes_val_scenes(root)) == [_VAL_ID_BASE + i for i in (1, 2, 3)]  # val by default
    with pytest.raises(ValueError, match="version"):
        shapes_val_scenes({**meta, "version": meta["version"] + 1})
    with pytest.raises(ValueError, match="split"):
        shapes_val_scenes(root, "test")


def test_caption_correctness_is_the_share_of_correct_predictions() -> None:
    scenes = scenes_for("val", 4, 64, seed=0)
    ids = list(scenes)
    references = {image_id: shapes.describe_scene(scene, random.Random(0), 1)[0] for image_id, scene in scenes.items()}
    assert caption_correctness(references, scenes) == 1.0
    half = {**references, ids[0]: "a big orange ball", ids[1]: references[ids[1]] + " and a tiny red box"}
    assert caption_correctness(half, scenes) == 0.5
    assert caption_correctness({ids[3]: references[ids[3]]}, scenes) == 1.0  # a subset of the scenes is fine
    with pytest.raises(ValueError, match="empty"):
        caption_correctness({}, scenes)
    with pytest.raises(ValueError, match="without scenes"):
        caption_correctness({123: "a big red ball"}, scenes)
    with pytest.raises(ValueError, match="str"):
        caption_correctness({ids[0]: None}, scenes)  # type: ignore[dict-item]
