"""mmtx-train's command line: overrides composed into the config, multirun sweeps, ``--help``, and
bad settings that fail with one line naming them before a run starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.core.hydra_config import HydraConfig

from mmtx.checkpoint import read_checkpoint
from tests.helpers import compose_train


def test_compose_config(tiny: list[str], tmp_path: Path) -> None:
    cfg = compose_train([*tiny, f"paths.output_dir={tmp_path}", "seed=3"])
    HydraConfig.instance().set_config(cfg)
    try:
        assert cfg.run_name == "caption-shapes"  # ${hydra:runtime.choices.*}
        assert cfg.seed == 3 and cfg.model.encoder.dim == 32 and cfg.model.decoder.context_dim == 32
        assert cfg.callbacks.model_checkpoint.dirpath == f"{tmp_path}/checkpoints"
        assert cfg.trainer.default_root_dir == str(tmp_path)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]


@pytest.mark.slow
def test_multirun_sweeps_seeds_into_numbered_jobs(cli, tiny: list[str], tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cli.run(
        "mmtx-train",
        "-m",
        "seed=0,1",
        *tiny,
        "trainer.max_steps=2",
        "trainer.limit_val_batches=0",
        "logger=none",
        "data.batch_size=16",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    weights = []
    for job, seed in ((0, 0), (1, 1)):
        ckpt = read_checkpoint(sweep / str(job) / "checkpoints" / "last.ckpt")
        assert ckpt["global_step"] == 2
        assert f"seed={seed}" in (sweep / str(job) / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((sweep / str(job) / "metrics.json").read_text())["steps"] == 2
        weights.append(ckpt["state_dict"])
    assert any(not weights[0][k].equal(weights[1][k]) for k in weights[0])  # the seed reached the weights
    assert (sweep / "multirun.yaml").is_file()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_wrong_overrides_fail_with_a_message_naming_them(cli, tiny: list[str], tmp_path: Path) -> None:
    common = [*tiny, "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    bad_key, bad_value = cli.run_many(
        ("mmtx-train", *common, "model.encoder.nonsense=1"),
        ("mmtx-train", *common, "model.encoder.pos_embed=alibi"),
        cwd=tmp_path,
        check=False,
    )
    assert bad_key.returncode != 0, cli.describe(bad_key)
    assert "model.encoder.nonsense" in bad_key.stderr + bad_key.stdout
    assert bad_value.returncode != 0, cli.describe(bad_value)
    message = bad_value.stderr + bad_value.stdout
    assert "alibi" in message and "pos_embed" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_help_lists_the_config_groups(cli, tmp_path: Path) -> None:
    result = cli.run("mmtx-train", "--help", cwd=tmp_path)
    groups = result.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    options = {
        line.split(":", 1)[0].strip(): {o.strip() for o in line.split(":", 1)[1].split(",")}
        for line in groups.splitlines() if ":" in line and not line.startswith("Compose")
    }  # fmt: skip
    for group in ("task", "model", "data", "trainer", "logger", "callbacks", "experiment", "debug"):
        assert group in options, groups
    assert {"caption"} <= options["task"]
    assert {"shapes", "coco", "karpathy"} <= options["data"]
    assert {"cpu", "gpu"} <= options["trainer"]
    assert {"wandb", "csv", "none"} <= options["logger"]
    assert "seed: 0" in result.stdout  # and the config, with its defaults


APPS = ("train", "eval", "caption", "vqa", "export", "shards", "demo")
# an app run in a fresh interpreter; then which of the heavy libraries it imported
LOADED = r"""
import runpy, sys
try:
    runpy.run_module("mmtx.cli." + sys.argv.pop(1), run_name="__main__")
except SystemExit as e:
    if isinstance(e.code, str):  # sys.exit("mmtx: ...") prints its message and exits 1
        print(e.code, file=sys.stderr)
    print("exit", 1 if isinstance(e.code, str) else e.code or 0, file=sys.stderr)
print(*sorted(m for m in ("torch", "lightning", "torchvision") if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [("--help",), ("data.batchsize=8",)], ids=["help", "misspelt key"])
def test_help_and_a_misspelt_key_answer_before_torch_loads(argv: tuple[str, ...], tmp_path: Path) -> None:
    """Each app reads its command line before importing its command: ``--help`` and an unknown key
    answer without waiting for torch and Lightning to import."""
    for app in APPS if argv == ("--help",) else ("train",):
        run = subprocess.run([sys.executable, "-c", LOADED, app, *argv], capture_output=True, text=True, cwd=tmp_path)
        assert run.stdout.splitlines()[-1:] == [""], f"mmtx-{app} {' '.join(argv)}: {run.stdout[-300:]}{run.stderr}"
        if argv == ("--help",):
            assert f"mmtx-{app}" in run.stdout and run.stderr.endswith("exit 0\n"), run.stderr
        else:
            assert "mmtx: data.batchsize is not a key of data (did you mean data.batch_size?)" in run.stderr
            assert "exit 1" in run.stderr


def test_the_commands_resolve_mmtx_resolvers_without_the_command_line() -> None:
    """Code that runs a command (`mmtx.commands`) on a config composed elsewhere resolves its
    ``${mmtx.*}`` interpolations, in an interpreter that never imported `mmtx.cli`."""
    code = (
        "import sys; import mmtx.commands.train; from omegaconf import OmegaConf\n"
        "cfg = OmegaConf.create({'workers': '${mmtx.loader_workers:2}', 'precision': '${mmtx.precision:cuda}'})\n"
        "print(cfg.workers, cfg.precision, 'mmtx.cli.common' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    workers, precision, cli_loaded = run.stdout.split()
    assert 0 <= int(workers) <= 2 and precision == "bf16-mixed" and cli_loaded == "False"


def test_too_few_examples_for_one_batch_fail_naming_the_batch_size(cli, tiny: list[str], tmp_path: Path) -> None:
    """A training split smaller than one batch would train 0 steps and exit 0: it must fail instead."""
    result = cli.run(
        "mmtx-train",
        *tiny,
        "logger=none",
        "data.num_train=6",
        "data.batch_size=64",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, cli.describe(result)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mmtx: data.batch_size=64: the training split has ") and "or less" in last, last
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_preset_on_a_cpu_machine_fails_before_touching_the_data(cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = cli.run(
        "mmtx-train",
        "trainer=gpu",
        f"paths.data_dir={data}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, cli.describe(result)
    assert "trainer.accelerator=gpu: this machine has no GPU" in result.stderr and "trainer=cpu" in result.stderr
    assert not data.exists()
