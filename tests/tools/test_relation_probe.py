"""scripts/relation_probe.py: twins flip exactly the side, the probe counts the pairs a scorer
prefers the truth on, and it runs on a real captioner."""

from __future__ import annotations

import pytest
import torch

from mmtx.data.tokenizer import Tokenizer
from tests.helpers import load_script
from tests.test_export import TINY_CAPTIONER, build_task


@pytest.mark.parametrize(
    ("caption", "twin"),
    [
        ("a big red ball to the left of a small blue box", "a big red ball to the right of a small blue box"),
        ("the tiny green triangle is right of the large red circle", "the tiny green triangle is left of the large red circle"),
        ("a small red box sits above a big blue ball", "a small red box sits below a big blue ball"),
        ("we see a red ball beneath a blue box", "we see a red ball above a blue box"),
        ("a lone big green circle", None),  # no relation
        ("a red ball left of a box and above a ball", None),  # two: which one would the twin flip?
        ("a leftover red ball", None),  # whole words only
    ],
)  # fmt: skip
def test_twin_flips_the_one_direction_word(caption: str, twin: str | None) -> None:
    assert load_script("relation_probe").flipped(caption) == twin


def test_probe_counts_the_pairs_the_scorer_prefers_the_truth_on() -> None:
    probe = load_script("relation_probe")
    pairs = probe.relation_pairs(40, image_size=32)
    assert pairs and all(p[0].shape == (3, 32, 32) for p in pairs)
    assert all(probe.flipped(true) == twin for _, true, twin, _ in pairs)
    assert {p[3] for p in pairs} == {True, False}  # both axes are drawn
    truths = {p[1] for p in pairs}

    def oracle(task, images, captions):  # knows where every shape is
        return torch.tensor([1.0 if c in truths else 0.0 for c in captions])

    def contrarian(task, images, captions):
        return -oracle(task, images, captions)

    def horizontal_only(task, images, captions):  # knows left from right, not above from below
        return torch.tensor([1.0 if c in truths and ("left" in c or "right" in c) else 0.0 for c in captions])

    assert probe.probe(None, pairs, oracle, batch=7)["true_preferred"] == 1.0
    assert probe.probe(None, pairs, contrarian)["true_preferred"] == 0.0
    split = probe.probe(None, pairs, horizontal_only, batch=5)
    assert (split["horizontal"], split["vertical"], split["pairs"]) == (1.0, 0.0, len(pairs))
    with pytest.raises(ValueError, match="no caption stating a relation"):
        probe.probe(None, [], oracle)


def test_own_scene_takes_the_words_prior_away() -> None:
    """A scorer that prefers "above" and "over" whatever the image wins every pair of those words
    and none of the others' (`by_word`), yet scores exactly chance against another scene; one
    that reads the image wins there too."""
    probe = load_script("relation_probe")
    pairs = probe.relation_pairs(40, image_size=32)

    def scene(image):  # some of its pixels: exact values, which tell the scenes apart
        return tuple(image.flatten()[::7].tolist())

    truth = {(scene(p[0]), p[1]) for p in pairs}  # (a scene, a caption true of it)

    def sees(task, images, captions):  # knows where every shape of the scene in front of it is
        return torch.tensor([float((scene(i), c) in truth) for i, c in zip(images, captions)])

    def prior(task, images, captions):  # blind: the commoner words of each axis score higher
        return torch.tensor([float(any(w in c.split() for w in ("above", "over", "left"))) for c in captions])

    seen, blind = probe.probe(None, pairs, sees, batch=9), probe.probe(None, pairs, prior)
    assert seen["own_scene"] == {"overall": 1.0, "horizontal": 1.0, "vertical": 1.0}
    assert blind["own_scene"] == {"overall": 0.5, "horizontal": 0.5, "vertical": 0.5}
    assert {"left", "right"} < set(blind["by_word"]) <= set(probe.FLIPS)
    assert {w: 1.0 if w in ("above", "over", "left") else 0.0 for w in blind["by_word"]} == blind["by_word"]
    leads = seen["by_lead"]
    assert "horizontal after 'the'" in leads and "vertical after a noun" in leads
    assert sum(g["pairs"] for g in leads.values()) == len(pairs)
    assert all(g["true_preferred"] == g["own_scene"] == 1.0 for g in leads.values())


@pytest.mark.parametrize(
    ("caption", "word", "lead"),
    [("a red ball to the left of a blue box", "left", "'the'"), ("the red ball sits above the box", "above", "'sits'"),
     ("the red ball is under the box", "under", "'is'"), ("a red ball right of a blue box", "right", "a noun")],
)  # fmt: skip
def test_the_lead_is_the_word_before_the_side(caption: str, word: str, lead: str) -> None:
    assert load_script("relation_probe")._word_and_lead(caption) == (word, lead)


def test_probe_scores_a_captioner_by_its_caption_likelihoods() -> None:
    probe = load_script("relation_probe")
    pairs = probe.relation_pairs(12, image_size=32)
    captions = [c for p in pairs for c in p[1:3]]
    task = build_task(TINY_CAPTIONER, Tokenizer.train(captions * 3, vocab_size=80))
    images = torch.stack([p[0] for p in pairs[:4]])
    scores = probe.log_likelihoods(task, images, [p[1] for p in pairs[:4]])
    # the summed log-probability is the negative of the model's own token loss times the tokens
    ids, mask = task.tokenizer.encode_batch([pairs[0][1]], task.model.decoder.max_length)
    loss = task.model.loss(images[:1], ids, task.tokenizer.pad_id)
    torch.testing.assert_close(scores[0], -loss * (ids[:, 1:] != task.tokenizer.pad_id).sum(), rtol=1e-4, atol=1e-4)
    result = probe.probe(task, pairs)
    assert result["pairs"] == len(pairs) and 0.0 <= result["true_preferred"] <= 1.0
