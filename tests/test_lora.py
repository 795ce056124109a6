"""task.lora: low-rank adapters train, the adapted weights do not; merged, they compute the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmtx.checkpoint import init_from, load_task, read_checkpoint
from mmtx.data.tokenizer import Tokenizer
from mmtx.export import export_task, load_exported
from mmtx.tasks.caption import CaptionTask
from mmtx.tasks.lora import merge_adapters, plain_state
from tests.bad_inputs import tiny_model_config
from tests.conftest import TINY_DATA
from tests.helpers import draw_data, write_gpt2, write_vit

pytest.importorskip("peft", reason="task.lora uses peft (pip install '.[lora]')")

TOKENIZER = Tokenizer.train(["a red square", "a blue circle"], vocab_size=40).to_str()


def task(lora: dict | None, freeze: dict | None = None) -> CaptionTask:
    torch.manual_seed(0)
    return CaptionTask(tiny_model_config("model.decoder.depth=2"), TOKENIZER, freeze=freeze, lora=lora)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 32, 32, generator=gen), torch.randint(7, 40, (2, 7), generator=gen)


def perturb_adapters(t: CaptionTask) -> None:
    """Adapters as after training: B no longer zero."""
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in t.named_parameters():
            if ".lora_" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)


def test_adapters_start_at_the_loaded_model_and_only_the_adapted_weights_freeze() -> None:
    plain, adapted = task(None), task({"rank": 4})
    images, ids = batch()
    with torch.no_grad():
        assert torch.equal(plain.model(images, ids), adapted.model(images, ids))  # B = 0
    trains = {n for n, p in adapted.named_parameters() if p.requires_grad}
    frozen = {n for n, p in adapted.named_parameters() if not p.requires_grad}
    assert frozen and all(".base_layer." in n for n in frozen)
    assert any(n.endswith("attn.qkv.base_layer.weight") for n in frozen)
    assert any(".cross_attn.kv.lora_A." in n for n in trains) and any(".mlp.fc2.lora_B." in n for n in trains)
    assert "model.decoder.body.token_embed.weight" in trains and any(".norm1." in n for n in trains)


def test_with_the_rest_frozen_only_adapters_and_the_named_exceptions_train() -> None:
    t = task({"rank": 2, "layers": ["model.encoder.*.attn.qkv"]}, {"modules": ["model"], "train": ["*.cross_attn"]})
    trains = {n for n, p in t.named_parameters() if p.requires_grad}
    assert trains and all(".lora_" in n or ".cross_attn." in n for n in trains)
    assert {n for n in trains if ".lora_" in n and "encoder" in n}
    assert not any(".lora_" in n for n in trains if "decoder" in n)  # only the encoder's qkv is targeted


def test_merged_adapters_compute_the_same_under_the_plain_names(tmp_path: Path) -> None:
    t = task({"rank": 4, "alpha": 8})
    perturb_adapters(t)
    images, ids = batch()
    with torch.no_grad():
        adapted = t.model(images, ids)
    folded = plain_state(t.state_dict(), {"rank": 4, "alpha": 8})
    model, _, _ = load_exported(export_task(t, tmp_path / "export"))  # merges t in place
    assert not any("lora" in n or "base_layer" in n for n in t.state_dict())
    assert set(t.state_dict()) == set(task(None).state_dict())
    with torch.no_grad():
        assert (model(images, ids) - adapted).abs().max() < 1e-5
        assert (t.model(images, ids) - adapted).abs().max() < 1e-5
    merged = t.state_dict()
    assert all((folded[k] - merged[k]).abs().max() < 1e-6 for k in merged)
    assert merge_adapters(t) == 0


def test_init_from_goes_from_and_to_lora_runs() -> None:
    plain, adapted = task(None), task({"rank": 4})
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.1)
    images, ids = batch()
    init_from(adapted, {"state_dict": plain.state_dict()}, "plain.ckpt")  # under the adapted layers
    with torch.no_grad():
        assert (adapted.model(images, ids) - plain.model(images, ids)).abs().max() < 1e-6
    perturb_adapters(adapted)
    with torch.no_grad():
        expected = adapted.model(images, ids)
    ckpt = {"state_dict": adapted.state_dict(), "hyper_parameters": {"lora": {"rank": 4}}}
    again = task(None)
    init_from(again, ckpt, "lora.ckpt")  # the adapters folded in
    with torch.no_grad():
        assert (again.model(images, ids) - expected).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"rank": -1}, "lora.rank=-1 must be an integer >= 0"),
        ({"rank": 4, "alpha": 0}, "lora.alpha=0 must be a number > 0"),
        ({"rank": 4, "dropout": 1.5}, r"lora.dropout=1.5 must be in \[0, 1\)"),
        ({"rank": 4, "layers": ["*.nothing"]}, "lora.layers=\\['\\*.nothing'\\] names no linear layer"),
        ({"rank": 4, "layers": []}, "lora.layers must be a list"),
        ({"rank": 4, "modules": 2}, "lora.modules is not a key"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(lora: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        task(lora)


@pytest.mark.slow
def test_a_lora_run_from_pretrained_files_trains_adapters_resumes_and_exports(
    cli, tmp_path: Path, repo_on_path
) -> None:
    """ViT and GPT-2 directories (random weights, as the parity tests write them), everything but
    the adapters frozen: only adapters move; stopped after 2 steps and resumed, the run ends as
    the one that was not stopped, bit for bit; the export
    (adapters merged) computes what the LoRA checkpoint computes."""
    transformers = pytest.importorskip("transformers", reason="transformers writes the pretrained files")
    vit_dir, gpt2_dir = tmp_path / "vit", tmp_path / "gpt2"
    write_vit(vit_dir, transformers)
    write_gpt2(gpt2_dir, transformers, ["a red square", "a big blue circle left of a small green box"])
    common = [
        *TINY_DATA, "data.batch_size=32", f"paths.data_dir={tmp_path / 'data'}", "trainer.enable_progress_bar=false",
        "trainer.precision=32-true", "data.max_length=16", "model=caption_pretrained", f"model.encoder.pretrained={vit_dir}", "model.encoder.dim=32",
        f"model.decoder.pretrained={gpt2_dir}", f"tokenizer.path={gpt2_dir}",
        "task.lora.rank=4", "task.lora.dropout=0.1", "task.freeze.modules=[model]", "trainer.max_epochs=null",
        "trainer.limit_val_batches=0", "logger=none", "task.lr=1e-2",
    ]  # fmt: skip
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    stop = (
        "+callbacks.fault._target_=tests.helpers.SignalAtStep",
        "+callbacks.fault.step=2",
        "+callbacks.fault.signal=SIGTERM",
    )  # a preemption after step 2: last.ckpt saved, exit 143
    draw_data(common)  # once, before both runs start
    run, stopped = cli.run_many(
        ("mmtx-train", *common, "trainer.max_steps=4", f"hydra.run.dir={straight}"),
        ("mmtx-train", *common, "trainer.max_steps=4", f"hydra.run.dir={halves}", *stop),
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, cli.describe(run)
    assert "task.lora: rank 4 adapters on" in run.stdout + run.stderr
    assert stopped.returncode == 143, cli.describe(stopped)
    first = read_checkpoint(halves / "checkpoints" / "last.ckpt")
    assert 0 < first["global_step"] < 4  # saved within a step of the notice
    first = first["state_dict"]
    # resumed, the adapted model validates too (after last.ckpt is written: the weights compared are the same)
    cli.run("mmtx-train", *common, "trainer.max_steps=4", f"hydra.run.dir={halves}", "trainer.limit_val_batches=1",
            f"ckpt_path={halves / 'checkpoints' / 'last.ckpt'}", cwd=tmp_path)  # fmt: skip
    a = read_checkpoint(straight / "checkpoints" / "last.ckpt")["state_dict"]
    b = read_checkpoint(halves / "checkpoints" / "last.ckpt")["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed != straight"
    moved = {k for k in a if not torch.equal(a[k], first[k])}
    assert moved and all(".lora_" in k for k in moved)
    assert any(".lora_B." in k for k in moved)

    cli.run("mmtx-export", f"ckpt={straight / 'checkpoints' / 'last.ckpt'}", f"out={tmp_path / 'export'}", cwd=tmp_path)
    model, tokenizer, _ = load_exported(tmp_path / "export")
    trained = load_task(straight / "checkpoints" / "last.ckpt")
    images = torch.randn(2, 3, 32, 32)
    ids, _ = tokenizer.encode_batch(["a red square", "a blue circle"], 8)
    with torch.no_grad():
        assert (model(images, ids) - trained.model(images, ids)).abs().max() < 1e-5


def test_with_freeze_only_frozen_layers_get_adapters_and_trained_ones_train_whole() -> None:
    """freeze.train=[*.cross_attn] with the default layers: the new cross-attention trains whole."""
    t = task({"rank": 2}, {"modules": ["model"], "train": ["*.cross_attn"]})
    names = {n for n, _ in t.named_parameters()}
    assert not any(".cross_attn." in n and (".lora_" in n or "base_layer" in n) for n in names)
    assert all(p.requires_grad for n, p in t.named_parameters() if ".cross_attn." in n)
    assert any(".attn.qkv.lora_A." in n for n in names)


def test_a_tied_output_layer_and_malformed_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="model.decoder.lm_head shares its weight"):
        task({"rank": 2, "layers": ["*lm_head"]})
    t = task({"rank": 2, "layers": "*.attn.qkv"})  # one pattern, not its characters
    assert {n.split(".attn.qkv.")[0] for n, _ in t.named_parameters() if ".lora_" in n}
    assert not any(".mlp." in n and ".lora_" in n for n, _ in t.named_parameters())
    for bad, message in (([2], "must be a mapping"), ({"rank": 2, "layers": 3}, "lora.layers=3 must be a list")):
        with pytest.raises(ValueError, match=message):
            task(bad)


def test_resuming_with_other_frozen_or_adapted_weights_is_refused(tmp_path: Path) -> None:
    from mmtx.checkpoint import TASK_KEY, CheckpointError, check_resume

    t = task({"rank": 2}, {"modules": ["model.encoder"]})
    ckpt = {
        TASK_KEY: "mmtx.tasks.caption.CaptionTask",
        "hyper_parameters": dict(t.hparams),
        "state_dict": t.state_dict(),
    }
    target, model = "mmtx.tasks.caption.CaptionTask", t.hparams["model"]
    check_resume(ckpt, "run.ckpt", target, model, {"freeze": {"modules": ["model.encoder"]}, "lora": {"rank": 2}})
    for changed, key in (({"freeze": {"modules": ["model.decoder"]}, "lora": {"rank": 2}}, "task.freeze"),
                         ({"freeze": {"modules": ["model.encoder"]}, "lora": {"rank": 4}}, "task.lora")):  # fmt: skip
        with pytest.raises(CheckpointError, match=f"{key} differs from the checkpoint's"):
            check_resume(ckpt, "run.ckpt", target, model, changed)
