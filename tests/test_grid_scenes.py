"""Grid scenes: a second drawn caption data set (sizes, aspect ratios, relations by grid cell),
deterministic files, captions the shared scorer judges true, relation accuracy that counts a
swapped side as wrong, and ``mmtx-train data=grid`` logging both scores."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import re
from pathlib import Path

import lightning as L
import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from PIL import Image

from mmtx.checkpoint import read_checkpoint
from mmtx.config_check import check_train_config
from mmtx.data.captions import read_coco_captions
from mmtx.data.synthetic import GridCaptions, ShapesCaptions, grid, shapes
from mmtx.data.synthetic.grid import (
    ASPECTS,
    JITTER,
    LONG_SIDES,
    MAX_CAPTION_WORDS,
    GridScene,
    describe_grid_scene,
    draw_grid_scene,
    generate_grid,
    grid_scenes,
    image_dims,
    scenes_for,
)
from mmtx.data.synthetic.scenes import _RELATION_WORDS, COLORS, Shape
from mmtx.data.synthetic.scoring import (
    _CLAIM_WORDS,
    caption_error,
    caption_is_correct,
    caption_scores,
    relation_judgements,
)
from mmtx.data.tokenizer import Tokenizer
from tests.helpers import compose_train

RELATION_WORDS = {phrase: rel for rel, phrases in _RELATION_WORDS.items() for phrase in phrases}
RELATION = re.compile(rf"\b({'|'.join(sorted(RELATION_WORDS, key=len, reverse=True))})\b")  # longest first
OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}


def _swapped(caption: str) -> str:
    """`caption` with its (first) relation turned around: "left of" -> "to the right of"."""
    stated = RELATION.search(caption)
    assert stated is not None, caption
    opposite = _RELATION_WORDS[OPPOSITE[RELATION_WORDS[stated.group(1)]]][0]
    return caption[: stated.start()] + opposite + caption[stated.end() :]


def _described(count: int, seed: int = 0) -> list[tuple[GridScene, list[str]]]:
    """Scenes with their captions, without rendering pixels."""
    rng = random.Random(seed)
    described = []
    for _ in range(count):
        scene = grid._sample_scene(rng)
        described.append((scene, describe_grid_scene(scene, rng, 5)))
    return described


def _scene_of_three() -> GridScene:
    """Red left of blue (middle row), green above blue (right column), red and green diagonal."""
    return GridScene(96, 96, (
        Shape("circle", "red", "small", (16.0, 48.0), 4.0, COLORS["red"]),
        Shape("square", "blue", "large", (80.0, 48.0), 9.0, COLORS["blue"]),
        Shape("triangle", "green", "small", (80.0, 16.0), 4.0, COLORS["green"]),
    ), ((1, 0), (1, 2), (0, 2)))  # fmt: skip


# ------------------------------------------------------------------------------------ drawing


def test_same_seed_same_scene_other_seed_other_scene() -> None:
    image_a, captions_a, scene_a = draw_grid_scene(random.Random(7))
    image_b, captions_b, scene_b = draw_grid_scene(random.Random(7))
    assert image_a.tobytes() == image_b.tobytes() and captions_a == captions_b and scene_a == scene_b
    image_c, captions_c, _ = draw_grid_scene(random.Random(8))
    assert image_c.tobytes() != image_a.tobytes() and captions_c != captions_a
    assert image_a.size == (scene_a.width, scene_a.height) and image_a.mode == "RGB"


def test_images_come_in_every_size_and_aspect_ratio() -> None:
    scenes = [scene for scene, _ in _described(400)]
    drawn = {(s.width, s.height) for s in scenes}
    assert drawn == {image_dims(side, aspect) for side in LONG_SIDES for aspect in ASPECTS}
    assert {(96, 96), (128, 96), (96, 128), (160, 90), (128, 72)} <= drawn  # 1:1, 4:3, 3:4, 16:9
    for aspect in ASPECTS:
        share = sum(abs(s.width / s.height - aspect[0] / aspect[1]) < 0.02 for s in scenes) / len(scenes)
        assert 0.15 < share < 0.35, (aspect, share)
    for index in range(12):  # the pixels come at the scene's own size
        image, _, scene = draw_grid_scene(random.Random(index))
        assert image.size == (scene.width, scene.height)


def test_shapes_sit_in_their_cells_and_relations_are_clear() -> None:
    related = diagonal = 0
    for scene, _ in _described(400, seed=1):
        assert 1 <= len(scene.shapes) <= 3 and len(scene.cells) == len(scene.shapes)
        assert len({s.color for s in scene.shapes}) == len(scene.shapes)  # colours identify shapes
        assert len(set(scene.cells)) == len(scene.cells)
        cell_w, cell_h = scene.width / 3, scene.height / 3
        for shape, (row, col) in zip(scene.shapes, scene.cells):
            x0, y0, x1, y1 = shape.box
            assert col * cell_w < x0 and x1 < (col + 1) * cell_w and row * cell_h < y0 and y1 < (row + 1) * cell_h
            small = shape.half <= 0.17 * min(cell_w, cell_h) + 1e-9
            assert (shape.size == "small") == small and shape.half >= 0.13 * min(cell_w, cell_h) - 1e-9
        # in the squashed image, the shapes scenes' own rule (RELATION_RATIO) agrees with the grid
        square = shapes.Scene(1, tuple(
            dataclasses.replace(s, center=(s.center[0] / scene.width, s.center[1] / scene.height)) for s in scene.shapes
        ))  # fmt: skip
        for i in range(len(scene.shapes)):
            for j in range(len(scene.shapes)):
                if i == j:
                    continue
                if (rel := scene.relation(i, j)) is not None:
                    related += 1
                    assert square.relation(i, j) == rel, (scene, i, j)
                else:  # apart in both directions by most of a cell
                    diagonal += 1
                    (ax, ay), (bx, by) = square.shapes[i].center, square.shapes[j].center
                    assert min(abs(ax - bx), abs(ay - by)) >= (1 - 2 * JITTER) / 3 - 1e-9
    assert related > 300 and diagonal > 100


def test_the_pixels_match_the_scene() -> None:
    for index in range(30):
        image, _, scene = draw_grid_scene(random.Random(index))
        pixels = image.load()
        for shape in (s for s in scene.shapes if s.half >= 4):  # a pixel wholly inside the shape
            drawn = pixels[int(shape.center[0]), int(shape.center[1])]
            assert max(abs(a - b) for a, b in zip(drawn, shape.rgb)) <= 2
        corner = pixels[0, 0]  # the background is dark
        assert max(corner) <= 70


# ------------------------------------------------------------------------------------ captions


def test_captions_relate_a_pair_in_either_order_and_are_judged_correct() -> None:
    both_orders = []
    for scene, captions in _described(400, seed=2):
        assert len(captions) == 5 and len(set(captions)) == 5
        relations = scene.relations()
        for caption in captions:
            assert caption == caption.lower().strip() and len(caption.split()) <= MAX_CAPTION_WORDS
            assert caption_is_correct(caption, scene), (caption, scene)
            judged = relation_judgements(caption, scene)
            assert judged == ([True] if relations else []), (caption, scene)  # one relation when there is one
        if len(relations) == 2:  # one related pair: both of its shapes get to be the subject
            before = [caption[: RELATION.search(caption).start()].split() for caption in captions]
            subjects = {next(word for word in reversed(words) if word in COLORS) for words in before}
            both_orders.append(len(subjects) == 2)
    assert len(both_orders) > 50 and sum(both_orders) / len(both_orders) > 0.8


@pytest.mark.parametrize(
    ("caption", "error"),
    [
        ("a small green triangle and a tiny red ball left of a big blue box", None),
        ("a small green triangle and a tiny red ball right of a big blue box", "relation"),
        ("a small green box and a tiny red ball right of a big blue box", "kind"),  # the kind is checked first
        ("a big green triangle and a tiny red ball left of a big blue box", "size"),
        ("a tiny red ball left of a big blue box", "shapes named"),  # the green one is missing
        ("a tiny red ball left of a big blue box and a small green triangle and a small red ball", "shapes named"),
        ("a small green triangle and a tiny red ball left of a big blue box on a purple background", "stray word"),
        ("a small green triangle at the top right and a tiny red ball at the top left and a big blue box "
         "at the middle right", "place"),  # the red ball stands in the middle row
    ],
)  # fmt: skip
def test_caption_error_names_the_first_check_a_caption_fails(caption: str, error: str | None) -> None:
    scene = _scene_of_three()
    assert caption_error(caption, scene) == error
    assert caption_is_correct(caption, scene) == (error is None)


def test_vocabulary_is_the_shapes_scenes_own_in_other_templates() -> None:
    words = {word for _, captions in _described(400, seed=3) for c in captions for word in c.split()}
    shapes_words = {word for _, captions, _ in (shapes.draw_scene(random.Random(k), 32) for k in range(200))
                    for c in captions for word in c.split()}  # fmt: skip
    claims = _CLAIM_WORDS
    assert words & claims == shapes_words & claims  # the same colours, sizes, kinds and relations
    assert words - shapes_words  # in templates the shapes scenes lack ("sits", "we see", ...)


def test_a_swapped_relation_is_wrong_and_counts_against_relation_accuracy() -> None:
    scene = _scene_of_three()
    right = "we see a small green triangle and a small red circle to the left of a large blue square"
    swapped = "we see a small green triangle and a small red circle to the right of a large blue square"
    diagonal = "the small red circle is below the small green triangle and a large blue square is elsewhere"
    chain = "a tiny red ball left of a big blue box below a little green triangle"
    absent = "a small red circle left of a small yellow square"
    plain = "a small red circle a large blue square and a small green triangle"
    assert caption_is_correct(right, scene) and relation_judgements(right, scene) == [True]
    assert not caption_is_correct(swapped, scene) and relation_judgements(swapped, scene) == [False]
    assert not caption_is_correct(diagonal, scene) and relation_judgements(diagonal, scene) == [False]
    assert caption_is_correct(chain, scene) and relation_judgements(chain, scene) == [True, True]
    assert relation_judgements(absent, scene) == []  # no yellow shape: not a relation between two of its shapes
    scenes = {1: scene, 2: scene, 3: scene}
    assert caption_scores({1: right, 2: swapped, 3: plain}, scenes) == {
        "correctness": pytest.approx(2 / 3),
        "relation_accuracy": 0.5,
        "relations_stated": 2.0,
    }
    assert caption_scores({1: plain}, scenes) == {"correctness": 1.0, "relations_stated": 0.0}

    # every generated relation turned around: wrong, and relation accuracy 0
    related = [(scene, c) for scene, captions in _described(200, seed=4) for c in captions if scene.relations()]
    turned = {k: _swapped(c) for k, (_, c) in enumerate(related)}
    truth = {k: scene for k, (scene, _) in enumerate(related)}
    assert not any(caption_is_correct(c, truth[k]) for k, c in turned.items())
    assert caption_scores(turned, truth) == {
        "correctness": 0.0,
        "relation_accuracy": 0.0,
        "relations_stated": float(len(related)),
    }
    # sides picked by chance: relation accuracy at about one half, whatever the nouns
    coin = random.Random(0)
    chance = {k: _swapped(c) if coin.random() < 0.5 else c for k, (_, c) in enumerate(related)}
    assert 0.4 < caption_scores(chance, truth)["relation_accuracy"] < 0.6


# ------------------------------------------------------------------------------------ files


def test_generate_is_deterministic_and_keeps_each_image_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = generate_grid(tmp_path / "a", num_train=12, num_val=6, seed=5)
    generate_grid(tmp_path / "b", num_train=12, num_val=6, seed=5)
    generate_grid(tmp_path / "c", num_train=12, num_val=6, seed=6)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 12 + 6 + 3  # the images, two annotation files and meta.json
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert (tmp_path / "a" / "captions_val.json").read_bytes() != (tmp_path / "c" / "captions_val.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no staging folder left

    sizes = set()
    for split in ("train", "val"):
        records = read_coco_captions(*first[split])
        entries = {e["id"]: e for e in json.loads(first[split][0].read_text())["images"]}
        assert len(records) == (12 if split == "train" else 6)
        for record in records:
            with Image.open(record.path) as img:
                assert img.size == (entries[record.image_id]["width"], entries[record.image_id]["height"])
                sizes.add(img.size)
    assert len(sizes) > 3  # several sizes and aspect ratios on disk

    drawn = []
    monkeypatch.setattr(grid, "draw_grid_scene", lambda *a: drawn.append(a) or draw_grid_scene(*a))
    assert generate_grid(tmp_path / "a", num_train=12, num_val=6, seed=5) == first and drawn == []  # reused
    for bad in (dict(num_train=-1), dict(num_val=10**8), dict(captions_per_image=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            generate_grid(tmp_path / "x", **{"num_train": 1, "num_val": 1, **bad})
    assert not (tmp_path / "x").exists()


def test_every_written_caption_is_correct_for_its_recomputed_scene(tmp_path: Path) -> None:
    root = tmp_path / "grid"
    files = generate_grid(root, num_train=40, num_val=20, seed=3)
    meta = json.loads((root / "meta.json").read_text())
    for split in ("train", "val"):
        records = read_coco_captions(*files[split])
        scenes = grid_scenes(root, split)
        assert grid_scenes(meta, split) == scenes == scenes_for(split, len(records), seed=3)
        assert sorted(scenes) == sorted(r.image_id for r in records)
        for record in records:
            scene = scenes[record.image_id]
            with Image.open(record.path) as img:
                assert img.size == (scene.width, scene.height)
            assert all(caption_is_correct(c, scene) for c in record.captions), (record, scene)
            assert all(all(relation_judgements(c, scene)) for c in record.captions)
    with pytest.raises(ValueError, match="version"):
        grid_scenes({**meta, "version": meta["version"] + 1})
    with pytest.raises(ValueError, match="split"):
        grid_scenes(root, "test")


def test_place_captions_say_where_every_shape_stands() -> None:
    rows, columns = ("top", "middle", "bottom"), ("left", "centre", "right")
    rng = random.Random(4)
    for _ in range(200):
        scene = grid._sample_scene(rng)
        caption = grid.place_caption(scene, rng)
        places = re.findall(r"a (\w+) (\w+) (\w+) at the (\w+) (\w+)", caption)
        assert len(places) == len(scene.shapes), caption
        for _, color, _, row, column in places:
            k = next(i for i, s in enumerate(scene.shapes) if s.color == color)
            assert (rows.index(row), columns.index(column)) == scene.cells[k], (caption, scene)
        assert caption_is_correct(caption, scene) and relation_judgements(caption, scene) == []
        row = rows[scene.cells[0][0]]
        moved = caption.replace(f"at the {row} ", f"at the {rows[(rows.index(row) + 1) % 3]} ")
        assert not caption_is_correct(moved, scene), moved  # a wrong place is wrong


def test_grid_data_writes_place_captions_and_refuses_other_kinds(tmp_path: Path) -> None:
    data = GridCaptions(str(tmp_path / "places"), num_train=2, num_val=10, seed=1, image_size=32, captions="places")
    records = read_coco_captions(*data.files()["val"])
    assert all(" at the " in c and not RELATION.search(c) for r in records for c in r.captions)
    assert json.loads((tmp_path / "places" / "meta.json").read_text())["captions"] == "places"
    assert data.score_captions("val", {r.image_id: r.captions[0] for r in records})["correctness"] == 1.0
    with pytest.raises(ValueError, match=r"data.captions='where' must be one of relations, places"):
        GridCaptions(str(tmp_path / "bad"), num_train=2, num_val=2, image_size=32, captions="where")


@pytest.mark.parametrize("module", [GridCaptions, ShapesCaptions])
def test_data_modules_score_correctness_and_relation_accuracy(module, tmp_path: Path) -> None:
    """Both generators' data modules report the two scores (and the count) through score_captions."""
    data = module(str(tmp_path / "data"), num_train=2, num_val=30, seed=1, image_size=32)
    records = read_coco_captions(*data.files()["val"])
    references = {r.image_id: r.captions[0] for r in records}
    scores = data.score_captions("val", references)
    assert set(scores) == {"correctness", "relation_accuracy", "relations_stated"}
    assert scores["correctness"] == scores["relation_accuracy"] == 1.0 and scores["relations_stated"] >= 5
    turned = {i: _swapped(c) if RELATION.search(c) else c for i, c in references.items()}
    assert data.score_captions("val", turned)["relation_accuracy"] == 0.0


# ------------------------------------------------------------------------------------ mmtx-train


def test_grid_composes_alone_and_with_the_shapes_preset() -> None:
    for given in (["data=grid"], ["experiment=caption_shapes", "data=grid"]):
        cfg = compose_train([*given, "paths.output_dir=/unused", "paths.data_dir=/unused"])
        assert cfg.data._target_ == "mmtx.data.synthetic.GridCaptions" and cfg.data.image_size == 64
        assert cfg.data.root == "/unused/grid-relations-8000-500-seed0"
        HydraConfig.instance().set_config(cfg)
        try:
            check_train_config(cfg)  # builds the data module and the task without drawing
        finally:
            HydraConfig.instance().cfg = None  # type: ignore[assignment]


def test_the_place_warm_up_trains_the_relations_captioner_on_place_captions() -> None:
    """experiment=caption_places is experiment=caption_shapes's task on place captions of other grid
    scenes, for two minutes at batch 64, with the model of the relations preset: its checkpoint is
    what that preset's init_from= expects."""
    unused = ["paths.output_dir=/unused", "paths.data_dir=/unused"]
    warm, second, shapes = (
        compose_train([*preset, *unused])
        for preset in (
            ["experiment=caption_places"],
            ["experiment=caption_relations", "data=grid"],
            ["experiment=caption_shapes"],
        )
    )  # the second stage on grid scenes: the same caption length, so the same decoder positions
    assert OmegaConf.to_container(warm.model, resolve=True) == OmegaConf.to_container(second.model, resolve=True)
    assert warm.task == shapes.task
    assert warm.data._target_ == "mmtx.data.synthetic.GridCaptions" and warm.data.image_size == 64
    assert warm.data.batch_size == 64 and shapes.data.batch_size == 128
    assert warm.data.root == "/unused/grid-places-3000-300-seed7"
    assert warm.trainer.max_time == "00:00:02:00"
    steps = compose_train(["experiment=caption_places", "trainer.max_steps=5", "paths.output_dir=/unused"])
    assert steps.trainer.max_time is None  # a step budget turns the deadline off, as in every preset


def test_the_tiny_captioner_is_the_small_one_with_a_one_block_encoder_and_a_narrower_mlp() -> None:
    """``model=caption_tiny`` (the relations presets' model) differs from ``model=caption_small``
    in the encoder's depth and MLP width alone, so a change to the small captioner reaches it."""
    tiny, small = (
        OmegaConf.to_container(compose_train([f"model={name}"]).model, resolve=True)
        for name in ("caption_tiny", "caption_small")
    )
    assert (tiny["encoder"].pop("depth"), small["encoder"].pop("depth")) == (1, 2)
    assert (tiny["encoder"].pop("mlp_ratio"), small["encoder"].pop("mlp_ratio")) == (2.0, 4.0)
    assert tiny == small


def test_the_relations_preset_is_the_captioner_preset_with_the_second_stages_settings() -> None:
    """experiment=caption_relations is experiment=caption_shapes on the COCO files, started from the
    place warm-up where the presets' first command writes it, for 6 minutes at batch 64 validated every 1000 steps:
    its vocabulary grown by the captions' words, its images mirrored and shifted, its captions
    decoded by beam search, its model the tiny captioner; the rest of the task and of the data are
    the captioner preset's."""
    unused = ["paths.output_dir=/unused", "paths.data_dir=/unused"]
    second = compose_train(["experiment=caption_relations", *unused])
    shapes = compose_train(["experiment=caption_shapes", "data=coco", "model=caption_tiny", *unused])
    assert second.init_from == "runs/places/checkpoints/last.ckpt" and second.tokenizer.add_words is True
    assert second.trainer.max_time == "00:00:06:00"
    assert second.trainer.val_check_interval == 1000 and second.trainer.check_val_every_n_epoch is None
    assert shapes.trainer.check_val_every_n_epoch == 1  # the shapes preset validates after every epoch
    assert second.data.mirror_words == [["left", "right"]] and second.data.shift_px == 4
    assert second.data.batch_size == 64 and shapes.data.batch_size == 128
    assert second.task.generation.num_beams == 5
    assert OmegaConf.to_container(second.model, resolve=True) == OmegaConf.to_container(shapes.model, resolve=True)
    mine, preset = ({key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("task", "data")}
                    for cfg in (second, shapes))  # fmt: skip
    for cfg in (mine, preset):
        del cfg["task"]["generation"]["num_beams"], cfg["data"]["mirror_words"], cfg["data"]["shift_px"]
        del cfg["data"]["batch_size"]
    assert mine == preset


@pytest.mark.slow
def test_place_captions_first_then_relations_as_the_presets_say(cli, tiny: list[str], tmp_path: Path) -> None:
    """The presets' two commands: a captioner trained on place captions starts one on relation
    captions, found where the first wrote it, whose vocabulary keeps the first run's words (same
    ids) and adds its own."""
    common = [*tiny, "trainer.max_epochs=null", "trainer.max_steps=2", "logger=none", "trainer.limit_val_batches=0"]
    cli.run("mmtx-train", "experiment=caption_places", *common, "hydra.run.dir=runs/places", cwd=tmp_path)
    warm = tmp_path / "runs" / "places" / "checkpoints" / "last.ckpt"  # where the relations preset looks
    cli.run(
        "mmtx-train", "experiment=caption_relations", "data=grid", *common, "seed=1",
        "task.word_weights={left:3,right:3}", "hydra.run.dir=runs/relations", cwd=tmp_path,
    )  # fmt: skip
    before, after = (
        Tokenizer.from_file(tmp_path / "runs" / run / "tokenizer.json").backend.get_vocab()
        for run in ("places", "relations")
    )
    assert "top" in before and "above" not in before  # place words only
    assert {w: after[w] for w in before} == before and "above" in after
    started, trained = (
        read_checkpoint(path)["state_dict"] for path in (warm, tmp_path / "runs/relations/checkpoints/last.ckpt")
    )
    encoder = [k for k in started if k.startswith("model.encoder.")]
    # two small steps from the warm-up's weights, not a new draw of seed 1's (about 0.02 apart)
    assert encoder and max((started[k].float() - trained[k].float()).abs().max().item() for k in encoder) < 0.01


class ReferenceCaptions(L.Callback):
    """Test-only: validation scores known captions in place of the model's, each val image's first
    reference with its relation turned around on odd image ids (`_known_caption`). Added to a run
    with ``+callbacks.known._target_=tests.test_grid_scenes.ReferenceCaptions``."""

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        for output in pl_module.val_outputs:
            output["caption"] = _known_caption(output["image_id"], output["references"][0])


def _known_caption(image_id: int, reference: str) -> str:
    return _swapped(reference) if image_id % 2 and RELATION.search(reference) else reference


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_mmtx_train_on_grid_logs_correctness_and_relation_accuracy(
    cli, tiny: list[str], data_dir: Path, tmp_path: Path
) -> None:
    """A few steps on 32-px grid scenes; the scores validation logs are those of the captions it
    scored, recomputed here from the written files, where only some stated relations hold."""
    run = tmp_path / "run"
    result = cli.run(
        "mmtx-train", *tiny, "data=grid", "logger=csv", "trainer.max_steps=3",
        "+callbacks.known._target_=tests.test_grid_scenes.ReferenceCaptions", f"hydra.run.dir={run}", cwd=tmp_path,
    )  # fmt: skip
    root = data_dir / "grid-relations-64-20-seed0"
    records = read_coco_captions(root / "captions_val.json", root / "val")
    expected = caption_scores(
        {r.image_id: _known_caption(r.image_id, r.captions[0]) for r in records}, grid_scenes(root)
    )
    assert 0.0 < expected["relation_accuracy"] < 1.0 and expected["correctness"] < 1.0  # the swaps tell

    with next(run.glob("csv/version_*/metrics.csv")).open() as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("val/correctness")]  # the final weights, at step 3
    logged = {key: float(row[f"val/{key}"]) for key in ("correctness", "relation_accuracy", "relations_stated")}
    assert logged == pytest.approx(expected)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 3 and {k: metrics["metrics"][k] for k in expected} == pytest.approx(expected)
    printed = [line.split() for line in result.stdout.splitlines() if line.startswith("relation_accuracy")]
    assert printed == [["relation_accuracy", f"{expected['relation_accuracy']:.4f}", "-"]]  # and in the table


def test_a_bad_grid_setting_is_refused_naming_the_key(cli, tiny: list[str], data_dir: Path, tmp_path: Path) -> None:
    result = cli.run(
        "mmtx-train",
        *tiny,
        "data=grid",
        "data.num_train=-1",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, cli.describe(result)
    assert "Traceback" not in result.stderr
    problems = [line.strip() for line in result.stderr.splitlines() if "num_train" in line]
    assert problems == ["data.num_train=-1 must be an integer in [0, 9999999]"], cli.describe(result)
    assert not (data_dir / "grid-relations--1-20-seed0").exists()  # refused before anything is drawn
