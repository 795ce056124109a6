"""What every mmtx task writes into its checkpoints besides weights: enough to rebuild itself."""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import FSDPStrategy

from mmtx.checkpoint_keys import DATA_KEY, TASK_KEY
from mmtx.config_error import ArgumentError
from mmtx.data.tokenizer import Tokenizer
from mmtx.generation import GenerationConfig
from mmtx.tasks.epoch_end_resume import begin_epoch_afresh, start_next_epoch
from mmtx.tasks.freezing import Freeze, apply_freeze, describe, eval_frozen
from mmtx.tasks.lora import Lora, add_adapters, count_trainable
from mmtx.tasks.optim import build_optimizer

log = logging.getLogger(__name__)


class Task(L.LightningModule):
    """Base LightningModule: checkpoints name the task class and the data it was trained on.

    ``data_config`` (the resolved ``data`` config of the run, plain dict) lets ``mmtx-eval`` and
    ``mmtx-caption`` evaluate or preprocess exactly as in training without being told again.
    """

    # checkpoint name prefix -> this task's, for init_from (e.g. a pretrained vision stream);
    # read-only, so that no task can change another's
    init_renames: Mapping[str, str] = MappingProxyType({})
    metrics: dict[str, float]  # the last validation's metrics (every task keeps them)
    generation: GenerationConfig | None = None  # decoding settings, for tasks that write text
    samples: list[dict[str, Any]] | None = None  # validation examples for loggers to show

    # constructor arguments that come from the training data (e.g. an answer vocabulary): made by
    # ``from_data`` for a new run, read back from the checkpoint when resuming
    data_arguments: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        tokenizer: str | None = None,
        data_config: dict | None = None,
        freeze: dict | None = None,
        lora: dict | None = None,
    ) -> None:
        """``tokenizer``: the tokenizer as JSON text (checkpoints carry it in the hyperparameters);
        ``freeze``: the weights that do not train (:class:`mmtx.tasks.freezing.Freeze`) and
        ``lora``: low-rank adapters (:class:`mmtx.tasks.lora.Lora`), both applied by
        :meth:`choose_trainable` once the subclass has built its model."""
        super().__init__()
        # every subclass's arguments too (Lightning walks the __init__s); the data config goes to DATA_KEY
        self.save_hyperparameters(logger=False, ignore=["data_config"])
        self.data_config = data_config
        self.tokenizer = Tokenizer.from_str(tokenizer) if tokenizer is not None else None
        self.val_outputs: list[dict[str, Any]] = []  # what the validation steps collect
        self.metrics = {}
        self._step_sums: torch.Tensor | None = None  # (loss sum, items) of the optimizer step so far
        self.freezing = Freeze.from_config(freeze)
        self.lora = Lora.from_config(lora)
        self._trainable_notes: list[str] = []  # logged when training starts
        self._begin_epoch_afresh = False  # resumed from a checkpoint written at an epoch's end

    def choose_trainable(self) -> None:
        """Freeze what ``task.freeze`` names, then add ``task.lora``'s adapters (each task calls
        this once its model is built), so a bad name is refused when the task is built, before
        any data is read."""
        if self.freezing:
            self._trainable_notes.append(describe(*apply_freeze(self, self.freezing), self.freezing))
        if not (self.freezing or self.lora):
            return
        adapted = add_adapters(self, self.lora, only_frozen=bool(self.freezing)) if self.lora else []
        trainable, total = count_trainable(self)
        if self.lora:
            self._trainable_notes.append(
                f"task.lora: rank {self.lora.rank} adapters on {len(adapted)} linear layers; "
                f"{trainable:,} of {total:,} parameters train"
            )
        if not trainable:
            raise ArgumentError(
                "{freeze.modules} freezes every parameter: nothing would train (task.lora.rank=N adds adapters that would)",
                **{"freeze.modules": list(self.freezing.modules)},
            )
        eval_frozen(self)

    def train(self, mode: bool = True) -> Task:
        """Train mode for all but the frozen modules, which stay in eval mode (:func:`eval_frozen`)."""
        super().train(mode)
        if mode and (self.freezing or self.lora):
            eval_frozen(self)
        return self

    def on_fit_start(self) -> None:
        for note in self._trainable_notes:
            log.info(note)
        if self._trainable_notes:
            # Lightning warns of modules in eval mode: the frozen ones are, on purpose (a filter for
            # the rest of this training process, which is what runs the fit)
            warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")

    def check_text_length(self, tower: str, max_length: int) -> None:
        """The text tower ``model.<tower>`` must have positions for the data's ``max_length`` tokens."""
        wanted = (self.data_config or {}).get("max_length")
        if isinstance(wanted, int) and max_length < wanted:
            raise ArgumentError(
                f"{{model.{tower}.max_length}} is shorter than {{data_config.max_length}} (allowed: >= {wanted})",
                **{f"model.{tower}.max_length": max_length, "data_config.max_length": wanted},
            )

    @classmethod
    def stand_in_data_arguments(cls) -> dict[str, Any]:
        """Placeholder ``data_arguments`` that let the task be built before any data is read
        (the start-up check builds it on the meta device)."""
        return {}

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

    def on_validation_epoch_start(self) -> None:
        self.val_outputs = []

    def configure_optimizers(self) -> dict:
        """AdamW and the warm-up/cosine schedule over the run's budget (:mod:`mmtx.tasks.optim`),
        from the settings every task takes: ``lr``, ``weight_decay``, ``betas``, ``warmup_ratio``,
        ``min_lr_ratio``."""
        h = self.hparams
        return build_optimizer(
            self.model,
            self.trainer,
            lr=h.lr,
            weight_decay=h.weight_decay,
            betas=h.betas,
            warmup_ratio=h.warmup_ratio,
            min_lr_ratio=h.min_lr_ratio,
        )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, with the two cases it refuses done here. FSDP: the norm must be
        taken over every process's shards, which only the FSDP module's own ``clip_grad_norm_``
        does (Lightning issue #19235). A fused optimizer under bf16 autocast: Lightning refuses
        any fused optimizer in case fp16's gradient scaler has not unscaled the gradients
        (#21435); bf16 has no scaler, so they are clipped as Lightning would clip them."""
        by_norm = (gradient_clip_algorithm or "norm") == "norm"
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and by_norm and isinstance(self.trainer.strategy, FSDPStrategy):
            self.trainer.model.clip_grad_norm_(gradient_clip_val)
        elif (
            gradient_clip_val
            and optimizer.defaults.get("fused")
            and isinstance(plugin, MixedPrecision)
            and plugin.scaler is None
        ):
            clip = torch.nn.utils.clip_grad_norm_ if by_norm else torch.nn.utils.clip_grad_value_
            clip(self.parameters(), gradient_clip_val)
        else:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log the step's learning rate as ``train/lr``. (Lightning's ``LearningRateMonitor``
        refuses to run without a logger, as with ``logger=none``, and names one key per
        parameter group.) A tensor on the host: Lightning would copy a number to the device,
        and that copy waits for the step to finish."""
        lr = torch.tensor(float(self.optimizers().param_groups[0]["lr"]))
        self.log("train/lr", lr, batch_size=len(batch["images"]))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[TASK_KEY] = f"{type(self).__module__}.{type(self).__qualname__}"
        if self.data_config is not None:
            checkpoint[DATA_KEY] = self.data_config
        # every process's generators, in rank order: only rank 0 writes the file, and the processes'
        # generators part ways (dropout draws as many numbers as each one's batch shape takes)
        checkpoint[RNG_KEY] = all_rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._begin_epoch_afresh = start_next_epoch(checkpoint)  # before Lightning restores its loops from it
        # applied when training resumes, not now: the sanity-check validation draws from them too
        states = checkpoint.get(RNG_KEY)
        if isinstance(states, dict):  # one process's, as older checkpoints hold them
            states = [states]
        # a process the interrupted run did not have keeps its seeded generators
        self._resumed_rng = states[self.global_rank] if states and self.global_rank < len(states) else None

    def on_train_start(self) -> None:
        if self._begin_epoch_afresh:
            begin_epoch_afresh(self.trainer)
            self._begin_epoch_afresh = False

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """First batch after a resume: the random state the interrupted run had at that point."""
        if getattr(self, "_resumed_rng", None) is not None:
            set_rng_state(self._resumed_rng)
            self._resumed_rng = None

    def summed_loss(self, total: torch.Tensor, count: torch.Tensor | int) -> torch.Tensor:
        """What ``training_step`` returns for a loss that is a mean over items (a caption's tokens,
        VQA's questions): ``total``, the batch's loss summed over its ``count`` items.

        The update is then that of the mean over every item of the optimizer step, exactly,
        however the items fall among processes and accumulated micro-batches:
        :meth:`on_before_optimizer_step` divides the gradients by the step's item count, the one
        number of the step that is known only once its last micro-batch is in (each batch's mean,
        weighted as it comes, would need the later micro-batches' counts). ``train/loss``, the
        step's mean, is logged there. The sum is finite when the mean is (`NonFiniteLoss` reads
        it), and gradient clipping comes after the division.
        """
        if not isinstance(count, torch.Tensor):  # filled on the device: a copy there would wait for the step
            count = torch.full((), count, device=total.device)
        sums = torch.stack([total.detach().float(), count.float()])
        self._step_sums = sums if self._step_sums is None else self._step_sums + sums
        return total

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients of :meth:`summed_loss`'s sums become those of the step's mean. Lightning
        calls this once the step's micro-batches are accumulated (and DDP/FSDP have reduced them;
        fp16 gradients unscaled), before clipping and the update; one all-reduce per step."""
        if self._step_sums is None:  # the task's loss is not a summed_loss
            return
        total, count = self.trainer.strategy.reduce(self._step_sums, reduce_op="sum")
        self._step_sums = None
        # Lightning divided each micro-batch's loss by k; DDP and FSDP average over the processes
        scale = self.trainer.accumulate_grad_batches * self.trainer.world_size / count
        grads: dict[torch.device, list[torch.Tensor]] = {}  # FSDP's CPU offload keeps gradients on the CPU
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # none where NonFiniteLoss dropped the step
                    grads.setdefault(p.grad.device, []).append(p.grad)
        for device, same in grads.items():  # one multi-tensor kernel, not one launch per parameter
            torch._foreach_mul_(same, scale if device == scale.device else scale.to(device))
        self.log("train/loss", total / count)  # the same on every process; the progress bar reads it


RNG_KEY = "mmtx_rng"


def rng_state() -> dict[str, Any]:
    """The random generators' states (torch CPU and accelerator, Python, NumPy) as plain data."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def all_rng_states() -> list[dict[str, Any]]:
    """:func:`rng_state` of every process of the run, in rank order (a collective: every process
    calls it, as every process builds the checkpoint that rank 0 writes)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [rng_state()]
    states: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, rng_state())
    return states


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
