"""``mmtx-eval``: evaluate a checkpoint; print a table, write metrics and predictions as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mmtx.checkpoint import CheckpointError, load_task
from mmtx.commands.common import DATA_FILE_KEYS, generation_override, to_container
from mmtx.config_check import ConfigError, check_eval_config
from mmtx.data.shards import shard_paths
from mmtx.hardware import loader_workers
from mmtx.metrics.table import format_metrics_table


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Score ``cfg.ckpt`` on ``cfg.split``; returns the metrics (also written to ``cfg.output``)."""
    check_eval_config(cfg)
    task = load_task(cfg.ckpt)
    data_cfg = to_container(cfg.data) if cfg.get("data") else task.data_config
    if not data_cfg or "_target_" not in data_cfg:  # e.g. an export directory: it records the image size only
        raise CheckpointError(f"{cfg.ckpt} records no data set: choose one, e.g. data=coco data.val.annotations=...")
    if not cfg.get("data"):
        recorded_files_exist(data_cfg, cfg.split, cfg.ckpt)
        if "root" in data_cfg:  # a drawn data set: read where it was drawn, never drawn again there
            data_cfg["draw"] = False
        data_cfg["num_workers"] = loader_workers(4)  # the machine's choice, as the data presets make it, not the file's
    trained = (task.data_config or {}).get("image_size")
    data_cfg["image_size"] = cfg.image_size or trained or data_cfg.get("image_size")
    if task.generation is not None:  # tasks that write text: captioning, generative VQA
        task.generation = generation_override(task.generation, cfg.generation)

    try:
        datamodule = instantiate(data_cfg, tokenizer=task.tokenizer, val_split=cfg.split)
    except InstantiationException as e:
        if cfg.get("data"):
            raise
        root: BaseException = e  # the import or constructor error under Hydra's wrappers
        while root.__cause__ is not None:
            root = root.__cause__
        raise ConfigError(
            f"{cfg.ckpt} records a data module this mmtx cannot build ({data_cfg['_target_']}: "
            f"{type(root).__name__}: {root}); "
            f"give the data to evaluate on, e.g. data=coco data.{cfg.split}.annotations=FILE data.{cfg.split}.images=DIR"
        ) from e
    datamodule.prepare_data()
    if not datamodule.has_split(cfg.split):
        raise ConfigError(f"split={cfg.split}: the data config has no files for it (set data.{cfg.split}.*)")
    trainer = instantiate(cfg.trainer, logger=False, callbacks=[])
    # the loader is made by the trainer's processes, each reading its share of the split
    trainer.validate(task, datamodule=datamodule, verbose=False)

    if trainer.is_global_zero:
        metrics = dict(task.metrics)
        predictions = task.predictions()
        for path in (cfg.output, cfg.predictions):  # e.g. output=results/metrics.json: not lost at the end
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output).write_text(json.dumps(metrics, indent=2))
        print(f"{cfg.ckpt} on {cfg.split} ({len(datamodule.datasets[cfg.split])} examples)")
        print(format_metrics_table(metrics))
        print(f"metrics: {cfg.output}")
        if predictions is not None:
            Path(cfg.predictions).write_text(json.dumps(predictions))
            print(f"predictions: {cfg.predictions}")
        return metrics
    return {}


def recorded_files_exist(data: dict, split: str, ckpt: str) -> None:
    """The files of ``split`` that the checkpoint's data config names must be here, and so must
    the folder of a drawn data set (``root``)."""
    split_files = data.get(split) if isinstance(data.get(split), dict) else {}
    missing = [
        f"{key}={value}"
        for key, value in {**data, **split_files}.items()
        if key in DATA_FILE_KEYS and value and not all(p.exists() for p in _paths(key, value))
    ]
    if isinstance(data.get("root"), str) and not Path(data["root"]).is_dir():
        missing.append(f"root={data['root']}")
    if missing:
        raise ConfigError(
            f"{ckpt} was trained on data files that are not here ({', '.join(missing)}); give the data to "
            f"evaluate on, e.g. data=coco data.{split}.annotations=FILE data.{split}.images=DIR"
        )


def _paths(key: str, value: str | list[str]) -> list[Path]:
    """The files a data key names: shards may be a brace pattern or a list."""
    return shard_paths(value) if key == "shards" else [Path(value)]


def run(cfg: DictConfig) -> None:
    """Evaluate ``ckpt`` on its data (or the config's): print the table, write the JSON files."""
    OmegaConf.resolve(cfg)
    evaluate(cfg)
