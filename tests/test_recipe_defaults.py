"""A task's defaults are the recipe its shapes preset learned with, whichever data group it is given.

``task=X`` sets the learning rate and objectives, the data keys that depend on the task (batch size,
shifts, text length) and the trainer's validation interval; the shapes presets add only the small
images' size. Composed in-process with Hydra's compose API, as ``mmtx-train`` composes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from mmtx.cli.common import CONFIG_DIR
from tests.helpers import compose_train

NODES = ("task", "model", "data", "trainer", "monitor", "tokenizer")


def resolved(*overrides: str) -> dict[str, Any]:
    """mmtx-train's task, model, data, trainer, monitor and tokenizer keys, resolved, as dotted names."""
    cfg = compose_train([*overrides, "paths.output_dir=/unused", "paths.data_dir=/unused"])
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}")
        else:
            flat[prefix] = node

    for name in NODES:
        walk(OmegaConf.to_container(cfg[name], resolve=True), name)
    return flat


def differing(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}


# (the plain task, its preset, the settings that differ on purpose): the preset's small images' size
# where the data group is a format for the user's own images (natural ones, 224 px by default)
SMALL = ["data.image_size=64"]
SAME_AS_PRESET = [
    ([], ["experiment=caption_shapes"], []),
    (["task=caption"], ["experiment=caption_shapes"], []),
    (["data=coco"], ["experiment=caption_shapes", "data=coco"], SMALL),
    (["task=pretrain"], ["experiment=pretrain_shapes"], []),
    (["task=pretrain", "data=coco"], ["experiment=pretrain_shapes", "data=coco"], SMALL),
    (["task=pretrain", "data=webdataset"], ["experiment=pretrain_shapes", "data=webdataset"], SMALL),
    (["task=vqa"], ["experiment=vqa_shapes"], []),
    (["task=vqa", "data=vqa"], ["experiment=vqa_shapes", "data=vqa"], SMALL),
    (["task=vqa", "data=webdataset_vqa"], ["experiment=vqa_shapes", "data=webdataset_vqa"], SMALL),
    # docs/pretrained.md's VQA from BERT and ViT weights: the preset with model=vqa_pretrained
    (["task=vqa", "model=vqa_pretrained"], ["experiment=vqa_shapes", "model=vqa_pretrained"], []),
]  # fmt: skip


@pytest.mark.parametrize(("plain", "preset", "on_purpose"), SAME_AS_PRESET, ids=lambda v: " ".join(v) or "-")
def test_a_plain_task_resolves_as_its_shapes_preset(plain: list[str], preset: list[str], on_purpose: list[str]) -> None:
    """Every key of the task, model, data, trainer, monitor and tokenizer is the preset's once the
    listed settings are added: a key a preset sets that its task does not (or the reverse) fails here."""
    task, shapes = resolved(*plain, *on_purpose), resolved(*preset)
    assert differing(task, shapes) == set()
    if on_purpose:  # not the data group's own: the preset does set it
        assert resolved(*plain)["data.image_size"] == 224 and shapes["data.image_size"] == 64


VQA = {"task.lr": 2e-3, "data.batch_size": 128, "data.shift_px": 4, "data.max_length": 24,
       "trainer.val_check_interval": 500, "trainer.check_val_every_n_epoch": None}  # fmt: skip
GENERATIVE_VQA = {"task.lr": 1e-3, "data.batch_size": 64, "data.shift_px": 4, "data.max_length": 24,
                  "trainer.val_check_interval": None, "trainer.check_val_every_n_epoch": 1}  # fmt: skip
PRETRAIN = {"task.lr": 1e-3, "task.objectives.mlm": 1.0, "task.objectives.mpm": 0.0, "task.objectives.itm": 1.0,
            "task.objectives.itc": 0.5, "task.objectives.caption": 1.0, "data.batch_size": 32, "data.max_length": 24,
            "trainer.val_check_interval": None, "trainer.check_val_every_n_epoch": 1}  # fmt: skip
CAPTION = {
    "task.lr": 2e-3,
    "data.batch_size": 128,
    "trainer.val_check_interval": None,
    "trainer.check_val_every_n_epoch": 1,
}
# every data group, by the kind of data module it builds
GROUPS = {p.stem: yaml.safe_load(p.read_text())["_target_"] for p in sorted(Path(CONFIG_DIR, "data").glob("*.yaml"))}
VQA_DATA = [name for name, target in GROUPS.items() if "Vqa" in target]
CAPTION_DATA = [name for name in GROUPS if name not in VQA_DATA]


@pytest.mark.parametrize(
    ("task", "data", "recipe"),
    [*(("vqa", d, VQA) for d in VQA_DATA), *(("vqa_generative", d, GENERATIVE_VQA) for d in VQA_DATA),
     *(("pretrain", d, PRETRAIN) for d in CAPTION_DATA), *(("caption", d, CAPTION) for d in CAPTION_DATA)],
)  # fmt: skip
def test_a_task_brings_its_recipe_to_every_data_group(task: str, data: str, recipe: dict[str, Any]) -> None:
    """The task's data and trainer keys replace the data group's and the trainer's own (the defaults
    list puts the task after both): ``task=vqa data=vqa`` batches 128 questions, not VQA v2's 64."""
    cfg = resolved(f"task={task}", f"data={data}")
    assert {key: cfg[key] for key in recipe} == recipe
    assert cfg["data._target_"] == resolved(f"data={data}")["data._target_"]  # the group chosen, not the task's default


def test_the_data_groups_are_found() -> None:
    assert {"shapes_vqa", "vqa", "webdataset_vqa"} <= set(VQA_DATA)
    assert {"shapes", "coco", "karpathy", "pairs", "webdataset"} <= set(CAPTION_DATA)


@pytest.mark.parametrize("preset", [[], ["experiment=vqa_shapes"]])
def test_the_command_line_wins_over_the_recipe(preset: list[str]) -> None:
    overrides = {"data.batch_size": 8, "data.shift_px": 0, "task.lr": 5e-4, "trainer.val_check_interval": 100,
                 "data.image_size": 32}  # fmt: skip
    cfg = resolved(*preset, "task=vqa", "data=vqa", *(f"{k}={v}" for k, v in overrides.items()))
    assert {key: cfg[key] for key in overrides} == overrides


def test_the_gpu_presets_keep_the_data_sets_own_settings() -> None:
    """``experiment=caption_coco`` (ViT-B/16 on COCO, one GPU) keeps COCO's batch, size and text
    length, not the small images' recipe of ``task=caption``, and its own rate."""
    cfg = resolved("experiment=caption_coco")
    expected = {"data.batch_size": 64, "data.image_size": 224, "data.max_length": 32, "task.lr": 3e-4,
                "trainer.accelerator": "gpu", "trainer.max_epochs": 10}  # fmt: skip
    assert {key: cfg[key] for key in expected} == expected
