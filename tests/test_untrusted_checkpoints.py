"""Checkpoints and exports a user is handed run no code: the configs they record are data.

Written as an attacker would write them: a checkpoint that ``torch.load(weights_only=True)``
accepts (dicts, strings, tensors) with a ``_target_`` anywhere in its model or data config.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mmtx import checkpoint as checkpoint_module
from mmtx.checkpoint import DATA_KEY, TASK_KEY, CheckpointError, load_task, read_checkpoint
from mmtx.export import ExportError, export_task, load_exported
from mmtx.stored_config import MODEL, StoredConfigError, check_stored_config
from tests.bad_inputs import tiny_model_config
from tests.conftest import TINY_DATA, TINY_MODEL
from tests.helpers import compose_train

CALLED: list[Any] = []


def canary(*args: Any, **kwargs: Any) -> None:
    """A callable an attacker's config names: the test fails if it ever runs."""
    CALLED.append((args, kwargs))


CANARY = f"{__name__}.canary"
# what a stored config might name: the standard library, torch, the canary, the allowed packages'
# own imports reached by attribute, and mmtx code that is not a model, a data module or a task
PAYLOADS = [
    CANARY, "os.system", "os.makedirs", "subprocess.Popen", "builtins.exec", "builtins.eval", "builtins.open",
    "pickle.loads", "shutil.rmtree", "pathlib.Path.write_text", "importlib.import_module", "functools.partial",
    "torch.load", "torch.save", "numpy.save",
    "mmtx.models.vit.torch.load", "mmtx.models.captioner.nn.Module", "mmtx.models.decoder.torch.save",
    "mmtx.data.base.L.LightningDataModule", "mmtx.data.annotations.atomic_write_json", "mmtx.data.base.Path",
    "mmtx.pretrained.vit.torch.load", "mmtx.pretrained.files.read_pretrained", "mmtx.tasks.base.torch.save",
    "mmtx.checkpoint.read_checkpoint", "mmtx.export.export", "mmtx.models", "mmtx.models.", "mmtx.models.vit.",
    "mmtx.models.vit.VisionEncoder.__init__", "mmtx.data.shards.write.write_shards", "mmtx.models.pretraining.OBJECTIVES",
]  # fmt: skip
HYDRA_OPTIONS = ["_args_", "_recursive_", "_convert_", "_partial_", "_set_"]


@pytest.fixture(autouse=True)
def _no_canary_calls():
    CALLED.clear()
    yield
    assert not CALLED, f"the canary was called: {CALLED}"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What mmtx-train writes into a checkpoint of the tiny captioner: task, hyper-parameters
    (the model config among them), the data config and the weights."""
    from omegaconf import OmegaConf

    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.caption import CaptionTask

    cfg = compose_train(
        [*TINY_MODEL, *TINY_DATA, f"paths.data_dir={tmp_path_factory.mktemp('data')}", "paths.output_dir=/unused"]
    )
    data = OmegaConf.to_container(cfg.data, resolve=True)
    tokenizer = Tokenizer.train(["a red square", "a blue circle"], vocab_size=40).to_str()
    task = CaptionTask(model=tiny_model_config(), tokenizer=tokenizer, data_config=data)
    return {TASK_KEY: "mmtx.tasks.caption.CaptionTask", "hyper_parameters": dict(task.hparams), DATA_KEY: data,
            "state_dict": task.state_dict(), "global_step": 3}  # fmt: skip


def _nodes(config: Any, path: tuple = ()) -> list[tuple]:
    """The path of every dict inside ``config`` (itself first)."""
    found = [path] if isinstance(config, dict) else []
    if isinstance(config, dict):
        for key, value in config.items():
            found += _nodes(value, (*path, key))
    return found


def _at(config: Any, path: tuple) -> Any:
    for key in path:
        config = config[key]
    return config


@st.composite
def poisoned(draw: st.DrawFn, ckpt: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``ckpt`` with one attack somewhere in its model config, other hyper-parameters, data config
    or task name; returns it and a word the refusal must name."""
    bad = copy.deepcopy({k: v for k, v in ckpt.items() if k != "state_dict"})
    bad["state_dict"] = ckpt["state_dict"]
    section = draw(st.sampled_from(["model", "hparams", "data", "task"]))
    if section == "task":
        bad[TASK_KEY] = draw(st.sampled_from(["mmtx.tasks.base.torch.load", "mmtx.tasks.caption.instantiate",
                                              "mmtx.tasks.base.L.LightningModule", "mmtx.tasks.optim.torch.optim.AdamW",
                                              "mmtx.tasks.caption.ImageCaptioner", f"mmtx.tasks.{CANARY}"]))  # fmt: skip
        return bad, TASK_KEY
    root = {"model": bad["hyper_parameters"]["model"], "hparams": bad["hyper_parameters"], "data": bad[DATA_KEY]}[
        section
    ]
    node = _at(root, draw(st.sampled_from(_nodes(root))))
    payload = draw(st.sampled_from(PAYLOADS))
    attack = draw(st.sampled_from(["replace target", "add node", "hydra option", "interpolation", "unknown key"]))
    if attack == "replace target" and "_target_" in node:
        node["_target_"] = payload
    elif attack == "hydra option":
        node[draw(st.sampled_from(HYDRA_OPTIONS))] = [payload] if draw(st.booleans()) else "all"
        if "_partial_" in node and section == "model" and "_target_" in node:
            node["_partial_"] = "yes"  # mmtx writes _partial_: true in model configs, never anything else
    elif attack == "interpolation":
        node[draw(st.sampled_from(sorted(node) or ["extra"]))] = draw(st.sampled_from(["${oc.env:HOME}", "a ${x} b"]))
    elif attack == "unknown key" and "_target_" in node:
        node["path"] = "/tmp/elsewhere"
    else:  # a new node that calls the payload with plain arguments
        node[draw(st.sampled_from([*sorted(node), "extra"]))] = {
            "_target_": payload,
            "name": "/tmp/pwned",
            "_args_": ["x"],
        }
    return bad, "hyper_parameters" if section in ("model", "hparams") else DATA_KEY


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_callable_in_a_checkpoints_configs_is_refused_in_one_line(
    data: st.DataObject, stored: dict[str, Any], tmp_path: Path
) -> None:
    bad, key = data.draw(poisoned(stored))
    path = tmp_path / "poisoned.ckpt"
    torch.save(bad, path)
    for load in (read_checkpoint, load_task):  # read_checkpoint: what ckpt_path= and init_from= read
        with pytest.raises(CheckpointError) as info:
            load(path)
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"{path}: {key}"), message
    assert not CALLED


def test_the_checkpoints_mmtx_writes_pass(stored: dict[str, Any], tmp_path: Path) -> None:
    """The check refuses attacks, not mmtx's own files: the same checkpoint intact loads."""
    torch.save(stored, tmp_path / "intact.ckpt")
    task = load_task(tmp_path / "intact.ckpt")
    assert task.model.encoder.dim == 32 and task.data_config == stored[DATA_KEY]


@pytest.mark.parametrize("preset", ["caption", "pretrain", "vqa", "vqa_generative"])
def test_every_tasks_model_and_data_configs_are_what_the_check_admits(preset: str, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    experiment = {"caption": [], "pretrain": ["experiment=pretrain_shapes"], "vqa": ["experiment=vqa_shapes"],
                  "vqa_generative": ["task=vqa_generative", "data=shapes_vqa"]}[preset]  # fmt: skip
    cfg = compose_train([*experiment, f"paths.data_dir={tmp_path}", "paths.output_dir=/unused"])
    check_stored_config(OmegaConf.to_container(cfg.model, resolve=True), "model", MODEL)
    from mmtx.stored_config import DATA

    check_stored_config(OmegaConf.to_container(cfg.data, resolve=True), "data", DATA)


@pytest.mark.parametrize("name", ["mmtx.models.vit.torch.load", "mmtx.models.vit.torch.nn.Module", "os.system",
                                  "mmtx.pretrained.vit.torch.load", "mmtx.data.base.L.LightningDataModule"])  # fmt: skip
def test_the_allowed_packages_imports_are_not_reachable_by_name(name: str) -> None:
    with pytest.raises(
        StoredConfigError, match="is not a class of mmtx.models or a loader|which this mmtx does not have"
    ):
        check_stored_config({"_target_": name}, "f: model", MODEL)


def test_a_moved_data_module_passes_but_its_arguments_are_still_checked() -> None:
    """A checkpoint's data module renamed since (mmtx-eval then asks for data=): nothing by that
    name can run, so it passes the read; what it holds is checked all the same."""
    from mmtx.stored_config import DATA, UnknownStoredClass

    moved = {"_target_": "mmtx.data.datamodule.CocoCaptions", "image_size": 32}
    check_stored_config(moved, "f: mmtx_data", DATA, unknown_ok=True)
    with pytest.raises(UnknownStoredClass):
        check_stored_config(moved, "f: mmtx_data", DATA)
    with pytest.raises(StoredConfigError, match=r"f: mmtx_data.val._target_: 'os.makedirs' is not a data module"):
        check_stored_config({**moved, "val": {"_target_": "os.makedirs"}}, "f: mmtx_data", DATA, unknown_ok=True)
    # reachable by walking attributes from an mmtx.data module: not unknown, refused
    with pytest.raises(StoredConfigError, match="is not a data module") as info:
        check_stored_config({"_target_": "mmtx.data.base.L.LightningDataModule"}, "f: mmtx_data", DATA, unknown_ok=True)
    assert not isinstance(info.value, UnknownStoredClass)


def test_an_export_cannot_name_the_allowed_packages_imports(tmp_path: Path) -> None:
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.caption import CaptionTask

    tokenizer = Tokenizer.train(["a red square"], vocab_size=40).to_str()
    out = export_task(CaptionTask(model=tiny_model_config(), tokenizer=tokenizer), tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    for where, value in [(("model", "encoder", "_target_"), CANARY), (("model", "_target_"), "mmtx.models.vit.torch.load"),
                         (("task",), "mmtx.tasks.base.torch.load"), (("generation", "x"), {"_target_": CANARY})]:  # fmt: skip
        bad = copy.deepcopy(config)
        _at(bad, where[:-1])[where[-1]] = value
        (out / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ExportError) as info:
            load_task(out) if where == ("task",) else load_exported(out)
        assert str(out / "config.json") in str(info.value) and "\n" not in str(info.value)


def test_settings_that_ask_for_huge_tensors_are_refused_before_allocating(
    stored: dict[str, Any], tmp_path: Path
) -> None:
    bad = copy.deepcopy({k: v for k, v in stored.items() if k != "state_dict"})
    bad["state_dict"] = stored["state_dict"]
    bad["hyper_parameters"]["model"]["decoder"]["max_length"] = 2**40  # a position table of petabytes
    torch.save(bad, tmp_path / "huge.ckpt")
    with pytest.raises(CheckpointError, match=r"does not match CaptionTask:[\s\S]*pos_embed"):
        load_task(tmp_path / "huge.ckpt")


def test_tensors_a_checkpoint_does_not_store_are_bounded(stored: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    """Built tables (rotary frequencies) are not in the state dict: their size is checked too."""
    rope = tiny_model_config("model.encoder.pos_embed=rope")
    from mmtx.tasks.caption import CaptionTask

    task = CaptionTask(model=rope, tokenizer=stored["hyper_parameters"]["tokenizer"])
    torch.save({**stored, "hyper_parameters": dict(task.hparams), "state_dict": task.state_dict()}, tmp_path / "r.ckpt")
    assert load_task(tmp_path / "r.ckpt") is not None
    monkeypatch.setattr(checkpoint_module, "MAX_UNSTORED_BYTES", 0)
    with pytest.raises(CheckpointError, match="of tensors that it does not store"):
        load_task(tmp_path / "r.ckpt")


# --- every command-line tool that reads a checkpoint -----------------------------------------


def test_no_command_line_tool_obeys_a_poisoned_checkpoint(cli, stored: dict[str, Any], tmp_path: Path) -> None:
    """A model config and a data config that would create a directory: every tool that reads a
    checkpoint (and mmtx-train's ckpt_path= and init_from=) refuses in one line, creating nothing."""
    marker = tmp_path / "pwned"
    paths = {}
    for name, section in [("model", "model"), ("data", "data")]:
        bad = copy.deepcopy({k: v for k, v in stored.items() if k != "state_dict"})
        bad["state_dict"] = stored["state_dict"]
        if section == "model":
            bad["hyper_parameters"]["model"]["encoder"] = {"_target_": "os.makedirs", "name": str(marker)}
        else:
            bad[DATA_KEY]["_target_"] = "os.makedirs"
            bad[DATA_KEY]["name"] = str(marker)
        paths[name] = tmp_path / f"{name}.ckpt"
        torch.save(bad, paths[name])
    image = tmp_path / "a.png"
    Image.new("RGB", (32, 32), "red").save(image)
    ckpt = paths["model"]
    commands = [
        ("mmtx-caption", f"ckpt={ckpt}", f"images=[{image}]"),
        ("mmtx-vqa", f"ckpt={ckpt}", f"image={image}", "question=what?"),
        ("mmtx-eval", f"ckpt={ckpt}"),
        ("mmtx-eval", f"ckpt={paths['data']}"),
        ("mmtx-export", f"ckpt={ckpt}", f"out={tmp_path / 'export'}"),
        ("mmtx-demo", f"ckpt={ckpt}", "port=0"),
        ("mmtx-train", *TINY_MODEL, *TINY_DATA, f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'resume'}"),
        ("mmtx-train", *TINY_MODEL, *TINY_DATA, f"init_from={ckpt}", f"hydra.run.dir={tmp_path / 'init'}"),
    ]
    for _, result in zip(commands, cli.run_many(*commands, cwd=tmp_path, check=False, timeout=240)):
        assert result.returncode == 1, cli.describe(result)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("mmtx: ") and "os.makedirs" in last and "Traceback" not in result.stderr, cli.describe(
            result
        )
    assert not marker.exists()


def test_sharded_fsdp_checkpoints_are_refused_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning writes sharded FSDP checkpoints as folders in place (no atomic rename) that
    ``ckpt_path=`` cannot resume: refused by the start-up check, before any data is read."""
    from hydra.core.hydra_config import HydraConfig

    from mmtx.config_check import ConfigError, check_train_config

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # as on a GPU machine
    try:
        for kind in ("sharded", "full"):
            cfg = compose_train(["trainer=fsdp", f"trainer.strategy.state_dict_type={kind}",
                                 f"paths.data_dir={tmp_path}", "paths.output_dir=/unused"])  # fmt: skip
            HydraConfig.instance().set_config(cfg)
            if kind == "full":
                check_train_config(cfg)
                continue
            with pytest.raises(
                ConfigError, match=r"trainer.strategy: state_dict_type='sharded' is not supported: use 'full'"
            ):
                check_train_config(cfg)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]


def test_configs_nested_past_pythons_recursion_are_refused_in_one_line(stored: dict[str, Any], tmp_path: Path) -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    bad = {**stored, "hyper_parameters": {**stored["hyper_parameters"], "lr": deep}}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # the attacker's pickler goes deeper than a reader's stack
    try:
        torch.save(bad, tmp_path / "deep.ckpt")
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        read_checkpoint(tmp_path / "deep.ckpt")


def test_eval_draws_no_data_set_where_a_checkpoint_says(stored: dict[str, Any], tmp_path: Path) -> None:
    """A checkpoint of a drawn data set records the folder it was drawn in: mmtx-eval reads it
    there, and does not draw scenes into a folder that is not there."""
    from mmtx.commands.eval import recorded_files_exist
    from mmtx.config_check import ConfigError

    elsewhere = tmp_path / "home" / "someone"
    data = {**stored[DATA_KEY], "root": str(elsewhere)}
    with pytest.raises(ConfigError, match=f"not here \\(root={elsewhere}\\)"):
        recorded_files_exist(data, "val", "x.ckpt")
    assert not elsewhere.exists()
    elsewhere.mkdir(parents=True)
    recorded_files_exist(data, "val", "x.ckpt")  # drawn here before: read


@pytest.mark.parametrize("value", ["hf://datasets/someone/corpus", "s3://bucket/data", "/run/checkpoints/../../../home/x",
                                   "/home/someone/thesis.pdf", 7])  # fmt: skip
def test_checkpoint_callbacks_may_name_only_their_own_checkpoint_files(
    stored: dict[str, Any], tmp_path: Path, value: Any
) -> None:
    """Lightning restores a ModelCheckpoint's recorded file names on resume and deletes the
    previous best as it saves the next (on any fsspec file system): only local .ckpt names pass."""
    state = {"monitor": None, "dirpath": "/run/checkpoints", "best_model_path": "", "last_model_path": "",
             "kth_best_model_path": "", "best_k_models": {}}  # fmt: skip
    for field in ("best_model_path", "best_k_models"):
        poisoned = {**state, field: {value: 1.0} if field == "best_k_models" else value}
        torch.save({**stored, "callbacks": {"ModelCheckpoint{'monitor': None}": poisoned}}, tmp_path / "cb.ckpt")
        with pytest.raises(CheckpointError, match=r"callbacks\[.*not a checkpoint file of its run"):
            read_checkpoint(tmp_path / "cb.ckpt")
    ours = {
        **state,
        "best_model_path": "/run/checkpoints/last.ckpt",
        "best_k_models": {"/run/checkpoints/best-1.ckpt": 0.5},
    }
    torch.save({**stored, "callbacks": {"ModelCheckpoint{'monitor': None}": ours}}, tmp_path / "ours.ckpt")
    read_checkpoint(tmp_path / "ours.ckpt")


def test_a_tokenizer_with_a_regular_expression_is_refused(stored: dict[str, Any], tmp_path: Path) -> None:
    """Oniguruma backtracks: a stored pattern such as (a+)+$ could take exponential time per text."""
    document = json.loads(stored["hyper_parameters"]["tokenizer"])
    document["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": "(a+)+$"},
        "behavior": "Isolated",
        "invert": False,
    }
    bad = {**stored, "hyper_parameters": {**stored["hyper_parameters"], "tokenizer": json.dumps(document)}}
    torch.save(bad, tmp_path / "regex.ckpt")
    with pytest.raises(
        CheckpointError, match=r"hyper_parameters.tokenizer: holds a regular expression \('\(a\+\)\+\$'\)"
    ):
        read_checkpoint(tmp_path / "regex.ckpt")


def test_an_export_asking_for_a_huge_model_is_refused_before_allocating(tmp_path: Path) -> None:
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.caption import CaptionTask

    tokenizer = Tokenizer.train(["a red square"], vocab_size=40).to_str()
    out = export_task(CaptionTask(model=tiny_model_config(), tokenizer=tokenizer), tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    config["model"]["encoder"]["depth"] = 64
    config["model"]["encoder"]["dim"] = 2**16  # 64 blocks of 2**16 x 2**16 products: terabytes
    config["model"]["encoder"]["num_heads"] = 2**10
    config["model"]["decoder"]["context_dim"] = 2**16
    (out / "config.json").write_text(json.dumps(config))
    for load in (load_exported, load_task):
        with pytest.raises(ExportError, match="does not match|has shape"):
            load(out)
    tokenizer_file = out / "tokenizer.json"
    document = json.loads(tokenizer_file.read_text())
    document["normalizer"] = {"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": ""}
    tokenizer_file.write_text(json.dumps(document))
    with pytest.raises(ExportError, match="holds a regular expression"):
        load_exported(out)


def test_a_drawn_data_set_is_read_but_never_drawn_where_a_checkpoint_says(tmp_path: Path) -> None:
    """mmtx-eval builds a checkpoint's recorded shapes data module with draw=false: it reads the
    set drawn at training time and draws nothing into the folder the file names."""
    from mmtx.data.synthetic import ShapesCaptions

    def module(root: Path, draw: bool, num_train: int = 8) -> ShapesCaptions:
        return ShapesCaptions(root=str(root), num_train=num_train, num_val=4, image_size=32, num_workers=0, draw=draw)

    with pytest.raises(FileNotFoundError, match="draws none where a checkpoint says"):
        module(tmp_path / "elsewhere", draw=False).prepare_data()
    assert not (tmp_path / "elsewhere").exists()
    module(tmp_path / "set", draw=True).prepare_data()  # drawn at training time
    module(tmp_path / "set", draw=False).prepare_data()  # read back
    with pytest.raises(FileNotFoundError, match="num_train=9999"):  # the same folder, other settings: not redrawn
        module(tmp_path / "set", draw=False, num_train=9999).prepare_data()
