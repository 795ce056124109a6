"""The ``${mmtx.*}`` resolvers mmtx's configs use, registered with OmegaConf on import.

Each imports what it calls only when a config is resolved, so that reading a command line (which
imports this module) loads neither torch nor Lightning.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf


def _precision(accelerator: str) -> str:
    from mmtx.hardware import training_precision

    return training_precision(accelerator)


def _loader_workers(most: int = 4) -> int:
    from mmtx.hardware import loader_workers

    return loader_workers(most)


def _time_budget(budget: str | None, max_steps: Any, max_epochs: Any) -> str | None:
    from mmtx.tasks.optim import time_budget

    return time_budget(budget, max_steps, max_epochs)


# ${mmtx.precision:${.accelerator}} in trainer presets: bf16 autocast on GPUs and where the CPU has
# it natively, else fp32
OmegaConf.register_new_resolver("mmtx.precision", _precision, replace=True)
# ${mmtx.loader_workers:4} in data configs: up to 4 loader workers, one core left to training
OmegaConf.register_new_resolver("mmtx.loader_workers", _loader_workers, replace=True)
# ${mmtx.time_budget:'DD:HH:MM:SS',${.max_steps},${.max_epochs}} in the CPU preset: its deadline only for
# a run given no step or epoch budget, which stays reproducible
OmegaConf.register_new_resolver("mmtx.time_budget", _time_budget, replace=True)
