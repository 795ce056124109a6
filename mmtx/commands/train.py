"""``mmtx-train``: train a model from a Hydra config (``mmtx-train --help`` lists the groups)."""

from __future__ import annotations

import functools
import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import get_class, instantiate
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig

from mmtx.callbacks import Preempted
from mmtx.checkpoint import check_resume, init_from, read_checkpoint
from mmtx.commands.common import absolute_data_paths, callbacks_for, instantiate_dict, log, to_container
from mmtx.config_check import build_task, check_train_config
from mmtx.data.tokenizer import Tokenizer, spellings
from mmtx.metrics.table import format_metrics_table
from mmtx.tasks.optim import budget_note


def train(cfg: DictConfig) -> dict[str, float]:
    """Run one training job; returns the final validation metrics."""
    check_train_config(cfg)  # impossible settings fail here, before any data is made or read
    note = budget_note(cfg.trainer)  # whether the run's budget makes it reproducible
    if note:
        log.log(*note)
    absolute_data_paths(cfg.data)  # the checkpoint records where the data is, from anywhere
    L.seed_everything(cfg.seed, workers=True)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    # mmtx reads each checkpoint once, here (a resumed one memory-mapped: its settings, not its
    # state); Lightning reads the resumed one again in fit, to restore it
    resumed = read_checkpoint(cfg.ckpt_path, mmap=True) if cfg.ckpt_path else None
    if resumed:
        check_resume(resumed, cfg.ckpt_path, cfg.task._target_, to_container(cfg.model), to_container(cfg.task))
    if resumed and cfg.init_from:  # its weights are in the resumed checkpoint, which Lightning restores
        log.info("init_from=%s not read: the run resumes from ckpt_path=%s", cfg.init_from, cfg.ckpt_path)
    start = read_checkpoint(cfg.init_from) if cfg.init_from and not resumed else None
    datamodule = instantiate(cfg.data, tokenizer=run_tokenizer(cfg, resumed, start))
    datamodule.prepare_data()
    datamodule.setup("fit")  # train and val read and screened, the tokenizer learned, before the model
    tokenizer = datamodule.tokenizer
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:  # one writer per machine
        # written whole, then renamed: nodes sharing the run directory never leave a mixed file
        os.replace(tokenizer.save(out / f".tokenizer-{secrets.token_hex(8)}.json"), out / "tokenizer.json")
    log.info("tokenizer: %d tokens, saved to %s", tokenizer.vocab_size, out / "tokenizer.json")

    task_cls = get_class(cfg.task._target_)
    if resumed:  # the answer vocabulary (VQA) the run started with
        data_arguments = {k: resumed["hyper_parameters"][k] for k in task_cls.data_arguments}
    else:
        data_arguments = task_cls.from_data(datamodule, **to_container(cfg.task))
    task = build_task(cfg, tokenizer, data_arguments)
    if start:
        init_from(task, start, cfg.init_from, task.init_renames, new_tokens=_new_tokens(start, tokenizer))
    del resumed, start  # Lightning restores the resumed checkpoint itself, in fit

    loggers = instantiate_dict(cfg.get("logger"))
    for logger in loggers:
        logger.log_hyperparams(to_container(cfg))
    validated_at: list[int] = []  # global steps of the validations in fit (not the sanity check)
    track = L.pytorch.callbacks.LambdaCallback(
        on_validation_end=lambda tr, _: tr.sanity_checking or validated_at.append(tr.global_step)
    )
    callbacks = [*callbacks_for(cfg.trainer, cfg.get("callbacks")), track]
    trainer = instantiate(cfg.trainer, logger=loggers or False, callbacks=callbacks)
    # Lightning reads the resumed checkpoint again: as plain data too
    trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    validates = trainer.limit_val_batches != 0  # trainer.limit_val_batches=0: no validation at all
    if validates and (not task.metrics or validated_at[-1:] != [trainer.global_step]):
        # stopped between validations (max_steps, max_time): score the final weights
        trainer.validate(task, datamodule=datamodule, verbose=False)

    metrics = dict(task.metrics)
    if trainer.is_global_zero:
        summary: dict[str, Any] = {
            "metrics": metrics,
            "steps": trainer.global_step,
            "checkpoints": str(out / "checkpoints"),
        }
        if validates:
            name, baseline = task.baseline(datamodule)
            print(f"\nvalidation after {trainer.global_step} steps; baseline: {name}")
            print(format_metrics_table(metrics, baseline, baseline_name="baseline"))
            summary["baseline"] = {"name": name, **baseline}
            for logger in loggers:
                logger.log_metrics({f"baseline/{k}": v for k, v in baseline.items()}, step=trainer.global_step)
        else:
            print(f"\n{trainer.global_step} steps, not validated (trainer.limit_val_batches=0)")
        (out / "metrics.json").write_text(json.dumps(summary, indent=2))
        print(f"run directory: {out}")
    if any(isinstance(lg, WandbLogger) for lg in loggers):
        import wandb

        wandb.finish()
    return metrics


def run_tokenizer(
    cfg: DictConfig, resumed: dict | None, start: dict | None
) -> Tokenizer | Callable[[list[str]], Tokenizer]:
    """The run's tokenizer: a resumed run's own; else ``tokenizer.path``; else the ``init_from``
    checkpoint's (its embeddings index it), with ``tokenizer.add_words`` a function that adds the
    training text's new words to it; else how the data module learns one from its training text."""
    if resumed:
        return Tokenizer.from_str(resumed["hyper_parameters"]["tokenizer"])
    if cfg.tokenizer.path:
        return Tokenizer.from_file(cfg.tokenizer.path)
    if start and "tokenizer" in start.get("hyper_parameters", {}):
        tokenizer = Tokenizer.from_str(start["hyper_parameters"]["tokenizer"])
        if not cfg.tokenizer.add_words:
            log.info("tokenizer: the one of init_from=%s", cfg.init_from)
            return tokenizer
        log.info(
            "tokenizer: the one of init_from=%s, with the training text's words it spells in pieces", cfg.init_from
        )
        return functools.partial(tokenizer.with_words, min_frequency=cfg.tokenizer.min_frequency)
    return functools.partial(
        Tokenizer.train,
        vocab_size=cfg.tokenizer.vocab_size,
        kind=cfg.tokenizer.kind,
        min_frequency=cfg.tokenizer.min_frequency,
    )


def _new_tokens(start: dict, tokenizer: Tokenizer) -> dict[int, list[int]]:
    """The ids the run's tokenizer adds to the ``init_from`` checkpoint's, with their old spellings."""
    if "tokenizer" not in start.get("hyper_parameters", {}):
        return {}
    added = spellings(Tokenizer.from_str(start["hyper_parameters"]["tokenizer"]), tokenizer)
    if added:
        log.info("tokenizer: %d words added to the checkpoint's vocabulary", len(added))
    return added


def run(cfg: DictConfig) -> float | None:
    """Train (`train`) and return the monitored metric; a run stopped by a signal exits as that
    signal would, its state saved."""
    try:
        metrics = train(cfg)
    except Preempted as e:  # exit as a process ended by that signal would, state saved
        print(f"mmtx: {e}", file=sys.stderr)
        sys.exit(128 + e.signum)
    return metrics.get(cfg.monitor.metric.removeprefix("val/")) if metrics else None
