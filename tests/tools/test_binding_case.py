"""scripts/binding_case.py: its scenes hold one related pair, its captions and twins say what
they claim, the probe scores the truth against the twin, and a short run prints its figures."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmtx.data.synthetic.scoring import relation_judgements
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_scenes_hold_two_related_shapes_on_both_axes() -> None:
    case = load_script("binding_case")
    rng = random.Random(0)
    scenes = [case.two_shape_scene(rng) for _ in range(200)]
    assert all(len(s.shapes) == 2 and s.shapes[0].color != s.shapes[1].color for s in scenes)
    relations = {s.relation(0, 1) for s in scenes}
    assert relations == set(case.DIRECTIONS)  # every pair is related, on both axes
    for s in scenes:  # a shape's centre lies in its cell
        for shape, (row, col) in zip(s.shapes, s.cells):
            assert int(shape.center[0] * 3 // s.width) == col and int(shape.center[1] * 3 // s.height) == row


def test_outer_scenes_put_the_pair_side_by_side_in_the_outer_columns() -> None:
    case = load_script("binding_case")
    rng = random.Random(2)
    scenes = [case.two_shape_scene(rng, outer=True) for _ in range(100)]
    assert all({col for _, col in s.cells} == {0, 2} and s.cells[0][0] == s.cells[1][0] for s in scenes)
    assert {s.relation(0, 1) for s in scenes} == {"left", "right"}


def test_token_shift_is_causal_and_keeps_the_head_tied() -> None:
    case = load_script("binding_case")
    torch.manual_seed(0)
    model = case.build_captioner("sinusoidal", 1, 32, token_shift=2)
    assert model.decoder.lm_head.weight is model.decoder.body.token_embed.embed.weight
    embed = model.decoder.body.token_embed
    ids = torch.randint(3, len(case.VOCAB), (1, 10))
    changed = ids.clone()
    changed[0, 5] = 3 if ids[0, 5] != 3 else 4
    a, b = embed(ids), embed(changed)
    assert torch.equal(a[0, :5], b[0, :5])  # earlier tokens do not see a later one
    assert not torch.equal(a[0, 5:8], b[0, 5:8]) and torch.equal(a[0, 8:], b[0, 8:])  # it and the next two do


def test_captions_state_the_truth_and_twins_the_opposite() -> None:
    case = load_script("binding_case")
    rng = random.Random(1)
    for _ in range(100):
        scene, first = case.two_shape_scene(rng), rng.randrange(2)
        c = case.caption(scene, first, "relation")
        assert relation_judgements(c.text, scene) == [True]  # the package's scorer agrees
        assert relation_judgements(c.twin, scene) == [False]
        assert c.text.split()[case.DIRECTION_AT - 1] in case.DIRECTIONS
        column = case.caption(scene, first, "column")
        assert column.text.split()[case.DIRECTION_AT - 1] == f"column{scene.cells[first][1]}"
        assert column.twin != column.text and len(column.twin.split()) == len(column.text.split())
        axis = case.caption(scene, first, "axis")
        same_row = scene.cells[0][0] == scene.cells[1][0]
        assert axis.text.split()[case.DIRECTION_AT - 1] == ("row" if same_row else "column")
        assert axis.twin.split()[case.DIRECTION_AT - 1] == ("column" if same_row else "row")
        assert axis.text.replace(" row ", " column ") == axis.twin.replace(" row ", " column ")
        ids = case.encode([c.text, column.text, axis.text])
        assert ids.shape[0] == 3 and (ids[:, 0] == case.BOS).all() and (ids[:, -1] == case.EOS).all()


def test_a_mirrored_scene_is_described_by_the_mirrored_caption() -> None:
    """Mirroring the image left to right and swapping "left" and "right" keeps a caption true;
    above and below stay."""
    case = load_script("binding_case")
    rng = random.Random(2)
    for _ in range(60):
        scene = case.two_shape_scene(rng, third=True)
        shapes = tuple(dataclasses.replace(s, center=(scene.width - s.center[0], s.center[1])) for s in scene.shapes)
        cells = tuple((row, case.GRID - 1 - col) for row, col in scene.cells)
        mirrored = dataclasses.replace(scene, shapes=shapes, cells=cells)
        for c in [case.caption(scene, rng.randrange(2), "relation"), *case.phrased_captions(scene, rng)]:
            assert relation_judgements(case.MIRROR.words(c.text), mirrored) == [True]
            assert case.MIRROR.words(case.MIRROR.words(c.text)) == c.text
    assert case.MIRROR.words("a red box to the left of a ball above it") == "a red box to the right of a ball above it"


def test_captions_stating_a_relation_are_told_from_the_rest() -> None:
    """What --relations-first trains on first: every grid caption the relation probe can flip
    (`relation_probe.flipped`: it states one relation), and no other."""
    case = load_script("binding_case")
    _, pools = case.draw_grid(40, 3, 32)
    texts = [t for pool in pools for t in pool]
    assert any(case.states_relation(t) for t in texts) and not all(case.states_relation(t) for t in texts)
    assert all(case.states_relation(t) == (case.flipped(t) is not None) for t in texts)


def test_steps_toward_the_grid_keep_the_claims_true() -> None:
    """A third shape in its own cell, named first; the grid scenes' own phrasing and its flipped
    twins; captions with no relation: the package's scorer agrees with what each says."""
    case = load_script("binding_case")
    rng = random.Random(4)
    for _ in range(60):
        scene = case.two_shape_scene(rng, third=True)
        assert len(set(scene.cells)) == 3 and len({s.color for s in scene.shapes}) == 3
        c = case.caption(scene, rng.randrange(2), "relation")
        assert c.text.startswith(f"a {scene.shapes[2].size} {scene.shapes[2].color} {scene.shapes[2].kind} and ")
        assert c.text.split()[c.at - 1] in case.DIRECTIONS and c.at == case.DIRECTION_AT + case.THIRD_CLAUSE
        assert relation_judgements(c.text, scene) == [True] and relation_judgements(c.twin, scene) == [False]
        assert relation_judgements(case.plain_caption(scene), scene) == []
        phrased = case.phrased_captions(scene, rng)
        assert phrased and all(p.at is None and p.text != p.twin for p in phrased)
        for p in phrased:
            assert relation_judgements(p.text, scene) == [True] and relation_judgements(p.twin, scene) == [False]
    words = case.vocabulary(["we see a tiny red ball", "a big blue box"])
    assert list(words)[: len(case.VOCAB)] == list(case.VOCAB) and {"we", "see", "ball", "box"} <= set(words)
    shape = f"a {next(iter(case.SIZES))} {next(iter(case.COLORS))} {next(iter(case.KINDS))}"
    ids = case.encode([shape, f"{shape} left of {shape}"])
    assert ids.shape == (2, 12) and (ids[0, 6:] == case.PAD).all() and ids[0, 5] == case.EOS


def test_probe_prefers_what_the_model_finds_likelier() -> None:
    case = load_script("binding_case")
    images, scenes = case.draw(8, seed=0, image_size=32)
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.uint8
    captions = [case.caption(s, 0, "relation") for s in scenes]

    true_ids = case.encode([c.text for c in captions])
    keep = torch.ones(true_ids.shape[1], dtype=torch.bool)
    keep[case.DIRECTION_AT] = False

    class Oracle(torch.nn.Module):  # all probability on the true caption's next words, twin or not
        def forward(self, pixels, ids):
            truth = torch.stack([next(t for t in true_ids if t[:-1][keep[:-1]].equal(row[keep[:-1]])) for row in ids])
            return torch.zeros(*ids.shape, len(case.VOCAB)).scatter(-1, truth[:, 1:, None], 20.0)

    pixels = case.normalize_images(images)
    figures = case.evaluate(Oracle(), pixels, captions, lambda: torch.autocast("cpu", enabled=False))
    assert figures["relation_true_preferred"] == 1.0 and figures["p_direction_word"] > 0.99
    assert figures["p_column_word"] is None and figures["p_axis_word"] is None


def test_centre_token_holds_the_drawn_shape() -> None:
    case = load_script("binding_case")
    images, scenes = case.draw(40, seed=3, image_size=64)
    for image, scene in zip(images, scenes):
        for k, shape in enumerate(scene.shapes):
            # the pixels drawn in the shape's own colour, found in the squashed image
            close = (image.int() - torch.tensor(shape.rgb)[:, None, None]).abs().amax(0) <= 12
            ys, xs = close.nonzero(as_tuple=True)
            token = case.centre_token(scene, k, grid=8) - 1  # CLS first
            for line, pixels in ((token // 8, ys), (token % 8, xs)):
                middle = (pixels.min() + pixels.max()).item() / 2 + 0.5  # of its bounding box, in pixels
                assert 8 * line - 1.5 <= middle <= 8 * (line + 1) + 1.5  # in the token's patch, give or take an edge


def test_first_words_are_drawn_for_the_first_steps_only() -> None:
    case = load_script("binding_case")
    assert [case.words_at(step, 3, "column", "relation") for step in range(5)] == ["column"] * 3 + ["relation"] * 2
    rng = random.Random(0)
    mixed = [case.draw_claim(rng, "mixed") for _ in range(400)]
    assert 150 < mixed.count("relation") < 250 and mixed.count("relation") + mixed.count("column") == 400
    assert {case.draw_claim(rng, "axis") for _ in range(20)} == {"axis"}


def test_read_where_builds_the_decoders_option() -> None:
    from mmtx.nn import Attention, WhereCrossAttention

    case = load_script("binding_case")
    for read_where in (True, False):
        model = case.build_captioner("sinusoidal", 2, 32, read_where=read_where)
        kinds = {type(block.cross_attn) for block in model.decoder.body.blocks}
        assert kinds == ({WhereCrossAttention} if read_where else {Attention})


@pytest.mark.parametrize(
    ("options", "claim_word_placed"),
    [
        (["--third", "--plain-share", "0.5"], True),
        (["--third", "--phrased", "--plain-share", "0.5"], False),
        (["--grid-captions"], False),
        (["--grid-captions", "--relations-first", "1"], False),
    ],
    ids=["third", "phrased", "grid", "grid-relations-first"],
)
def test_runs_toward_the_grid_score_the_relations(options: list[str], claim_word_placed: bool) -> None:
    """Each run scores its relation captions; the claim word's own figures need it in one place."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "binding_case.py"), "--steps", "2", "--every", "2", "--images", "12",
         *options],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    last = json.loads(out.stdout.splitlines()[-1])
    assert last["final"] is True and 0.0 <= last["relation_true_preferred"] <= 1.0
    assert ("p_direction_word" in last) == ("attention_on_a" in last) == claim_word_placed


def test_batch_rate_weight_and_mirror_options_reach_the_run() -> None:
    script = [sys.executable, str(ROOT / "scripts" / "binding_case.py"), "--steps", "2", "--every", "2"]
    options = ["--images", "12", "--batch-size", "6", "--lr", "5e-4", "--claim-weight", "3", "--mirrored"]
    out = subprocess.run(
        [*script, *options, "--plain-share", "0.5", "--plain-from", "1"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    last = json.loads(out.stdout.splitlines()[-1])
    assert (last["batch_size"], last["lr"], last["claim_weight"], last["mirrored"]) == (6, 5e-4, 3.0, True)
    assert (last["plain_share"], last["plain_from"]) == (0.5, 1)
    for bad, message in (
        (["--mirrored", "--batch-size", "5"], "--mirrored swaps the relation words of an even batch"),
        (["--plain-from", "3"], "--plain-from must be at least 0, and needs --plain-share"),
        (["--relations-first", "3"], "--relations-first must be at least 0, and needs --grid-captions"),
    ):
        refused = subprocess.run([*script, *bad], capture_output=True, text=True, cwd=ROOT)
        assert refused.returncode == 2 and message in refused.stderr


@pytest.mark.parametrize("where", [[], ["--read-where"]])
def test_a_short_run_prints_its_figures(where: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "binding_case.py"), "--steps", "4", "--every", "2", *where]
        + ["--images", "16", "--words", "mixed", "--pos-embed", "sinusoidal", "--attention", "axial"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["step"] for line in lines] == [2, 4, 4] and lines[-1]["final"] is True
    assert (
        lines[-1]["words"] == "mixed" and lines[-1]["pos_embed"] == "sinusoidal" and lines[-1]["attention"] == "axial"
    )
    assert 0.0 <= lines[-1]["relation_true_preferred"] <= 1.0 and 0.0 < lines[-1]["p_column_word"] < 1.0
    # where the claim word was read from: shares of one softmax over the CLS and 64 image tokens
    assert lines[-1]["attention_uniform"] == round(1 / 65, 3)
    assert 0.0 < lines[-1]["attention_on_a"] < 1.0 and 0.0 < lines[-1]["attention_on_b"] < 1.0
