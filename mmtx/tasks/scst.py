"""Self-critical sequence training (SCST, Rennie et al. 2017): a captioner trained with
cross-entropy is fine-tuned on the CIDEr-D of its own sampled captions.

For each training image the captioner samples ``samples`` captions; each gets its CIDEr-D
against the image's references (idf from the training references, `CorpusCider`), and the
update is REINFORCE with a baseline: ``-(reward - baseline) * log p(caption)``. The baseline
is the reward of the image's greedy caption (``greedy``, Rennie et al.) or the mean reward of
the image's other samples (``mean``, Luo 2020: no extra decoding). Start it from a
cross-entropy run: ``task=caption_scst init_from=RUN/checkpoints/last.ckpt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mmtx.config_error import ArgumentError
from mmtx.generation import GenerationConfig, generate, never_generated
from mmtx.metrics.cider_reward import CorpusCider
from mmtx.models.decoder import CaptionDecoder
from mmtx.tasks.caption import CaptionTask

BASELINES = ("greedy", "mean")


@dataclass(frozen=True)
class Scst:
    """``task.scst``: captions sampled per image, the baseline, the sampling temperature."""

    samples: int = 5
    baseline: str = "mean"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ArgumentError("{scst.samples!r} must be an integer >= 1", **{"scst.samples": self.samples})
        if self.baseline not in BASELINES:
            raise ArgumentError(
                f"{{scst.baseline!r}} is not one of {', '.join(BASELINES)}", **{"scst.baseline": self.baseline}
            )
        if self.baseline == "mean" and self.samples < 2:
            raise ArgumentError(
                "{scst.samples} leaves no other samples for {scst.baseline} (use >= 2, or greedy)",
                **{"scst.samples": self.samples, "scst.baseline": self.baseline},
            )
        if not isinstance(self.temperature, int | float) or not self.temperature > 0:
            raise ArgumentError("{scst.temperature!r} must be > 0", **{"scst.temperature": self.temperature})


def until_eos(tokens: Tensor, eos_id: int) -> Tensor:
    """(N, L) True on each sequence's tokens up to and including its first [EOS]."""
    is_eos = (tokens == eos_id).long()
    return (is_eos.cumsum(1) - is_eos) == 0


def baseline_rewards(rewards: Tensor, samples: int, greedy: Tensor | None = None) -> Tensor:
    """The baseline (B * K,) of each sample's reward (B * K,), samples of an image adjacent:
    the image's greedy reward (B,) when given, else the mean of its other samples' rewards."""
    per_image = rewards.view(-1, samples)
    if greedy is not None:
        return greedy.repeat_interleave(samples)
    return ((per_image.sum(1, keepdim=True) - per_image) / (samples - 1)).flatten()


def sample_log_probs(
    decoder: CaptionDecoder,
    context: Tensor,
    sampled: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    temperature: float,
) -> Tensor:
    """Each token's log-probability (N, L) under the distribution ``generate`` sampled it from
    (the ids it never emits excluded, logits divided by ``temperature``), teacher-forced in one
    pass over ``[BOS] + sampled`` with gradients; 0 after each row's first [EOS] (padding).
    ``context`` (N, S, D) is each row's image."""
    inputs = torch.cat([sampled.new_full((len(sampled), 1), bos_id), sampled[:, :-1]], 1)  # [BOS] w1 .. w(L-1)
    logits = decoder(inputs, context).float() / temperature  # (N, L, V)
    banned = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    banned[never_generated(bos_id, eos_id, pad_id)] = True
    logits = logits.masked_fill(banned, -float("inf"))
    logp = -F.cross_entropy(logits.flatten(0, 1), sampled.flatten(), reduction="none").view(sampled.shape)
    return logp.masked_fill(~until_eos(sampled, eos_id), 0.0)  # the padding after EOS: banned, -inf


class SelfCriticalTask(CaptionTask):
    """:class:`CaptionTask` trained on the CIDEr-D reward of its samples (validation unchanged).

    Args:
        scst: :class:`Scst` fields.
        *args, **kwargs: as :class:`CaptionTask` (``generation`` also bounds the samples' length).
    """

    def __init__(self, *args: Any, scst: dict | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.hparams.get("word_weights"):  # a cross-entropy setting: the reward has no words to weigh
            raise ArgumentError("{word_weights} weighs cross-entropy, which self-critical training does not use",
                                word_weights=self.hparams.word_weights)  # fmt: skip
        self.scst = Scst(**(scst or {}))
        self._reward: CorpusCider | None = None

    def on_fit_start(self) -> None:
        super().on_fit_start()
        references = self.trainer.datamodule.references("train")
        self._reward = CorpusCider(list(references.values()))  # every process: rewards where the samples are

    def greedy_rewards(self, context: Tensor, references: list[list[str]]) -> Tensor:
        """The reward (B,) of each image's greedy caption, decoded as at evaluation (eval mode)."""
        tok = self.tokenizer
        self.eval()
        try:
            with torch.no_grad():
                greedy = generate(self.model.decoder, context, bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id,
                                  config=GenerationConfig(max_new_tokens=self.generation.max_new_tokens))  # fmt: skip
        finally:
            self.train()  # frozen modules stay in eval mode (Task.train)
        return torch.tensor(self._reward(tok.decode_batch(greedy.cpu()), references), device=context.device)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        tok, cfg, k = self.tokenizer, self.scst, self.scst.samples
        ids = {"bos_id": tok.bos_id, "eos_id": tok.eos_id, "pad_id": tok.pad_id}
        context = self.model.encode(batch["images"])  # (B, S, D), trained through the samples' log-probs
        if "image_index" in batch:  # an image's captions grouped (data.group_by_image): its row per caption
            context = context[batch["image_index"]]
        contexts = context.repeat_interleave(k, 0)  # (B * K, S, D): an image's samples adjacent
        sampling = GenerationConfig(
            max_new_tokens=self.generation.max_new_tokens, do_sample=True, temperature=cfg.temperature
        )
        with torch.no_grad():  # sampled as trained (dropout, if any, on): the log-probs below see the same model
            sampled = generate(self.model.decoder, contexts.detach(), config=sampling, **ids)
        references = [refs for refs in batch["references"] for _ in range(k)]
        rewards = torch.tensor(self._reward(tok.decode_batch(sampled.cpu()), references), device=context.device)
        greedy = self.greedy_rewards(context.detach(), batch["references"]) if cfg.baseline == "greedy" else None
        advantage = rewards - baseline_rewards(rewards, k, greedy)  # (B * K,)

        logp = sample_log_probs(self.model.decoder, contexts, sampled, temperature=cfg.temperature, **ids)
        mask = until_eos(sampled, tok.eos_id)
        size = len(batch["input_ids"])
        self.log("train/reward", rewards.mean(), batch_size=size, sync_dist=True)  # the progress bar reads it
        self.log("train/baseline", (rewards - advantage).mean(), batch_size=size, sync_dist=True)
        self.log("train/sample_tokens", mask.sum(1).float().mean(), batch_size=size, sync_dist=True)
        return self.summed_loss(-(advantage[:, None] * logp).sum(), mask.sum())
