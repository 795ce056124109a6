"""Impossible settings fail at start-up, before any data is generated, read or scanned, with a
message that names the key and the values allowed; unknown group options are Hydra's to refuse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException
from omegaconf import DictConfig

from mmtx.checkpoint import CheckpointError
from mmtx.cli.common import CONFIG_DIR, user_errors
from mmtx.config_check import ConfigError, check_eval_config, check_train_config
from mmtx.config_error import ArgumentError
from tests.bad_inputs import write_tiny_checkpoint
from tests.helpers import compose_train, train_in_process, write_gpt2, write_vit


@pytest.fixture(autouse=True)
def _no_hydra_config_left() -> Iterator[None]:
    yield
    HydraConfig.instance().cfg = None  # type: ignore[assignment]


def _train_cfg(*overrides: str) -> DictConfig:
    """The config as ``mmtx-train`` gets it; HydraConfig set, as ``@hydra.main`` sets it, for the
    ``${hydra:...}`` paths the checks resolve when they build the data module."""
    cfg = compose_train([*overrides, "paths.output_dir=/unused"])
    HydraConfig.instance().set_config(cfg)
    return cfg


def _eval_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="eval", overrides=list(overrides))


def _problems(cfg: DictConfig, check=check_train_config) -> str:
    with pytest.raises(ConfigError) as info:
        check(cfg)
    return str(info.value)


@pytest.mark.parametrize(
    "choices",
    [[], ["task=pretrain"], ["task=pretrain", "task.objectives.caption=1"], ["task=vqa"], ["task=vqa_generative"], ["experiment=caption_coco", *(f"data.{s}.{f}=x" for s in ("train", "val") for f in ("annotations", "images"))],
     ["experiment=pretrain_shapes"], ["experiment=vqa_shapes"], ["data=karpathy", "data.annotations=a", "data.images=b"],
     ["data=pairs", *(f"data.{s}.{f}=x" for s in ("train", "val") for f in ("file", "images"))],
     ["model.encoder.pos_embed=rope", "model.decoder.pos_embed=sinusoidal"]],
)  # fmt: skip
def test_the_shipped_configs_pass(choices: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the GPU recipes, as on a GPU machine
    check_train_config(_train_cfg(*choices))


def test_pretrained_captioner_config_passes_and_missing_weights_are_named(tmp_path: Path) -> None:
    """The task is built to check it, so ``model=caption_pretrained`` reads its (tiny) files."""
    transformers = pytest.importorskip("transformers", reason="transformers writes the pretrained files")
    write_vit(tmp_path / "vit", transformers)
    write_gpt2(tmp_path / "gpt2", transformers, ["a red circle", "two blue squares"])
    given = ["model=caption_pretrained", f"model.encoder.pretrained={tmp_path / 'vit'}", "model.encoder.dim=32",
             f"model.decoder.pretrained={tmp_path / 'gpt2'}", f"tokenizer.path={tmp_path / 'gpt2'}", "data.max_length=16"]  # fmt: skip
    check_train_config(_train_cfg(*given))
    message = _problems(_train_cfg(*given, f"model.encoder.pretrained={tmp_path / 'nope'}"))
    assert f"model.encoder: pretrained weights not found: {tmp_path / 'nope'}" in message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.encoder.dim=30"],
         "model.encoder.dim=30 is not divisible by model.encoder.num_heads=4 (allowed: a multiple of 4, e.g. 28 or 32)"),
        (["model.decoder.num_heads=5"], "model.decoder.dim=128 is not divisible by model.decoder.num_heads=5"),
        (["model.encoder.dim=-64"], "model.encoder.dim=-64 must be a positive integer"),
        (["model.decoder.depth=-1"], "model.decoder.depth=-1 must be an integer >= 0"),
        (["data.image_size=40", "model.encoder.patch_size=16"],
         "model.encoder.image_size=40 (set by data.image_size) is not a multiple of model.encoder.patch_size=16 "
         "(allowed: a multiple of 16: 16, 32, 48, ...)"),
        (["data=coco", "data.image_size=8", "model.encoder.patch_size=16"],
         "model.encoder.image_size=8 (set by data.image_size) is smaller than model.encoder.patch_size=16"),
        (["data.image_size=16"], "data.image_size=16 must be an integer >= 32"),
        (["data.num_val=-3"], "data.num_val=-3 must be an integer in [0, 9999999]"),
        (["data.batch_size=0"], "data.batch_size=0 must be a positive integer"),
        (["data.max_length=2"], "data.max_length=2 must be an integer >= 3"),
        (["data.num_workers=-1"], "data.num_workers=-1 must be an integer >= 0"),
        (["data.crop_scale=[0.8,0.2]"], "data.crop_scale=[0.8, 0.2] must be null or [lo, hi] with 0 < lo <= hi <= 1"),
        (["data.shift_px=-2"], "data.shift_px=-2 must be an integer from 0 to image_size/2 - 1"),
        (["data.mirror_words=[left,right]"], "data.mirror_words=['left', 'right'] must be pairs of words, e.g. [[left, right]]"),
        (["data.on_bad_image=ignore"], "data.on_bad_image='ignore' is not one of error, skip"),
        (["data.on_bad_annotation=warn"], "data.on_bad_annotation='warn' is not one of error, skip"),
        (["model.encoder.pos_embed=alibi"], "model.encoder.pos_embed='alibi' is not one of learned, sinusoidal, rope"),
        (["model.encoder.attention=diagonal"], "model.encoder.attention='diagonal' is not one of full, axial"),
        (["model.encoder.stem_channels=[16,32]"],
         "model.encoder.stem_channels takes 3 positive ints at model.encoder.patch_size=8 (one per stride-2 layer), "
         "got [16, 32]"),
        (["model.encoder.stem_channels=64"],
         "model.encoder.stem_channels takes 3 positive ints at model.encoder.patch_size=8 (one per stride-2 layer), got 64"),
        (["model.encoder.attention=axial", "model.encoder.num_heads=1"],
         "model.encoder.attention='axial' needs at least 2 heads (rows and columns), got model.encoder.num_heads=1"),
        (["model.encoder.pos_embed=rope", "model.encoder.num_heads=64"],
         "model.encoder.pos_embed=rope needs a head width (dim / num_heads = 2) divisible by 4"),
        (["model.decoder.pos_embed=sinusoidal", "model.decoder.dim=195", "model.decoder.num_heads=3"],
         "model.decoder.pos_embed=sinusoidal needs dim divisible by 2, got model.decoder.dim=195"),
        (["model.decoder.max_length=16"], "model.decoder.max_length=16 is shorter than data.max_length=24 (allowed: >= 24)"),
        (["model.decoder.context_dim=64"], "model.decoder.context_dim=64 must equal model.encoder.dim=128"),
        (["model.decoder.dropout=1.5"], "model.decoder.dropout=1.5 must be a number in [0, 1)"),
        (["task.lr=-0.001"], "task.lr=-0.001 must be a positive number"),
        (["task.warmup_ratio=1.0"], "task.warmup_ratio=1.0 must be a number in [0, 1)"),
        (["task.generation.num_beams=0"], "task.generation: invalid settings: num_beams=0"),
        (["tokenizer.kind=char"], "tokenizer.kind='char' is not one of wordpiece, bpe"),
        (["tokenizer.kind=bpe", "tokenizer.vocab_size=100"],
         "tokenizer.vocab_size=100 is below 263, the smallest byte-level BPE vocabulary"),
        (["tokenizer.path=/no/such/tokenizer.json"], "tokenizer.path=/no/such/tokenizer.json: no such file"),
        (["init_from=/no/such.ckpt"], "init_from=/no/such.ckpt: no such checkpoint file"),
        (["task=pretrain", "model.backbone.vision.patch_size=128"],
         "model.backbone.vision.image_size=64 (set by data.image_size) is smaller than model.backbone.vision.patch_size=128"),
        (["task=pretrain", "model.backbone.text.max_length=8"], "model.backbone.text.max_length=8 is shorter than data.max_length=24"),
        (["task=pretrain", *(f"task.objectives.{name}=0" for name in ("mlm", "mpm", "itm", "itc", "caption"))],
         "task.objectives: every loss weight (mlm, mpm, itm, itc, caption) is 0; set one > 0"),
        (["task=pretrain", "task.objectives.mask_prob=1.5"], "task.objectives.mask_prob=1.5 must be a number in [0, 1]"),
        (["task=pretrain", "model.itc_pool=max"], "model.itc_pool='max' must be one of cls, mean"),
        (["task=pretrain", "data.group_by_image=true"],
         "data.group_by_image=True batches an image's captions together, which pretraining would take for negatives"),
        (["task=vqa", "task.num_answers=0"], "task.num_answers=0 must be a positive integer"),
        (["task.word_weights={circle:0}"], "task.word_weights: 'circle' takes a positive finite number, got 0"),
        (["task.word_weights=[circle,left]"],
         "task.word_weights=['circle', 'left'] must map words to weights, e.g. {circle: 3}"),
        (["task.word_weights={circle:3}", "task.label_smoothing=0.1"],
         "task.word_weights needs no label smoothing, got task.label_smoothing=0.1: torch's would favour the weighted words"),
        (["task=caption_scst", "task.word_weights={circle:3}"],
         "task.word_weights={'circle': 3} weighs cross-entropy, which self-critical training does not use"),
        (["data=karpathy"], "data.annotations is not set (??? in the config): give it, e.g. data.annotations=..."),
        (["model=caption_pretrained"], "model.encoder.pretrained is not set (??? in the config)"),
    ],
)  # fmt: skip
def test_impossible_values_name_the_key_and_what_is_allowed(overrides: list[str], expected: str) -> None:
    assert expected in _problems(_train_cfg(*overrides))


def test_every_problem_is_reported_at_once() -> None:
    message = _problems(_train_cfg("model.encoder.dim=30", "data.batch_size=-2", "task.lr=0"))
    assert message.startswith("invalid config:\n")
    assert len(message.splitlines()) == 4
    assert ConfigError in user_errors()  # mmtx-train prints it as one message, no traceback


def test_train_checks_before_generating_or_reading_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with pytest.raises(ConfigError, match="model.encoder.dim=30"):
        train_in_process(["model.encoder.dim=30", f"paths.data_dir={data_dir}", f"paths.output_dir={tmp_path / 'run'}"])
    assert not data_dir.exists()  # the shapes scenes were never drawn


def test_resume_with_a_changed_model_fails_at_start_up(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "last.ckpt")
    tiny = ["model.encoder.dim=32", "model.encoder.depth=1", "model.encoder.num_heads=2", "model.encoder.patch_size=8",
            "model.decoder.dim=32", "model.decoder.depth=1", "model.decoder.num_heads=2", "data.image_size=32"]  # fmt: skip
    data_dir = tmp_path / "data"
    overrides = [f"ckpt_path={ckpt}", f"paths.data_dir={data_dir}", f"paths.output_dir={tmp_path / 'run'}"]
    with pytest.raises(CheckpointError) as info:
        train_in_process([*tiny, "model.decoder.dim=64", *overrides])
    assert "model.decoder.dim: 32 in the checkpoint, 64 now" in str(info.value)
    assert not data_dir.exists()
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="is a text file, not a PyTorch checkpoint"):
        train_in_process([*tiny, f"ckpt_path={tmp_path / 'notes.ckpt'}", *overrides[1:]])
    assert not data_dir.exists()


@pytest.mark.parametrize(("group", "option"), [("data", "imagenet"), ("task", "segmentation"), ("model", "huge")])
def test_unknown_group_options_are_refused_listing_the_options(group: str, option: str) -> None:
    with pytest.raises(MissingConfigException) as info:
        _train_cfg(f"{group}={option}")
    message = str(info.value)
    assert f"Could not find '{group}/{option}'" in message
    assert f"Available options in '{group}'" in message
    listed = {"data": "coco", "task": "caption", "model": "caption_small"}[group]
    assert listed in message


def test_eval_checks_split_image_size_and_data(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "last.ckpt")  # patches of 8
    message = _problems(
        _eval_cfg(f"ckpt={ckpt}", "split=validation", "image_size=36", "generation.top_p=2"), check_eval_config
    )
    assert "split='validation' is not one of train, val, test" in message
    assert "image_size=36 is not a multiple of the checkpoint's model.encoder.patch_size=8" in message
    assert "generation: invalid settings: top_p=2" in message
    message = _problems(_eval_cfg(f"ckpt={ckpt}", "data=coco", "data.on_bad_image=maybe"), check_eval_config)
    assert "data.on_bad_image='maybe' is not one of error, skip" in message
    check_eval_config(
        _eval_cfg(f"ckpt={ckpt}", "image_size=48", "data=coco", "data.val.annotations=a", "data.val.images=b")
    )
    assert "ckpt is not set: give the checkpoint to evaluate" in _problems(_eval_cfg(), check_eval_config)


def test_the_command_line_reports_config_errors_without_a_traceback(cli, tmp_path: Path) -> None:
    bad_value, bad_group = cli.run_many(
        ("mmtx-train", "model.encoder.dim=30", "logger=none", f"hydra.run.dir={tmp_path / 'a'}"),
        ("mmtx-train", "data=imagenet", f"hydra.run.dir={tmp_path / 'b'}"),
        cwd=tmp_path,
        check=False,
    )
    assert bad_value.returncode == 1, cli.describe(bad_value)
    assert "mmtx: invalid config:\n  model.encoder.dim=30 is not divisible" in bad_value.stderr
    assert bad_group.returncode != 0 and "Could not find 'data/imagenet'" in bad_group.stderr
    for result in (bad_value, bad_group):
        assert "Traceback" not in result.stderr, cli.describe(result)


def test_a_gpu_preset_without_a_gpu_is_refused_naming_the_cpu_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert (
        "trainer.accelerator=gpu: this machine has no GPU that torch can use; train on the CPU with trainer=cpu"
        in _problems(_train_cfg("trainer=gpu"))
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert "trainer.devices=4: only 2 GPU(s) are visible; use trainer.devices<=2" in _problems(
        _train_cfg("trainer=gpu", "trainer.devices=4")
    )


def test_more_cpu_processes_than_cores_and_fp16_on_the_cpu_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    message = _problems(_train_cfg("trainer=ddp_cpu", "trainer.devices=3", "trainer.precision=16-mixed"))
    assert "trainer.devices=3 would start 3 processes on 2 CPU core(s)" in message
    assert "trainer.precision=16-mixed does not run on the CPU; use one of 32-true, bf16-mixed" in message
    check_train_config(_train_cfg("trainer=ddp_cpu", "trainer.devices=2"))


def test_a_misspelt_trainer_argument_is_named_with_the_right_one() -> None:
    assert "trainer.max_step is not an argument of lightning's Trainer (did you mean trainer.max_steps?)" in _problems(
        _train_cfg("+trainer.max_step=3")
    )


def test_every_unset_data_file_is_named_at_once() -> None:
    message = _problems(_train_cfg("data=coco", "data.val.images=val/"))
    for key in ("data.train.annotations", "data.train.images", "data.val.annotations"):
        assert f"{key} is not set" in message
    assert "data.val.images" not in message
    assert "data.val.images is not set" in _problems(
        _eval_cfg("ckpt=x.ckpt", "data=coco", "data.val.annotations=a.json"), check=check_eval_config
    )


def test_file_data_sets_start_one_loader_worker_fewer_than_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmtx.hardware import loader_workers

    for cores, workers in ((1, 0), (2, 1), (3, 2), (16, 4)):
        monkeypatch.setattr("os.cpu_count", lambda cores=cores: cores)
        assert loader_workers() == workers
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # this CI machine's size: not 4 workers on 2 cores
    for data in ("coco", "karpathy", "vqa"):
        assert _train_cfg(f"data={data}").data.num_workers == 1


def test_argument_error_reads_plainly_and_carries_its_arguments() -> None:
    error = ArgumentError(
        "{dim} is not divisible by {num_heads} (allowed: {num_heads!v}); {kind!r}, {objectives!k}: {encoder.dim}",
        dim=30, num_heads=4, kind="char", objectives=None, **{"encoder.dim": 8},
    )  # fmt: skip
    assert str(error) == "dim=30 is not divisible by num_heads=4 (allowed: 4); kind='char', objectives: encoder.dim=8"
    assert error.arguments["encoder.dim"] == 8
    # the names, not the words around them, are what a renderer changes: values shown alone stay
    shown = error.render(lambda name, value: f"<{name}>{value}")
    assert (
        shown == "<dim>=30 is not divisible by <num_heads>=4 (allowed: 4); <kind>='char', <objectives>: <encoder.dim>=8"
    )


def test_a_refusal_is_keyed_by_its_arguments_not_by_its_wording() -> None:
    """An argument the message names as data gets its config key; a word that only looks like an
    argument (``dim=`` in the text) is left alone."""
    message = _problems(_train_cfg("model.encoder.dim=30"))
    assert "model.encoder.dim=30 is not divisible by model.encoder.num_heads=4" in message
    message = _problems(_train_cfg("model.decoder.context_dim=64"))
    assert "model.decoder.context_dim=64 must equal model.encoder.dim=128" in message
    message = _problems(_train_cfg("model.encoder.pos_embed=rope", "model.encoder.num_heads=64"))
    assert "(dim / num_heads = 2)" in message  # words of the text, not arguments: unchanged


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [(["+data.batchsize=8"], "data.batchsize is not a key of data (did you mean data.batch_size?)"),
     (["+model.encoder.nonsense=1"], "model.encoder.nonsense is not a key of model.encoder"),
     (["+model.decoder.num_head=2"], "model.decoder.num_head is not a key of model.decoder (did you mean model.decoder.num_heads?)"),
     (["+task.learning_rate=1"], "task.learning_rate is not a key of task"),
     (["task=vqa", "+data.group_by_images=true"], "(did you mean data.group_by_image?)")],
)  # fmt: skip
def test_keys_no_constructor_takes_are_named_from_the_signatures(overrides: list[str], expected: str) -> None:
    message = _problems(_train_cfg(*overrides))
    assert expected in message
    assert len(message.splitlines()) == 2  # the one problem; the group with it is not built


def test_the_signatures_read_through_kwargs_to_the_base_classes() -> None:
    from mmtx.config_check import unknown_keys

    assert unknown_keys(_train_cfg("data=grid").data, "data") == []  # GridCaptions -> ... -> the data module
    assert unknown_keys(_train_cfg("task=caption_scst").task, "task") == []  # **kwargs to CaptionTask


def test_a_data_value_is_refused_by_the_data_module_itself() -> None:
    """One place checks each data setting: the data module, whether built by the start-up check
    (keyed) or by hand (named by its argument)."""
    from mmtx.data.synthetic import ShapesCaptions

    for bad, expected in (({"batch_size": 0}, "batch_size=0 must be a positive integer"),
                          ({"shift_px": 40}, "shift_px=40 must be an integer from 0 to image_size/2 - 1"),
                          ({"crop_scale": [0.8, 0.2]}, "crop_scale=[0.8, 0.2] must be null or [lo, hi]"),
                          ({"on_bad_image": "ignore"}, "on_bad_image='ignore' is not one of error, skip")):  # fmt: skip
        with pytest.raises(ArgumentError) as info:
            ShapesCaptions("unused", image_size=64, **bad)
        assert str(info.value).startswith(expected)
        assert f"data.{expected}" in _problems(_train_cfg(*(f"data.{k}={v}".replace(" ", "") for k, v in bad.items())))
    message = _problems(_train_cfg("data=coco", "data.batch_size=0"))  # unset files and a bad value, at once
    assert "data.train.annotations is not set" in message and "data.batch_size=0 must be a positive integer" in message
