"""Trainer presets: FSDP with the transformer block as unit, bf16 mixed precision, torch.compile."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.strategies import FSDPStrategy

from mmtx.checkpoint import read_checkpoint
from mmtx.compile import compile_blocks
from mmtx.generation import GenerationConfig, generate
from mmtx.nn.blocks import CrossAttentionBlock, TransformerBlock
from tests.helpers import compose_train, tiny_captioner, train_in_process

NO_GPU = "needs a CUDA GPU (Lightning's FSDP and GPU bf16 run only there); run on a GPU machine"


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp_preset_wraps_and_checkpoints_transformer_blocks(checkpointing: bool) -> None:
    cfg = compose_train(["trainer=fsdp", f"trainer.strategy.activation_checkpointing={checkpointing}"])
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {TransformerBlock, CrossAttentionBlock}
    policy = strategy._activation_checkpointing_kwargs.get("auto_wrap_policy")
    assert (policy._module_classes == {TransformerBlock, CrossAttentionBlock}) if checkpointing else policy is None
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"


def test_cpu_preset_trains_in_bf16_only_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU preset's precision is detected (AVX512-BF16/AMX: bf16 autocast, else fp32) and it
    trains for a time budget; the GPU presets keep bf16 and an epoch budget."""
    import mmtx.hardware

    for native, expected in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(mmtx.hardware.torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        monkeypatch.setattr(mmtx.hardware.torch.cpu, "_is_amx_tile_supported", lambda: native)
        cfg = compose_train([])
        assert cfg.trainer.precision == expected
        # a GPU preset run on the CPU computes as the CPU preset does (trainer=ddp
        # trainer.accelerator=cpu must not evaluate in bf16 where trainer=cpu uses fp32)
        for preset in (["trainer=ddp", "trainer.accelerator=cpu"], ["trainer=gpu", "trainer.accelerator=cpu"],
                       ["trainer=ddp_cpu"], ["trainer=fsdp", "trainer.accelerator=cpu"]):  # fmt: skip
            assert compose_train(preset).trainer.precision == expected, preset
    assert cfg.trainer.max_time and cfg.trainer.max_epochs == -1
    gpu = compose_train(["trainer=gpu"]).trainer
    assert gpu.precision == "bf16-mixed" and gpu.max_time is None and gpu.max_epochs > 0
    assert compose_train(["trainer=ddp"]).trainer.precision == "bf16-mixed"


def test_every_trainer_preset_carries_the_same_keys() -> None:
    keys = {name: set(compose_train([f"trainer={name}"]).trainer) for name in ("cpu", "gpu", "ddp", "ddp_cpu", "fsdp")}
    assert all(k == keys["cpu"] for k in keys.values()), keys


def test_bf16_mixed_precision_trains_on_the_cpu(tiny: list[str], tmp_path: Path) -> None:
    dtypes = tmp_path / "dtypes.txt"
    metrics = train_in_process(
        [
            *tiny,
            "debug=fast",
            "trainer.precision=bf16-mixed",
            f"paths.output_dir={tmp_path}",
            "trainer.max_steps=4",
            "+callbacks.dtypes._target_=tests.helpers.RecordProductDtypes",
            f"+callbacks.dtypes.path={dtypes}",
        ]
    )
    assert dtypes.read_text().split() == ["torch.bfloat16"]  # every training product ran in bf16
    assert metrics and all(math.isfinite(v) for v in metrics.values())  # validated, no NaN
    last = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 4
    assert {t.dtype for t in last["state_dict"].values() if t.is_floating_point()} == {torch.float32}  # fp32 weights


@pytest.mark.slow
def test_compiled_blocks_match_eager_and_decoding_stays_eager() -> None:
    """Compiling every block changes neither the loss, the gradients, the parameter names nor
    cached generation (whose steps run eagerly)."""
    eager, compiled = tiny_captioner(), tiny_captioner()
    images, ids = torch.randn(2, 3, 32, 32), torch.randint(1, 40, (2, 10))
    assert compile_blocks(compiled) == 4
    assert list(compiled.state_dict()) == list(eager.state_dict())
    losses = [m.loss(images, ids, pad_id=0) for m in (eager, compiled)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)

    config = GenerationConfig(max_new_tokens=8)
    with torch.no_grad():
        tokens = [
            generate(m.decoder, m.encode(images), bos_id=1, eos_id=2, pad_id=0, config=config)
            for m in (eager, compiled)
        ]
    assert torch.equal(tokens[0], tokens[1])


def test_compile_true_compiles_the_blocks_when_fit_is_set_up() -> None:
    """``compile=true`` is the config's CompileBlocks callback: it compiles the task's blocks in
    Lightning's setup hook (for fit only), nothing in mmtx-train changes the task after building."""
    from hydra.utils import instantiate

    from mmtx.compile import CompileBlocks, _CompiledUnlessCached
    from tests.helpers import compose_train

    for flag, expected in (("compile=true", True), ("compile=false", False)):
        callback = instantiate(compose_train([flag, "paths.output_dir=/unused"]).callbacks.compile)
        assert isinstance(callback, CompileBlocks) and callback.enabled is expected
    task = torch.nn.Module()
    task.model = tiny_captioner()
    CompileBlocks().setup(None, task, "validate")  # type: ignore[arg-type]
    assert not any(isinstance(m.forward, _CompiledUnlessCached) for m in task.model.modules())
    CompileBlocks().setup(None, task, "fit")  # type: ignore[arg-type]
    blocks = [m for m in task.model.modules() if type(m).__name__ == "TransformerBlock"]
    assert len(blocks) == 4 and all(isinstance(b.forward, _CompiledUnlessCached) for b in blocks)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize(
    "preset", [["trainer=gpu"], ["trainer=gpu", "compile=true"], ["trainer=fsdp", "trainer.devices=1"]]
)
def test_gpu_presets_train(preset: list[str], tiny: list[str], tmp_path: Path) -> None:
    metrics = train_in_process([*tiny, "debug=fast", *preset, f"paths.output_dir={tmp_path}"])
    assert metrics and (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("data", ["shapes", "shapes_vqa", "coco", "karpathy", "vqa"])
def test_the_run_seed_reaches_the_data_module(data: str) -> None:
    """``seed=`` orders and augments the training examples: every data config passes it on."""
    assert compose_train(["seed=5", f"data={data}"]).data.shuffle_seed == 5


def test_the_data_module_is_built_with_the_run_seed(tmp_path: Path) -> None:
    cfg = compose_train(["seed=5", f"paths.data_dir={tmp_path}"])
    assert instantiate(cfg.data).seed == 5


@pytest.mark.parametrize(
    ("preset", "data", "expected"),
    [
        ("experiment=vqa_shapes", "data=vqa", {"image_size": 64, "batch_size": 128, "shift_px": 4}),
        ("experiment=caption_shapes", "data=coco", {"image_size": 64, "batch_size": 128, "shift_px": 0}),
        ("experiment=pretrain_shapes", "data=coco", {"image_size": 64, "batch_size": 32, "max_length": 24}),
    ],
)
def test_shapes_presets_carry_their_data_settings_to_a_users_files(preset: str, data: str, expected: dict) -> None:
    """The recipe measured on shapes scenes (image size, batch, shifts) comes with the preset when
    its data source is swapped for the user's files in the official format, as README's "Your own
    data" shows; without the preset the format's own defaults (224 px for natural images) apply."""
    cfg = compose_train([preset, data])
    assert {key: cfg.data[key] for key in expected} == expected
    assert cfg.data._target_ == compose_train([data]).data._target_
    assert compose_train([data]).data.image_size == 224
    if preset == "experiment=vqa_shapes":
        assert cfg.task.lr == 2e-3


def test_shapes_captioning_mirrors_and_nothing_else_does() -> None:
    """The shapes scenes' captions name a side with "left" and "right" alone, so their captioning
    runs mirror with those words swapped; pretraining on them, and a user's own files, are not
    mirrored (their captions may name a side in other words), except in the relations preset,
    whose captions state sides."""
    sides = [["left", "right"]]
    assert compose_train([]).data.mirror_words == sides
    assert compose_train(["experiment=caption_shapes"]).data.mirror_words == sides
    assert compose_train(["task=caption_scst"]).data.mirror_words == sides
    assert compose_train(["experiment=caption_relations"]).data.mirror_words == sides  # the recipe's second stage
    for unmirrored in (
        ["task=pretrain"],
        ["experiment=pretrain_shapes"],
        ["experiment=caption_shapes", "data=coco"],
        ["data=grid"],
        ["experiment=caption_places"],
        ["data=karpathy"],
        ["data=webdataset"],
    ):
        assert compose_train(unmirrored).data.mirror_words is None, unmirrored


def test_the_base_captioner_keeps_vit_b16_sizes_whatever_the_small_one_uses() -> None:
    """``model=caption_base`` starts from caption_small's keys, sized for a CPU, but must keep the
    sizes of ViT-B/16 (those of timm's and transformers' checkpoints; it keeps the convolutional
    stem): a change to the small captioner's widths does not reach it."""
    model = compose_train(["model=caption_base"]).model
    enc, dec = model.encoder, model.decoder
    assert (enc.patch_size, enc.dim, enc.depth, enc.num_heads, enc.mlp_ratio) == (16, 768, 12, 12, 4.0)
    assert (enc.attention, enc.pos_embed) == ("full", "learned")
    assert (dec.dim, dec.depth, dec.num_heads, dec.mlp_ratio) == (768, 6, 12, 4.0)


# docs/gpu.md: the overrides that log images per second with Lightning's ThroughputMonitor
THROUGHPUT = [
    "+callbacks.throughput._target_=lightning.pytorch.callbacks.ThroughputMonitor",
    "+callbacks.throughput.batch_size_fn._target_=hydra.utils.get_method",
    "+callbacks.throughput.batch_size_fn.path=mmtx.callbacks.images_in_batch",
    "+callbacks.throughput.window_size=4",
    "logger=csv",
    "trainer.log_every_n_steps=2",
]


def test_throughput_is_logged_and_a_run_without_validation_ends_cleanly(tiny: list[str], tmp_path: Path) -> None:
    """docs/gpu.md's throughput overrides log images per second; ``trainer.limit_val_batches=0``
    (no validation: what a throughput run wants) trains, checkpoints and reports no metrics
    instead of failing after the fit."""
    import csv
    import json

    metrics = train_in_process(
        [
            *tiny,
            *THROUGHPUT,
            "trainer.max_steps=12",
            "trainer.limit_val_batches=0",
            "trainer.enable_progress_bar=false",
            f"paths.output_dir={tmp_path}",
        ]
    )
    assert metrics == {}
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 12
    assert "baseline" not in json.loads((tmp_path / "metrics.json").read_text())
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rates = [
            float(r["train/device/samples_per_sec"]) for r in csv.DictReader(f) if r["train/device/samples_per_sec"]
        ]
    assert rates and all(rate > 0 for rate in rates)
