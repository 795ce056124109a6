"""task.freeze: frozen weights get no gradient, no optimizer state and stay exactly as loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmtx.checkpoint import load_task, read_checkpoint
from mmtx.data.tokenizer import Tokenizer
from mmtx.tasks.caption import CaptionTask
from mmtx.tasks.optim import param_groups
from tests.bad_inputs import tiny_model_config

TOKENIZER = Tokenizer.train(["a red square", "a blue circle"], vocab_size=40).to_str()


def task(freeze: dict | None, depth: int = 2) -> CaptionTask:
    torch.manual_seed(0)
    model = tiny_model_config(f"model.encoder.depth={depth}", "model.decoder.depth=2")
    return CaptionTask(model=model, tokenizer=TOKENIZER, freeze=freeze)


def trainable(t: CaptionTask) -> set[str]:
    return {n for n, p in t.named_parameters() if p.requires_grad}


def test_nothing_frozen_by_default() -> None:
    t = task(None)
    assert trainable(t) == {n for n, _ in t.named_parameters()}


def test_a_frozen_encoder_with_its_last_block_training() -> None:
    t = task({"modules": ["model.encoder"], "train_last_blocks": 1})
    names = trainable(t)
    encoder = {n for n in names if n.startswith("model.encoder.")}
    # the last block and the final norm train; the stem, positions, class token and first block do not
    opened = ("model.encoder.blocks.1.", "model.encoder.norm.")
    assert encoder == {n for n, _ in t.named_parameters() if n.startswith(opened)}
    assert any(n.startswith("model.encoder.norm.") for n in encoder)
    assert {n for n, _ in t.named_parameters() if n.startswith("model.decoder.")} <= names


def test_train_patterns_open_parts_of_a_frozen_module() -> None:
    t = task({"modules": ["model.decoder"], "train": ["*.cross_attn"]})
    decoder = {n for n in trainable(t) if n.startswith("model.decoder.")}
    assert decoder and all(".cross_attn." in n for n in decoder)
    assert len({n.split(".cross_attn.")[0] for n in decoder}) == 2  # in both blocks


def test_a_tied_weight_trains_when_any_of_its_layers_does() -> None:
    """The decoder's output layer is its token embedding: freezing the body leaves it training."""
    t = task({"modules": ["model.decoder.body"]})
    embedding = t.model.decoder.body.token_embed.weight
    assert t.model.decoder.lm_head.weight is embedding and embedding.requires_grad
    assert not t.model.decoder.body.blocks[0].attn.qkv.weight.requires_grad


def test_frozen_modules_stay_in_eval_mode_and_the_rest_trains() -> None:
    t = task({"modules": ["model.encoder"], "train_last_blocks": 1}).train()
    encoder = t.model.encoder
    assert not encoder.patch_embed.training and not encoder.blocks[0].training
    assert encoder.blocks[1].training and t.model.decoder.training and t.training
    t.eval().train()  # as after a validation
    assert not encoder.blocks[0].training and encoder.blocks[1].training


def test_the_optimizer_sees_only_trainable_parameters() -> None:
    t = task({"modules": ["model.encoder"]})
    grouped = {id(p) for g in param_groups(t.model, 0.05) for p in g["params"]}
    assert grouped == {id(p) for p in t.model.parameters() if p.requires_grad}
    assert not any(id(p) in grouped for p in t.model.encoder.parameters())


def test_frozen_weights_get_no_gradient() -> None:
    t = task({"modules": ["model.encoder"]})
    images, ids = torch.randn(2, 3, 32, 32), torch.randint(4, 40, (2, 6))
    t.model.loss(images, ids, t.tokenizer.pad_id).backward()
    assert all(p.grad is None for p in t.model.encoder.parameters())
    assert all(p.grad is not None for p in t.model.decoder.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    ("freeze", "message"),
    [
        ({"modules": ["model.encodr"]}, "freeze.modules: 'model.encodr' names no module"),
        ({"modules": ["model.encoder"], "train": ["*.lm_head"]}, "freeze.train: '*.lm_head' names no module under"),
        ({"modules": ["model.encoder"], "train_last_blocks": 3}, "model.encoder has 2 blocks"),
        ({"modules": ["model.encoder.patch_embed"], "train_last_blocks": 1}, "no frozen module holds"),
        ({"modules": ["model"]}, r"freeze.modules=\['model'\] freezes every parameter"),
        ({"modules": ["model.encoder"], "train_last_blocks": -1}, "train_last_blocks=-1 must be an integer"),
        ({"train_last_blocks": 1}, "need freeze.modules"),
        ({"modules": ["model.encoder"], "layers": 2}, "freeze.layers is not a key"),
        ({"modules": ["x" * 500]}, "1-200 characters"),
        ({"modules": 3}, "freeze.modules=3 must be a list"),
        (["model.encoder"], "must be a mapping"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(freeze: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + r".*" + message.replace("(", r"\(").replace("*", r"\*")):
        task(freeze)


@pytest.mark.slow
def test_mmtx_train_fine_tunes_around_a_frozen_encoder(cli, tiny: list[str], tmp_path: Path) -> None:
    """From a trained run, two processes with activation checkpointing: the encoder (weights and
    buffers) ends bit-identical, the decoder moves, the optimizer keeps state for the decoder only,
    and the start-up check refuses a bad name before any data is drawn."""
    common = [*tiny, "trainer.max_epochs=null", "logger=csv", "trainer.limit_val_batches=0"]
    started, bad = cli.run_many(
        ("mmtx-train", *common, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'first'}"),
        ("mmtx-train", *tiny, "task.freeze.modules=[model.encodr]", f"paths.data_dir={tmp_path / 'none'}",
         f"hydra.run.dir={tmp_path / 'bad'}"),
        cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert started.returncode == 0, cli.describe(started)
    first = read_checkpoint(tmp_path / "first" / "checkpoints" / "last.ckpt")
    run = cli.run(
        "mmtx-train", *common, "trainer.max_steps=3", "trainer=ddp_cpu", "activation_checkpointing=true",
        f"init_from={tmp_path / 'first' / 'checkpoints' / 'last.ckpt'}", "task.freeze.modules=[model.encoder]",
        f"hydra.run.dir={tmp_path / 'frozen'}", cwd=tmp_path,
    )  # fmt: skip
    assert "MEMBER: 2/2" in run.stdout + run.stderr
    assert "parameters frozen (model.encoder)" in run.stdout + run.stderr
    assert "in eval mode at the start of training" not in run.stdout + run.stderr  # Lightning's warning
    last = read_checkpoint(tmp_path / "frozen" / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 3
    encoder = [k for k in first["state_dict"] if k.startswith("model.encoder.")]
    assert encoder and all(torch.equal(first["state_dict"][k], last["state_dict"][k]) for k in encoder)
    moved = [k for k in first["state_dict"] if k.startswith("model.decoder.") and not torch.equal(first["state_dict"][k], last["state_dict"][k])]  # fmt: skip
    assert moved
    encoder_params = len(list(load_task(tmp_path / "first" / "checkpoints" / "last.ckpt").model.encoder.parameters()))
    states = [len(c["optimizer_states"][0]["state"]) for c in (first, last)]
    assert states[1] == states[0] - encoder_params and encoder_params > 0

    assert bad.returncode != 0
    assert "task.freeze.modules: 'model.encodr' names no module" in bad.stderr
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_compiled_blocks_train_and_validate_beside_frozen_ones(cli, tiny: list[str], tmp_path: Path) -> None:
    """Frozen blocks are another kind of call to the one compiled code: all compile, none falls
    back to the eager code at the compiler's recompile limit."""
    run = cli.run(
        "mmtx-train", *tiny, "trainer.max_epochs=null", "trainer.max_steps=2", "compile=true",
        "model.encoder.depth=2", "task.freeze.modules=[model.encoder]", "task.freeze.train_last_blocks=1",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert "torch.compile: 3 transformer blocks" in run.stdout + run.stderr
    assert "recompile_limit" not in run.stdout + run.stderr
    assert read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Lightning's FSDP runs on GPUs only")
def test_fsdp_keeps_frozen_and_adapted_weights_as_loaded(tiny: list[str], tmp_path: Path) -> None:
    """FSDP (one GPU, each block its own unit, activation checkpointing): a frozen encoder ends
    bit-identical with no optimizer state; with LoRA only adapters move, and the run resumes."""
    from tests.helpers import train_in_process

    common = [*tiny, "trainer=fsdp", "trainer.devices=1", "trainer.strategy.activation_checkpointing=true",
              "trainer.max_epochs=null", "trainer.limit_val_batches=0", "logger=none"]  # fmt: skip
    last = "checkpoints/last.ckpt"
    train_in_process([*common, "trainer.max_steps=2", f"paths.output_dir={tmp_path / 'first'}"])
    first = read_checkpoint(tmp_path / "first" / last)
    train_in_process([*common, "trainer.max_steps=3", f"init_from={tmp_path / 'first' / last}",
                      "task.freeze.modules=[model.encoder]", f"paths.output_dir={tmp_path / 'frozen'}"])  # fmt: skip
    frozen = read_checkpoint(tmp_path / "frozen" / last)
    encoder = [k for k in first["state_dict"] if k.startswith("model.encoder.")]
    assert encoder and all(torch.equal(first["state_dict"][k], frozen["state_dict"][k]) for k in encoder)
    assert any(not torch.equal(first["state_dict"][k], frozen["state_dict"][k]) for k in first["state_dict"])
    trainable = sum(1 for k in first["state_dict"] if not k.startswith("model.encoder."))
    assert 0 < len(frozen["optimizer_states"][0]["state"]) <= trainable

    adapted = [*common, "task.lora.rank=4", f"init_from={tmp_path / 'first' / last}",
               f"paths.output_dir={tmp_path / 'lora'}"]  # fmt: skip
    train_in_process([*adapted, "trainer.max_steps=2"])
    before = read_checkpoint(tmp_path / "lora" / last)
    train_in_process([*adapted, "trainer.max_steps=4", f"ckpt_path={tmp_path / 'lora' / last}"])
    after = read_checkpoint(tmp_path / "lora" / last)
    assert after["global_step"] == 4
    a, b = before["state_dict"], after["state_dict"]
    base = [k for k in a if ".base_layer." in k]
    assert base and all(torch.equal(a[k], b[k]) for k in base)
    assert any(".lora_B." in k and not torch.equal(a[k], b[k]) for k in a)
