"""Callbacks that show what the model does, beyond scalar metrics."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import WandbLogger


class LogCaptionSamples(L.Callback):
    """After each validation, log a W&B table of images with predicted and reference captions.

    Reads the samples the task keeps (``pl_module.samples``: image, prediction, references);
    does nothing for tasks that keep none or for loggers other than W&B.
    """

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        samples = pl_module.samples
        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if trainer.sanity_checking or not samples or not loggers or not trainer.is_global_zero:
            return
        import wandb

        rows = [
            [wandb.Image(s["image"].numpy()), s["prediction"], "\n".join(s["references"])]
            for s in samples
        ]
        for logger in loggers:
            logger.log_table(
                key="val/samples", columns=["image", "prediction", "references"], data=rows,
                step=trainer.global_step,
            )
