"""What every mmtx task writes into its checkpoints besides weights: enough to rebuild itself."""

from __future__ import annotations

from typing import Any

import lightning as L

from mmtx.checkpoint import DATA_KEY, TASK_KEY
from mmtx.generation import GenerationConfig


class Task(L.LightningModule):
    """Base LightningModule: checkpoints name the task class and the data it was trained on.

    ``data_config`` (the resolved ``data`` config of the run, plain dict) lets ``mmtx-eval`` and
    ``mmtx-caption`` evaluate or preprocess exactly as in training without being told again.
    """

    data_config: dict | None = None
    # checkpoint name prefix -> this task's, for init_from (e.g. a pretrained vision stream)
    init_renames: dict[str, str] = {}
    metrics: dict[str, float]  # the last validation's metrics (every task keeps them)
    generation: GenerationConfig | None = None  # decoding settings, for tasks that write text
    samples: list[dict[str, Any]] | None = None  # validation examples for loggers to show

    # constructor arguments that come from the training data (e.g. an answer vocabulary): made by
    # ``from_data`` for a new run, read back from the checkpoint when resuming
    data_arguments: tuple[str, ...] = ()

    @classmethod
    def from_data(cls, datamodule: L.LightningDataModule, **task_config: Any) -> dict[str, Any]:
        """The ``data_arguments`` for a new run, computed from the training data."""
        return {}

    def predictions(self) -> list[dict[str, Any]] | None:
        """The last evaluation's outputs in the official results format (None if there is none)."""
        return None

    def baseline(self, datamodule: L.LightningDataModule) -> tuple[str, dict[str, float]]:
        """What the metrics would be without learning: a name and the same metric keys."""
        raise NotImplementedError

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[TASK_KEY] = f"{type(self).__module__}.{type(self).__qualname__}"
        if self.data_config is not None:
            checkpoint[DATA_KEY] = self.data_config
