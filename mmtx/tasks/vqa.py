"""Visual question answering as LightningModules: answer classification and answer generation."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import lightning as L
import torch

from mmtx.config_build import build
from mmtx.data.tokenizer import Tokenizer
from mmtx.generation import GenerationConfig, generate
from mmtx.metrics.vqa import build_answer_vocab, normalize_answer, soft_scores, vqa_accuracy
from mmtx.models.vqa import POOLINGS
from mmtx.tasks.base import Task
from mmtx.tasks.gather import gather_unique


def soft_targets(answers: list[list[str]], answer_index: dict[str, int]) -> torch.Tensor:
    """Training targets (B, A): the official accuracy each vocabulary answer would get."""
    out = torch.zeros(len(answers), len(answer_index))
    for row, question_answers in enumerate(answers):
        for answer, score in soft_scores(question_answers).items():
            if answer in answer_index:
                out[row, answer_index[answer]] = score
    return out


class AnswerTask(Task):
    """What both ways of answering share: the optimiser, validation with the official VQA accuracy
    (overall and per answer type), the predictions file and the answer-prior baseline.

    Subclasses complete their model's arguments (``model_arguments``), score a batch (``loss``) and
    answer (``answer``).

    Args:
        model: the model's config; what it leaves to the data comes from ``model_arguments``.
        tokenizer: the tokenizer as JSON text.
        lr, weight_decay, betas: AdamW settings (no decay on biases, norms, positions).
        warmup_ratio, min_lr_ratio: linear warm-up over that share of the run's budget, then cosine
            decay to ``min_lr_ratio * lr``.
        freeze: the weights that do not train (:class:`mmtx.tasks.freezing.Freeze`).
        lora: low-rank adapters (:class:`mmtx.tasks.lora.Lora`).
    """

    def __init__(
        self,
        model: dict,
        tokenizer: str,
        lr: float = 5e-4,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_ratio: float = 0.05,
        min_lr_ratio: float = 0.01,
        freeze: dict | None = None,
        lora: dict | None = None,
        data_config: dict | None = None,
    ) -> None:
        super().__init__(tokenizer=tokenizer, data_config=data_config, freeze=freeze, lora=lora)
        self.model = build(model, key="model", **self.model_arguments(self.tokenizer))
        self.check_text_length("backbone.text", self.model.backbone.text.max_length)
        self.choose_trainable()

    def model_arguments(self, tok: Tokenizer) -> dict[str, Any]:
        """What the model config leaves to the data (vocabulary sizes, padding id), and the
        backbone's parts no answer reads left out (no mask token: data-parallel training refuses
        parameters without a gradient)."""
        text = {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id}
        return {"backbone": {"text": text, "patch_masking": False, "pooler": self.reads_pooled()}}

    def reads_pooled(self) -> bool:
        """Whether the answer reads the backbone's pooled output (`TwoStreamModel`'s ``pooler``)."""
        return False

    def loss(self, batch: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def answer(
        self,
        images: torch.Tensor,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        k: int = 1,
        image_index: torch.Tensor | None = None,
    ) -> list[list[tuple[str, float]]]:
        """The top ``k`` (answer, probability) per question (``image_index``: see `VqaClassifier`)."""
        raise NotImplementedError

    # --- training ------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss, count = self.loss_over_items(batch)
        return self.summed_loss(loss * count, count)

    def loss_over_items(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | int]:
        """The batch's loss and how many items it is a mean over (`Task.summed_loss`): its questions."""
        return self.loss(batch), len(batch["input_ids"])

    # --- validation ----------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if all(batch["answers"]):
            self.log("val/loss", self.loss(batch), prog_bar=True, batch_size=len(batch["input_ids"]), sync_dist=True)
        predicted = self.answer(
            batch["images"], batch["input_ids"], batch["attention_mask"], k=1, image_index=batch.get("image_index")
        )
        for qid, top, answers, kind in zip(
            batch["question_ids"].tolist(), predicted, batch["answers"], batch["answer_types"]
        ):
            self.val_outputs.append({"question_id": qid, "answer": top[0][0], "answers": answers, "answer_type": kind})

    def on_validation_epoch_end(self) -> None:
        outputs = gather_unique(self.val_outputs, key="question_id", strategy=self.trainer.strategy)
        self.val_outputs = outputs
        scored = [o for o in outputs if o["answers"]]
        if self.trainer.sanity_checking or not scored:
            return
        self.metrics = vqa_accuracy(
            {o["question_id"]: o["answer"] for o in scored},
            {o["question_id"]: {"answers": o["answers"], "answer_type": o["answer_type"]} for o in scored},
        )
        self.log_dict({f"val/{k}": v for k, v in self.metrics.items()}, sync_dist=True)  # equal on every rank

    def predictions(self) -> list[dict[str, Any]]:
        """The last evaluation's answers in the official results format."""
        return [{"question_id": o["question_id"], "answer": o["answer"]} for o in self.val_outputs]

    def baseline(self, datamodule: L.LightningDataModule) -> tuple[str, dict[str, float]]:
        """The answer prior: the most frequent training answer for each question type."""
        prior: dict[str | None, Counter] = defaultdict(Counter)
        overall: Counter = Counter()
        for rec in datamodule.records("train"):
            if rec.answers:
                best = Counter(normalize_answer(a) for a in rec.answers).most_common(1)[0][0]
                prior[rec.question_type][best] += 1
                overall[best] += 1
        types = {r.question_id: r.question_type for r in datamodule.records("val")}
        scored = [o for o in self.val_outputs if o["answers"]]
        guess = {
            o["question_id"]: (prior.get(types.get(o["question_id"])) or overall).most_common(1)[0][0] for o in scored
        }
        truth = {o["question_id"]: {"answers": o["answers"], "answer_type": o["answer_type"]} for o in scored}
        return "most frequent training answer per question type", vqa_accuracy(guess, truth)


class VqaTask(AnswerTask):
    """Trains a :class:`~mmtx.models.vqa.VqaClassifier` on the official soft scores with the loss its
    config selects (``loss``: a softmax over the answers, or BCE per answer).

    Args:
        model: the classifier's config; the text stream's vocabulary and ``num_answers`` are
            filled in from the tokenizer and the answer vocabulary.
        tokenizer: the tokenizer as JSON text.
        answers: the answer vocabulary (built from the training answers by :meth:`from_data`).
        num_answers: how many of the most frequent training answers form the vocabulary
            (ViLBERT: 3129).
        lr, weight_decay, betas, warmup_ratio, min_lr_ratio: see :class:`AnswerTask`.
    """

    data_arguments = ("answers",)  # built from the training data; restored from checkpoints

    def __init__(
        self, model: dict, tokenizer: str, answers: list[str] | None = None, num_answers: int = 3129, **optim: Any
    ) -> None:
        if not answers:
            raise ValueError("VqaTask needs an answer vocabulary (answers=[...]); the training data gives it")
        self.answers = list(answers)
        self.answer_index = {a: i for i, a in enumerate(self.answers)}
        super().__init__(model, tokenizer, **optim)

    def model_arguments(self, tok: Tokenizer) -> dict[str, Any]:
        return super().model_arguments(tok) | {"num_answers": len(self.answers)}

    def reads_pooled(self) -> bool:
        chosen = POOLINGS.get(self.hparams.model.get("pooling", "product"))
        return chosen is not None and chosen.reads_pooler  # an unknown one: the model refuses it

    @classmethod
    def stand_in_data_arguments(cls) -> dict[str, Any]:
        return {"answers": ["yes", "no"]}

    @classmethod
    def from_data(cls, datamodule: L.LightningDataModule, num_answers: int = 3129, **_: Any) -> dict[str, Any]:
        """The answer vocabulary: the ``num_answers`` most frequent training answers."""
        return {"answers": build_answer_vocab(datamodule.answers("train"), size=num_answers)}

    def loss(self, batch: dict[str, Any]) -> torch.Tensor:
        logits = self.model(batch["images"], batch["input_ids"], batch["attention_mask"], batch.get("image_index"))
        # made on the host from the answers; sent without waiting, as Lightning sends the batch
        targets = soft_targets(batch["answers"], self.answer_index).to(self.device, non_blocking=True)
        return self.model.loss(logits, targets)

    @torch.no_grad()
    def answer(
        self,
        images: torch.Tensor,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        k: int = 5,
        image_index: torch.Tensor | None = None,
    ) -> list[list[tuple[str, float]]]:
        """The top ``k`` answers per question with their probabilities (sigmoid or softmax scores)."""
        probs = self.model.probabilities(self.model(images, input_ids, mask, image_index))
        top = probs.topk(min(k, probs.shape[1]), dim=1)
        return [
            [(self.answers[i], p) for i, p in zip(idx.tolist(), ps.tolist())]
            for idx, ps in zip(top.indices, top.values)
        ]


class GenerativeVqaTask(AnswerTask):
    """Trains a :class:`~mmtx.models.vqa.VqaGenerator`: the shared decoder writes the answer
    (the annotators' most frequent one, teacher-forced), so any answer can be produced.

    Args:
        generation: decoding settings (:class:`~mmtx.generation.GenerationConfig`; default 8 new tokens).
        model, tokenizer, lr, weight_decay, betas, warmup_ratio, min_lr_ratio: see :class:`AnswerTask`.
    """

    def __init__(self, model: dict, tokenizer: str, generation: dict | None = None, **optim: Any) -> None:
        super().__init__(model, tokenizer, **optim)
        self.generation = GenerationConfig(**{"max_new_tokens": 8, **(generation or {})})

    def model_arguments(self, tok: Tokenizer) -> dict[str, Any]:
        return super().model_arguments(tok) | {"decoder": {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id}}

    def loss(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.loss_over_items(batch)[0]

    def loss_over_items(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the answers' target tokens it is a mean over."""
        answer_ids = self.answer_ids(batch)
        loss = self.model.loss(
            batch["images"],
            batch["input_ids"],
            batch["attention_mask"],
            answer_ids,
            self.tokenizer.pad_id,
            batch.get("image_index"),
        )
        return loss, (answer_ids[:, 1:] != self.tokenizer.pad_id).sum()

    def answer_ids(self, batch: dict[str, Any]) -> torch.Tensor:
        """Each question's most frequent answer, ``[BOS] a1 .. an [EOS]`` padded (B, T)."""
        best = [Counter(normalize_answer(a) for a in answers).most_common(1)[0][0] for answers in batch["answers"]]
        return self.tokenizer.encode_batch(best, self.model.decoder.max_length)[0].to(self.device)

    @torch.no_grad()
    def answer(
        self,
        images: torch.Tensor,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        k: int = 1,
        image_index: torch.Tensor | None = None,
    ) -> list[list[tuple[str, float]]]:
        """The generated answer per question with its probability under the model."""
        tok = self.tokenizer
        context, context_mask = self.model.context(images, input_ids, mask, image_index)
        ids = generate(
            self.model.decoder,
            context,
            context_mask=context_mask,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            config=self.generation,
        )
        seq = torch.cat([torch.full_like(ids[:, :1], tok.bos_id), ids], dim=1)
        logp = self.model.decoder(seq[:, :-1], context, context_mask=context_mask).float().log_softmax(-1)
        token_logp = logp.gather(2, seq[:, 1:, None]).squeeze(2).masked_fill(ids == tok.pad_id, 0.0)
        probs = token_logp.sum(1).exp().tolist()
        return [[(text, p)] for text, p in zip(tok.decode_batch(ids.cpu()), probs)]
