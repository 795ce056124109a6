"""scripts/probe_shape_kinds.py: the linear probe reads a shape kind the features hold and not one
they lack, trains a fresh vision stream as a reference (``--fresh``, ``--override``), and scores
the shared trained captioner's checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from hydra.errors import ConfigCompositionException

from tests.helpers import Run, load_script


def test_kind_probe_reads_kinds_present_in_the_features_not_absent_ones() -> None:
    probe = load_script("probe_shape_kinds")
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(200, 2, generator=g) > 0.5).float()
    noise = torch.randn(200, 6, generator=g)
    features = torch.cat([noise, labels[:, :1] + 0.1 * torch.randn(200, 1, generator=g)], dim=1)  # kind 0 only
    seen, unseen = probe.probe_accuracy(features[:150], labels[:150], features[150:], labels[150:])
    assert seen == 1.0
    assert unseen < 0.8


def test_kind_probe_script_trains_a_fresh_vision_stream_as_a_reference(capsys) -> None:
    probe = load_script("probe_shape_kinds")
    assert probe.main(["--fresh", "1", "--train", "24", "--val", "12", "--image-size", "32"]) == 0
    result = json.loads(capsys.readouterr().out)
    shares = result["fresh encoder, 1 s on the kinds"]
    assert len(shares) == 3 and all(0.0 <= s <= 1.0 for s in shares)
    # --override reaches the fresh stream's config: a variant of it is probed under its own name
    small = [
        "--fresh",
        "1",
        "--train",
        "24",
        "--val",
        "12",
        "--image-size",
        "32",
        "--override",
        "model.backbone.vision.depth=0",
    ]
    assert probe.main(small) == 0
    assert "fresh encoder model.backbone.vision.depth=0, 1 s on the kinds" in json.loads(capsys.readouterr().out)
    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        probe.main([*small[:-1], "model.backbone.vision.no_such_key=1"])
    with pytest.raises(SystemExit):  # nothing to probe
        probe.main(["--train", "24"])
    assert "give checkpoints to probe, --fresh SECONDS, or both" in capsys.readouterr().err


def test_kind_probe_script_scores_a_captioner_checkpoint(trained: Run, capsys) -> None:
    probe = load_script("probe_shape_kinds")
    assert probe.main([str(trained.last), "--train", "24", "--val", "12", "--image-size", "32"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kinds"] == ["circle", "square", "triangle"]
    for shares in (result["majority"], result[str(trained.last)]):
        assert len(shares) == 3 and all(0.0 <= s <= 1.0 for s in shares)
