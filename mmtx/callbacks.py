"""Callbacks: samples for the loggers, what a long run does about bad steps and preemption, and
the console's progress bar and model summary."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichModelSummary, RichProgressBar, Timer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count


class LogCaptionSamples(L.Callback):
    """After each validation, log a W&B table of images with predicted and reference captions,
    and, for tasks that draw them (``attention_grids``: the captioner), where each word was read
    from (`mmtx.attention_maps`).

    Reads the samples the task keeps (``pl_module.samples``: image, prediction, references);
    does nothing for tasks that keep none or for loggers other than W&B.
    """

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        samples = pl_module.samples
        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if trainer.sanity_checking or not samples or not loggers or not trainer.is_global_zero:
            return
        import wandb

        rows = [[wandb.Image(s["image"].numpy()), s["prediction"], "\n".join(s["references"])] for s in samples]
        columns = ["image", "prediction", "references"]
        draw = getattr(pl_module, "attention_grids", None)
        if draw is not None:
            grids = draw(torch.stack([s["image"] for s in samples]).permute(0, 3, 1, 2))  # (B, H, W, 3) -> (B, 3, H, W)
            rows = [row + [wandb.Image(grid)] for row, grid in zip(rows, grids)]
            columns.append("attention")
        for logger in loggers:
            logger.log_table(key="val/samples", columns=columns, data=rows, step=trainer.global_step)


def images_in_batch(batch: dict[str, Any]) -> int:
    """The images a training batch holds: the ``batch_size_fn`` of Lightning's ``ThroughputMonitor``,
    which logs ``train/device/samples_per_sec`` (docs/gpu.md shows the overrides that add it)."""
    return len(batch["images"])


class TrainingTime(L.Callback):
    """Log ``val/minutes``, the training time so far, with every validation: quality against
    time, the figure that matters when runs are given a time budget (``trainer.max_time``).

    Counted as Lightning's ``Timer`` counts ``max_time`` (the fit, validation included, the time
    before a resume added) when the run has one; else from the start of this fit.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
            seconds = timer.time_elapsed() if timer is not None else time.monotonic() - self._start
            pl_module.log("val/minutes", seconds / 60, sync_dist=False, rank_zero_only=True)


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss (the weights were left as they were)."""


class NonFiniteLoss(L.Callback):
    """What to do when the loss is NaN or infinite: ``stop`` the run, or ``skip`` the update.

    ``stop`` raises before the backward pass, so the weights and every checkpoint already
    written stay as they were (none is written from the bad step). ``skip`` throws the step's
    gradients away (with gradient accumulation, the whole accumulated step) and goes on,
    counting the skipped steps. In data-parallel runs every process takes the same decision.
    """

    def __init__(self, action: str = "stop") -> None:
        if action not in ("stop", "skip"):
            raise ValueError(f"callbacks.nonfinite_loss.action={action!r}: expected 'stop' or 'skip'")
        self.action = action
        self.skipped = 0
        self._discard = False

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if trainer.strategy.reduce_boolean_decision(bool(torch.isfinite(loss).all()), all=True):
            return
        if self.action == "skip":
            self._discard = True
            return
        saved = [
            path
            for cb in trainer.checkpoint_callbacks
            for path in (getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", ""))
            if path and os.path.exists(path)
        ]
        raise NonFiniteLossError(
            f"non-finite loss ({loss.detach().float().item()}) at step {trainer.global_step}, epoch "
            f"{trainer.current_epoch}; the weights were not updated. Last checkpoint: "
            f"{max(saved, key=os.path.getmtime) if saved else 'none saved yet'}. Lower the learning rate or "
            "check the data; callbacks.nonfinite_loss.action=skip skips such steps instead."
        )

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._discard:
            optimizer.zero_grad(set_to_none=True)  # parameters without gradients are not updated
            self._discard = False
            self.skipped += 1
            rank_zero_warn(f"step {trainer.global_step}: non-finite loss, update skipped ({self.skipped} so far)")
            pl_module.log("train/skipped_steps", float(self.skipped), rank_zero_only=True)


class Preempted(Exception):
    """The run was asked to stop by a signal; its state was saved to ``path`` first."""

    def __init__(self, signum: int, step: int, path: str) -> None:
        self.signum, self.step, self.path = signum, step, path
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} at step {step}; saved {path} (resume with ckpt_path={path})")


class Preemption(L.Callback):
    """On SIGTERM or SIGUSR1 (a scheduler's notice before it kills a job), save and stop.

    The signal handler only takes note; at the end of the current training step every process
    agrees to stop, ``path`` (normally ``last.ckpt``) is written with the full training state and
    :class:`Preempted` is raised, so the job exits within one step of the notice. Resuming from
    ``path`` continues exactly where it stopped.
    """

    def __init__(self, path: str, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")) -> None:
        unknown = [s for s in signals if not isinstance(getattr(signal, s, None), signal.Signals)]
        if unknown:
            raise ValueError(f"callbacks.preemption.signals: unknown signal(s) {unknown}")
        self.path, self.signals = path, tuple(signals)
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._launcher: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Lightning's own handlers are installed (they would only stop at the epoch's end)
        if threading.current_thread() is not threading.main_thread():
            return
        self.received, self._launcher = None, trainer.strategy.launcher
        for name in self.signals:
            sig = getattr(signal, name)
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        if self.received is None and self._launcher is not None and hasattr(self._launcher, "kill"):
            self._launcher.kill(signum)  # processes this one started (Lightning's DDP launcher)
        self.received = signum

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.world_size == 1:  # no device round trip: the host need not wait for the step
            signum = self.received or 0
        else:
            # the highest signal any process noted: all stop at this step with one exit status,
            # however the notice reached them (a job's status, e.g. srun's, is its tasks' highest)
            noted = torch.tensor(self.received or 0, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(noted, reduce_op="max"))
        if not signum:
            return
        trainer.save_checkpoint(self.path)
        raise Preempted(signum, trainer.global_step, self.path)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


class BudgetProgressBar(RichProgressBar):
    """Lightning's rich progress bar, counting down the run's budget: beside the metrics, the
    optimizer steps done of ``max_steps`` and the time left of ``max_time``. Lightning's own
    counts epochs only and reads "Epoch 3/-2" in a run without an epoch budget
    (``max_epochs=-1``, as the CPU preset's time-budgeted runs have): there it reads "Epoch 3".

    The training metrics it shows (``shown``, those a run logs) are read here, at most every
    ``metrics_every`` seconds while training: reading a metric that lives on a GPU makes the host
    wait for the step that computes it, and Lightning reads those logged with ``prog_bar=True``
    after every batch, which would keep the host from preparing the next batch meanwhile. The
    tasks log their training metrics without it.
    """

    def __init__(self, *args: Any, shown: tuple[str, ...] = ("train/loss", "train/reward"),
                 metrics_every: float = 1.0, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.shown, self.metrics_every = tuple(shown), metrics_every
        self._metrics: dict[str, Any] | None = None
        self._metrics_read = 0.0

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is None or self.trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"  # padded as Lightning pads it

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        now = time.monotonic()
        if not trainer.training or self._metrics is None or now - self._metrics_read >= self.metrics_every:
            logged = trainer.callback_metrics
            shown = {k: float(logged[k]) for k in self.shown if k in logged}
            self._metrics, self._metrics_read = {**super().get_metrics(trainer, pl_module), **shown}, now
        items = dict(self._metrics)
        if trainer.max_steps > 0:
            items["step"] = f"{trainer.global_step}/{trainer.max_steps}"
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        left = timer.time_remaining() if timer is not None else None
        if left is not None:
            items["time left"] = str(timedelta(seconds=round(max(left, 0.0))))
        return items


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary, without a FLOPs column and total when it counted none.

    Lightning counts FLOPs by running the module on its ``example_input_array``; mmtx's tasks
    have none (their batches are dicts of images and token ids), so its summary would print a
    column of zeros and "Total FLOPs: 0".
    """

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            return RichModelSummary.summarize(
                summary_data,
                total_parameters,
                trainable_parameters,
                model_size,
                total_training_modes,
                total_flops,
                **summarize_kwargs,
            )
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            numeric = name.startswith("Params") or name.endswith("sizes")
            table.add_column(
                name,
                justify="right" if numeric else "left",
                style="dim" if not name.strip() else None,
                no_wrap=name == "Name",
            )
        for row in zip(*(values for _, values in columns)):
            table.add_row(*row)
        totals = Table.grid(expand=True)
        totals.add_column()
        for label, value in (
            ("Trainable params", get_human_readable_count(int(trainable_parameters))),
            ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
            ("Total params", get_human_readable_count(int(total_parameters))),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
        ):
            totals.add_row(f"[bold]{label}[/]: {value}")
        console = get_console()
        console.print(table)
        console.print(totals)
