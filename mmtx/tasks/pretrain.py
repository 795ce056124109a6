"""Two-stream image-text pretraining (ViLBERT-style) as a LightningModule."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import lightning as L
import torch

from mmtx.config_build import build
from mmtx.config_error import ArgumentError
from mmtx.metrics.retrieval import retrieval_recall
from mmtx.models.global_batch import GlobalBatch
from mmtx.models.pretraining import OBJECTIVES, Objectives, TwoStreamPretrainer
from mmtx.models.two_stream import Unimodal
from mmtx.tasks.base import Task
from mmtx.tasks.gather import gather_unique
from mmtx.tasks.optim import budget_progress


class PretrainTask(Task):
    """Pretrains a :class:`TwoStreamPretrainer` on image-caption pairs.

    Validation reports each loss, MLM and alignment accuracy (half the pairs get a random other
    image's caption, with a fixed seed), and zero-shot retrieval recall over the first
    ``retrieval_images`` validation images and all their captions.

    Args:
        model: the pretrainer's config; the text stream's ``vocab_size``/``pad_id`` and the
            [MASK]/special ids are filled in from the tokenizer.
        tokenizer: the tokenizer as JSON text.
        objectives: :class:`Objectives` fields (loss weights, masking rates, negatives).
        retrieval_images: images in the retrieval evaluation (0: skip it).
        rerank: with the contrastive loss on, retrieval ranks by contrastive similarity and
            re-scores each query's top ``rerank`` candidates with the alignment head (ALBEF);
            without it, every pair is scored by the alignment head.
        freeze: the weights that do not train (:class:`mmtx.tasks.freezing.Freeze`).
        lora: low-rank adapters (:class:`mmtx.tasks.lora.Lora`).
    """

    def __init__(
        self,
        model: dict,
        tokenizer: str,
        objectives: dict | None = None,
        lr: float = 5e-4,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_ratio: float = 0.05,
        min_lr_ratio: float = 0.01,
        retrieval_images: int = 100,
        rerank: int = 16,
        freeze: dict | None = None,
        lora: dict | None = None,
        data_config: dict | None = None,
    ) -> None:
        super().__init__(tokenizer=tokenizer, data_config=data_config, freeze=freeze, lora=lora)
        tok = self.tokenizer
        self.objectives = Objectives(**(objectives or {}))
        heads = [k for k in OBJECTIVES if getattr(self.objectives, k) > 0]  # the heads the losses use
        backbone = {"text": {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id},
                    "patch_masking": "mpm" in heads, "pooler": "itm" in heads}  # fmt: skip
        self.model: TwoStreamPretrainer = build(
            model,
            key="model",
            backbone=backbone,
            mask_id=tok.mask_id,
            special_ids=sorted(tok.special_ids),
            heads=heads,
        )
        # masks and negatives are drawn from this seed, the step and the batch: the same on every
        # process, and again after a resume
        self._seed = torch.initial_seed()
        self.check_text_length("backbone.text", self.model.backbone.text.max_length)
        if (data_config or {}).get("group_by_image"):
            # the other captions of a text's image would be its contrastive and alignment negatives
            raise ArgumentError(
                "{data_config.group_by_image} batches an image's captions together, which pretraining "
                "would take for negatives of each other (allowed: false)",
                **{"data_config.group_by_image": True},
            )
        self._vision_rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._captions_per_image: list[int] = []  # of the last retrieval evaluation
        self.choose_trainable()

    def _log_losses(self, out: dict[str, torch.Tensor], stage: str, batch_size: int) -> None:
        # each process holds its share of the global batch's mean: their mean is that mean
        for k, v in out.items():
            # the progress bar reads train/loss itself (mmtx.callbacks.BudgetProgressBar)
            self.log(f"{stage}/{k}", v, prog_bar=k == "loss" and stage != "train", batch_size=batch_size,
                     sync_dist=True)  # fmt: skip

    def global_batch(self, batch_idx: int) -> GlobalBatch:
        """This process's place in the global batch of training step ``batch_idx``, and its draws."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(hash((self._seed, self.global_step, batch_idx)))
        gather = lambda x: self.all_gather(x, sync_grads=True)  # noqa: E731
        return GlobalBatch(self.global_rank, self.trainer.world_size, gather, generator)

    def on_train_start(self) -> None:
        super().on_train_start()
        self._progress = budget_progress(self.trainer)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        objectives = self.objectives
        if objectives.hard_negatives and self._progress(self.global_step) < objectives.hard_negatives_from:
            # hard negatives from a contrastive space that has not formed yet are noise that holds
            # the alignment head at chance: random negatives first
            objectives = dataclasses.replace(objectives, hard_negatives=False)
        out = self.model(
            batch["images"],
            batch["input_ids"],
            batch["attention_mask"],
            batch["image_ids"],
            objectives,
            self.global_batch(batch_idx),
        )
        self._log_losses(out, "train", batch["images"].shape[0])
        return out["loss"]

    # --- validation ----------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        images, B = batch["images"], batch["images"].shape[0]
        gen = torch.Generator(device=images.device).manual_seed(1000 + batch_idx)  # same negatives every time
        # alignment is scored as in ViLBERT: against random other captions (chance = 50%)
        objectives = dataclasses.replace(self.objectives, hard_negatives=False)
        out = self.model(
            images,
            batch["input_ids"],
            batch["attention_mask"],
            batch["image_ids"],
            objectives,
            GlobalBatch(generator=gen),
        )
        self._log_losses(out, "val", B)
        # keep what retrieval needs: unmasked vision-stream features and the references
        vision, self._vision_rope = self.model.backbone.encode_vision(images)
        for i, image_id in enumerate(batch["image_ids"].tolist()):
            self.val_outputs.append(
                {"image_id": image_id, "vision": vision[i].cpu(), "references": batch["references"][i]}
            )

    def on_validation_epoch_end(self) -> None:
        outputs = gather_unique(self.val_outputs, key="image_id", strategy=self.trainer.strategy)
        self.val_outputs = []
        if self.trainer.sanity_checking:
            return
        scored = [item for item in outputs if item["references"]]
        items = scored[: self.hparams.retrieval_images]
        self._captions_per_image = [len(item["references"]) for item in items]
        metrics: dict[str, float] = {}
        if scored and self.trainer.is_global_zero:  # on every image once: whatever the processes and batches
            if self.objectives.itm > 0:
                metrics["itm_accuracy"] = self.alignment_accuracy(scored)
            if self.objectives.itm > 0 or self.objectives.itc > 0:  # a head that scores image-text pairs
                metrics.update(self.retrieval(items))
        self.metrics = self.trainer.strategy.broadcast(metrics)
        self.log_dict({f"val/{k}": v for k, v in self.metrics.items()}, sync_dist=True)  # equal on every rank

    @torch.no_grad()
    def alignment_accuracy(self, items: list[dict[str, Any]], chunk: int = 256) -> float:
        """ViLBERT's alignment accuracy (%): each image paired with one of its captions or, with
        ``negative_prob``, another image's, and the alignment head asked which. The pairs come
        from a fixed generator over the images sorted by id, so the figure is the same whatever
        the number of processes or the batch size (chance: 50)."""
        n = len(items)
        g = torch.Generator().manual_seed(1000)
        own = torch.arange(n)
        other = (own + torch.randint(1, max(n, 2), (n,), generator=g)) % n  # another image (itself if alone)
        partner = torch.where(torch.rand(n, generator=g) < self.objectives.negative_prob, other, own)
        captions = [items[j]["references"][int(torch.randint(len(items[j]["references"]), (1,), generator=g))]
                    for j in partner.tolist()]  # fmt: skip
        aligned = torch.tensor([items[i]["image_id"] == items[j]["image_id"] for i, j in enumerate(partner.tolist())])
        correct = 0
        for s in range(0, n, chunk):
            logits = self.model.itm_logits(self._unimodal(items[s : s + chunk], captions[s : s + chunk]))
            correct += (logits.argmax(-1).cpu() == aligned[s : s + chunk].long()).sum().item()
        return 100.0 * correct / n

    @torch.no_grad()
    def retrieval(self, items: list[dict[str, Any]]) -> dict[str, float]:
        """Zero-shot image<->text recall on these images and all their reference captions."""
        texts = [(i, caption) for i, item in enumerate(items) for caption in item["references"]]
        if not texts:
            return {}
        rerank = self.hparams.rerank if self.objectives.itc > 0 else None
        i2t, t2i = self.model.retrieval_scores(self._unimodal(items, [c for _, c in texts]), rerank)
        text_image = torch.tensor([i for i, _ in texts], device=self.device)
        recall_i2t, recall_t2i = retrieval_recall(i2t, text_image), retrieval_recall(t2i, text_image)
        return {
            **{k: v for k, v in recall_i2t.items() if k.startswith("i2t")},
            **{k: v for k, v in recall_t2i.items() if k.startswith("t2i")},
        }

    def _unimodal(self, items: list[dict[str, Any]], captions: list[str]) -> Unimodal:
        """The vision-stream outputs kept for ``items`` beside the text stream's own pass over ``captions``."""
        ids, mask = self.tokenizer.encode_batch(captions, self.model.backbone.text.max_length)
        ids, mask = ids.to(self.device), mask.to(self.device)
        text, text_rope = self.model.backbone.encode_text(ids, mask)
        vision = torch.stack([item["vision"] for item in items]).to(self.device)
        return Unimodal(vision, text, mask, self._vision_rope, text_rope)

    def baseline(self, datamodule: L.LightningDataModule) -> tuple[str, dict[str, float]]:
        """Chance: a coin for alignment, a random ranking for retrieval (exact expectations)."""
        counts = [c for c in self._captions_per_image if c > 0]
        chance = {"itm_accuracy": 50.0}
        if counts:
            n, m = len(counts), sum(counts)
            for k in (1, 5):
                # an image is found if any of its c texts is among k drawn from m without replacement
                miss = [math.comb(m - c, k) / math.comb(m, k) if m - c >= k else 0.0 for c in counts]
                chance[f"i2t_R@{k}"] = 100.0 * (1 - sum(miss) / n)
                chance[f"t2i_R@{k}"] = 100.0 * min(1.0, k / n)
        return "chance (random alignment guesses, random retrieval ranking)", chance
