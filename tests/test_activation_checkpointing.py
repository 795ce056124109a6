"""``activation_checkpointing=true``: every transformer block recomputed in the backward pass, under
any trainer preset: the same loss and gradients (dropout included), the blocks really run twice,
clearly less memory kept for the backward pass, and training runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf

import mmtx.activation_checkpointing as ac
from mmtx.activation_checkpointing import CheckpointBlocks, _CheckpointedWhenTraining, checkpoint_blocks
from mmtx.checkpoint import read_checkpoint
from mmtx.compile import _CompiledUnlessCached
from mmtx.config_check import ConfigError, check_train_config
from mmtx.models import CaptionDecoder, ImageCaptioner, TextEncoder, VisionEncoder
from mmtx.models.pretraining import Objectives, TwoStreamPretrainer
from mmtx.models.two_stream import TwoStreamModel
from mmtx.nn.blocks import CrossAttentionBlock, TransformerBlock
from tests.helpers import compose_train, load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_memory.py"
DROP = dict(dropout=0.2, attn_dropout=0.2)


def captioner(seed: int = 0) -> ImageCaptioner:
    torch.manual_seed(seed)
    enc = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=2, num_heads=4, **DROP)
    dec = CaptionDecoder(40, context_dim=32, dim=32, depth=2, num_heads=4, max_length=16, **DROP)
    return ImageCaptioner(enc, dec).train()


def pretrainer(seed: int = 0) -> TwoStreamPretrainer:
    torch.manual_seed(seed)
    vision = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=4, **DROP)
    text = TextEncoder(60, dim=32, depth=1, num_heads=4, max_length=16, **DROP)
    backbone = TwoStreamModel(vision, text, co_layers=2, joint_dim=32, dropout=0.2)
    return TwoStreamPretrainer(backbone, mask_id=4, special_ids=list(range(7))).train()


def captioner_loss(model: ImageCaptioner) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    images, ids = torch.randn(4, 3, 32, 32, generator=g), torch.randint(3, 40, (4, 12), generator=g)
    return model.loss(images, ids, pad_id=0)


def pretrainer_loss(model: TwoStreamPretrainer) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    images, ids = torch.randn(4, 3, 32, 32, generator=g), torch.randint(7, 60, (4, 10), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids, dtype=torch.bool)
    objectives = Objectives(itc=1.0)
    return model(images, ids, mask, torch.arange(4), objectives)["loss"]  # masks drawn after the seed, as dropout


MODELS = {"captioner": (captioner, captioner_loss), "pretrainer": (pretrainer, pretrainer_loss)}


def loss_and_grads(model: torch.nn.Module, loss_fn: Callable) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(123)  # the dropout masks
    loss = loss_fn(model)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def block_count(model: torch.nn.Module) -> int:
    return sum(isinstance(m, (TransformerBlock, CrossAttentionBlock)) for m in model.modules())


@pytest.mark.parametrize("kind", MODELS)
def test_same_loss_and_gradients_with_dropout(kind: str) -> None:
    """Checkpointed blocks give the plain model's loss and gradients with dropout on: the recompute
    draws the same masks. Without the RNG state restored they differ, so dropout is exercised."""
    build, loss_fn = MODELS[kind]
    plain, checkpointed, unrestored = build(), build(), build()
    assert checkpoint_blocks(checkpointed) == block_count(checkpointed) > 0
    checkpoint_blocks(unrestored, preserve_rng_state=False)
    assert list(checkpointed.state_dict()) == list(plain.state_dict())  # the same names, the same checkpoints

    loss, grads = loss_and_grads(plain, loss_fn)
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed, loss_fn)
    torch.testing.assert_close(loss_ckpt, loss)
    assert grads_ckpt.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, msg=name)

    loss_other, grads_other = loss_and_grads(unrestored, loss_fn)
    torch.testing.assert_close(loss_other, loss)  # the forward pass is the same ...
    assert any(not torch.allclose(grads_other[n], g) for n, g in grads.items())  # ... the recompute is not


def count_block_passes(model: torch.nn.Module) -> list[int]:
    """A counter of the blocks' MLP calls, one per pass of a block, the recompute's included: a
    pre-hook on the MLP, since the recompute calls the block's forward past the block's own hooks
    and stops once it has every tensor the backward pass needs, before the MLP returns."""
    calls = [0]
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            m.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_blocks_run_twice_in_training_and_once_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward + backward in training runs each block twice; no_grad, evaluation mode and cached
    decoding steps run it once, without a checkpoint."""
    checkpoints = [0]

    def counted(*args, **kwargs):
        checkpoints[0] += 1
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(ac, "checkpoint", counted)
    plain, model = captioner(), captioner()
    n = block_count(model)
    checkpoint_blocks(model)
    plain_calls, calls = count_block_passes(plain), count_block_passes(model)

    captioner_loss(plain).backward()
    captioner_loss(model).backward()
    assert (plain_calls[0], calls[0], checkpoints[0]) == (n, 2 * n, n)  # forward, then each block again

    calls[0] = checkpoints[0] = 0
    with torch.no_grad():
        captioner_loss(model)  # training mode, no gradients
    model.eval()
    captioner_loss(model).backward()  # gradients, evaluation mode
    assert (calls[0], checkpoints[0]) == (2 * n, 0)

    model.train()
    context = model.encode(torch.randn(2, 3, 32, 32))
    checkpoints[0] = 0
    cache = model.decoder.new_cache(8)
    model.decoder(torch.ones(2, 1, dtype=torch.long), context, cache=cache)  # cached decoding steps, with gradients
    model.decoder(torch.ones(2, 1, dtype=torch.long), context, cache=cache)
    assert checkpoints[0] == 0
    assert checkpoint_blocks(model) == n and all(  # a second call wraps nothing twice
        not isinstance(b.forward.forward, _CheckpointedWhenTraining)
        for b in model.modules()
        if isinstance(b, TransformerBlock)
    )


def test_much_less_memory_is_kept_for_the_backward_pass() -> None:
    """The default small captioner at batch 64, 64 px: the bytes autograd keeps for the backward
    pass (weights excluded) fall below half (what is left: the blocks' inputs, the conv stem, the
    logits)."""
    bench = load_script("bench_memory")
    torch.manual_seed(0)
    model = bench.build_captioner("caption_small", 64, 24, 1000, []).train()
    images, ids = torch.randn(64, 3, 64, 64), torch.randint(3, 1000, (64, 24))
    plain = bench.measure(model, images, ids, "cpu", False)
    assert checkpoint_blocks(model) == 3
    checkpointed = bench.measure(model, images, ids, "cpu", False)
    assert plain["param_bytes"] == checkpointed["param_bytes"] == checkpointed["grad_bytes"]
    assert checkpointed["saved_for_backward_bytes"] < 0.5 * plain["saved_for_backward_bytes"], (plain, checkpointed)


def test_bench_memory_script_reports_both_on_a_tiny_model() -> None:
    tiny = ["model.encoder.dim=32", "model.encoder.num_heads=2", "model.encoder.stem=patch",
            "model.decoder.dim=32", "model.decoder.num_heads=2", "model.decoder.depth=2"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--image-size", "32", "--batch", "8", "--vocab", "50", "--set", *tiny],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(run.stdout)
    assert result["checkpointed_blocks"] == 4 and result["device"] == "cpu"
    assert "saved for backward" in result["measures"]
    plain, checkpointed = result["plain"], result["checkpointed"]
    assert plain["total_bytes"] == plain["saved_for_backward_bytes"] + plain["param_bytes"] + plain["grad_bytes"]
    assert 0 < checkpointed["saved_for_backward_bytes"] < plain["saved_for_backward_bytes"]
    assert result["ratio"] == round(checkpointed["total_bytes"] / plain["total_bytes"], 4) < 1


def test_the_top_level_key_drives_the_callback_and_fsdp() -> None:
    """``activation_checkpointing=true`` enables the callback for every preset and FSDP's own switch;
    the callback checkpoints in fit only, does nothing under FSDP, and runs after ``compile``, so
    the checkpointed function is the compiled forward."""
    for flag in (True, False):
        for preset in ("cpu", "gpu", "ddp", "ddp_cpu", "fsdp"):
            cfg = compose_train([f"trainer={preset}", f"activation_checkpointing={flag}", "paths.output_dir=/unused"])
            assert instantiate(cfg.callbacks.activation_checkpointing).enabled is flag
        policy = instantiate(cfg.trainer.strategy)._activation_checkpointing_kwargs.get("auto_wrap_policy")
        assert (policy._module_classes == {TransformerBlock, CrossAttentionBlock}) if flag else policy is None
    names = list(compose_train(["paths.output_dir=/unused"]).callbacks)
    assert names.index("compile") < names.index("activation_checkpointing")

    task = torch.nn.Module()
    task.model = captioner()
    plain = SimpleNamespace(strategy=None)
    fsdp = SimpleNamespace(strategy=instantiate(compose_train(["trainer=fsdp"]).trainer.strategy))
    CheckpointBlocks().setup(plain, task, "validate")  # type: ignore[arg-type]
    CheckpointBlocks().setup(fsdp, task, "fit")  # type: ignore[arg-type]
    CheckpointBlocks(enabled=False).setup(plain, task, "fit")  # type: ignore[arg-type]
    blocks = [m for m in task.model.modules() if isinstance(m, TransformerBlock)]
    assert not any(isinstance(b.forward, _CheckpointedWhenTraining) for b in blocks)

    callbacks = compose_train(["compile=true", "activation_checkpointing=true", "paths.output_dir=/unused"]).callbacks
    for callback in (instantiate(callbacks.compile), instantiate(callbacks.activation_checkpointing)):
        callback.setup(plain, task, "fit")  # type: ignore[arg-type]
    assert all(isinstance(b.forward, _CheckpointedWhenTraining) for b in blocks)
    assert all(isinstance(b.forward.forward, _CompiledUnlessCached) for b in blocks)


def test_eval_with_the_fsdp_preset_resolves_without_the_key() -> None:
    from hydra import compose, initialize_config_dir

    from mmtx.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="eval", overrides=["trainer=fsdp", "ckpt=x"])
    assert OmegaConf.to_container(cfg.trainer.strategy, resolve=True)["activation_checkpointing"] is False


@pytest.mark.parametrize("value", ["yes", "1", "null"])
def test_a_value_that_is_not_a_bool_is_named(value: str) -> None:
    cfg = compose_train([f"activation_checkpointing={value}", "paths.output_dir=/unused"])
    HydraConfig.instance().set_config(cfg)
    try:
        with pytest.raises(ConfigError) as info:
            check_train_config(cfg)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
    shown = {"yes": "'yes'", "1": "1", "null": "None"}[value]
    assert str(info.value).splitlines()[1:] == [f"  activation_checkpointing={shown} must be true or false"]


def train(cli, tiny: list[str], root: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli.run(
        "mmtx-train",
        *tiny,
        "logger=none",
        "trainer.max_steps=3",
        "trainer.limit_val_batches=1",
        "activation_checkpointing=true",
        f"hydra.run.dir={root}",
        *extra,
        cwd=root.parent,
    )


def assert_trained(run: subprocess.CompletedProcess, root: Path, blocks: int = 2) -> None:
    assert f"activation checkpointing: {blocks} transformer blocks" in run.stdout + run.stderr
    last = read_checkpoint(root / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 3
    names = [n for n in last["state_dict"] if n.startswith("model.")]
    assert names and all("checkpoint" not in n for n in names)


@pytest.mark.slow
def test_mmtx_train_with_activation_checkpointing_compile_and_frozen_blocks(
    cli, tiny: list[str], tmp_path: Path
) -> None:
    """Checkpointed, compiled, and frozen or not (`task.freeze`): every kind of call to the one
    compiled code compiles, none falls back to the eager code at the compiler's recompile limit."""
    run = train(cli, tiny, tmp_path / "run", "compile=true", "model.encoder.depth=2",
                "task.freeze.modules=[model.encoder]", "task.freeze.train_last_blocks=1")  # fmt: skip
    assert "torch.compile: 3 transformer blocks" in run.stdout + run.stderr
    assert "recompile_limit" not in run.stdout + run.stderr
    assert_trained(run, tmp_path / "run", blocks=3)


@pytest.mark.slow
def test_mmtx_train_with_activation_checkpointing_under_ddp(cli, tiny: list[str], tmp_path: Path) -> None:
    run = train(cli, tiny, tmp_path / "run", "trainer=ddp_cpu")
    assert "MEMBER: 2/2" in run.stdout + run.stderr  # two processes
    assert_trained(run, tmp_path / "run")
