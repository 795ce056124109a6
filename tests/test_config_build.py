"""Models are built from their configs in plain Python: what Hydra's ``instantiate`` does with
mmtx's configs (nested nodes, ``_partial_``, merged overrides), and which node refused."""

from __future__ import annotations

import functools

import pytest
import torch

from mmtx.config_build import build, failed_node
from mmtx.config_error import ArgumentError
from mmtx.models.captioner import ImageCaptioner

ENCODER = {"_target_": "mmtx.models.vit.VisionEncoder", "image_size": 32, "patch_size": 8, "dim": 32, "depth": 1,
           "num_heads": 2}  # fmt: skip
DECODER = {"_target_": "mmtx.models.decoder.CaptionDecoder", "vocab_size": None, "context_dim": 32, "dim": 32,
           "depth": 1, "num_heads": 2, "max_length": 16}  # fmt: skip
CAPTIONER = {"_target_": "mmtx.models.captioner.ImageCaptioner", "encoder": ENCODER, "decoder": DECODER}


def test_nested_nodes_are_built_with_overrides_merged_into_them() -> None:
    torch.manual_seed(0)
    model = build(CAPTIONER, decoder={"vocab_size": 50, "pad_id": 0})
    assert isinstance(model, ImageCaptioner) and model.decoder.lm_head.out_features == 50
    assert model.encoder.dim == 32 and model.decoder.max_length == 16  # the node's other keys kept
    assert CAPTIONER["decoder"]["vocab_size"] is None  # the config itself is not changed


def test_a_partial_node_is_finished_by_its_caller() -> None:
    decoder = build({**DECODER, "_partial_": True, "vocab_size": 50})
    assert isinstance(decoder, functools.partial)
    assert decoder(pad_id=0).lm_head.out_features == 50


def test_the_innermost_refusing_node_is_named() -> None:
    with pytest.raises(ArgumentError) as info:
        build(CAPTIONER, key="model", encoder={"dim": 30, "num_heads": 4}, decoder={"vocab_size": 50})
    assert failed_node(info.value) == "model.encoder"  # not model, whose constructor it passed through
    assert str(info.value).startswith("dim=30 is not divisible by num_heads=4")  # the error as raised
    with pytest.raises(ArgumentError) as info:
        build(CAPTIONER, decoder={"vocab_size": 50, "context_dim": 16})
    assert failed_node(info.value) == ""  # the captioner's own check: the root node
    with pytest.raises(ImportError, match="mmtx.models.nope.Model"):
        build({"_target_": "mmtx.models.nope.Model"})
