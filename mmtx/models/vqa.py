"""Visual question answering on the two-stream model: an answer classifier and an answer decoder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.text import mean_of_tokens
from mmtx.models.two_stream import Joint, TwoStreamModel
from mmtx.nn.init import init_weights


# --- what the answer MLP reads: one function per ``pooling`` ------------------------------------
def pool_product(joint: Joint, text_mask: Tensor) -> Tensor:
    """ViLBERT's ``pool(h_IMG) * pool(h_CLS)`` (B, joint_dim)."""
    return joint.pooled


def pool_concat(joint: Joint, text_mask: Tensor) -> Tensor:
    """``[pool(h_IMG); pool(h_CLS)]`` (B, 2 * joint_dim), as METER: each stream's summary kept whole."""
    return torch.cat([joint.image_pooled, joint.text_pooled], dim=-1)


def pool_tokens(joint: Joint, text_mask: Tensor) -> Tensor:
    """``[mean(image tokens); mean(question tokens)]`` (B, Dv + Dt) after co-attention."""
    return torch.cat([joint.per_text(joint.vision.mean(1)), mean_of_tokens(joint.text, text_mask)], dim=-1)


def pool_max(joint: Joint, text_mask: Tensor) -> Tensor:
    """As `pool_tokens`, with the image tokens' maximum instead of their mean (B, Dv + Dt)."""
    return torch.cat([joint.per_text(joint.vision.amax(1)), mean_of_tokens(joint.text, text_mask)], dim=-1)


@dataclass(frozen=True)
class Pooling:
    """A ``pooling``: its function, whether it reads the backbone's pooled outputs (`Joint.pooled`,
    built with ``pooler``) and the width it gives the answer MLP."""

    pool: Callable[[Joint, Tensor], Tensor]
    reads_pooler: bool
    width: Callable[[TwoStreamModel], int]


POOLINGS = {
    "product": Pooling(pool_product, True, lambda m: m.joint_dim),
    "concat": Pooling(pool_concat, True, lambda m: 2 * m.joint_dim),
    "tokens": Pooling(pool_tokens, False, lambda m: m.vision.dim + m.text.dim),
    "max": Pooling(pool_max, False, lambda m: m.vision.dim + m.text.dim),
}


# --- how the answers are scored against the annotators' soft scores: one class per ``loss`` -------
class SigmoidAnswers:
    """An independent sigmoid per answer, BCE summed over the answers (ViLBERT, BUTD: several
    answers can be right)."""

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / len(targets)

    def probabilities(self, logits: Tensor) -> Tensor:
        return logits.sigmoid()


class SoftmaxAnswers:
    """One softmax over the answers, cross-entropy against the soft scores normalised to sum to
    one (an answer competes with the others, as in a classifier); a question none of whose answers
    is in the vocabulary has no target and adds nothing."""

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        normalised = targets / targets.sum(1, keepdim=True).clamp_min(1e-6)
        return F.cross_entropy(logits, normalised, reduction="sum") / len(targets)

    def probabilities(self, logits: Tensor) -> Tensor:
        return logits.softmax(-1)


LOSSES = {"bce": SigmoidAnswers, "softmax": SoftmaxAnswers}


class VqaClassifier(nn.Module):
    """A two-layer MLP on the pooled joint encoding scoring each answer of a fixed vocabulary,
    trained on the annotators' soft scores.

    Args:
        backbone: the two-stream model (typically initialised from pretraining).
        num_answers: size of the answer vocabulary (filled in by the task).
        hidden_mult: the MLP's hidden width as a multiple of the joint width (ViLBERT: 2).
        pooling: what the MLP reads: ``product`` is ViLBERT's ``pool(h_IMG) * pool(h_CLS)``;
            ``concat`` is ``[pool(h_IMG); pool(h_CLS)]`` (as METER does), which keeps each
            stream's summary whole instead of gating one by the other; ``tokens`` is
            ``[mean(image tokens); mean(question tokens)]`` after co-attention, so the answer
            reads every fused token rather than two summary tokens; ``max`` takes the image
            tokens' maximum instead of their mean: a small object that answers the question
            stands out of a mostly empty image instead of being averaged away.
        loss: ``bce``: an independent sigmoid per answer (ViLBERT, BUTD: several answers can be
            right); ``softmax``: cross-entropy of the answers' softmax against the soft scores
            normalised to sum to one (one answer competes with the others, as in a classifier).
    """

    def __init__(
        self,
        backbone: TwoStreamModel,
        num_answers: int,
        hidden_mult: float = 2.0,
        dropout: float = 0.1,
        pooling: str = "product",
        loss: str = "bce",
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ArgumentError(f"{{pooling!r}} must be one of {', '.join(POOLINGS)}", pooling=pooling)
        if loss not in LOSSES:
            raise ArgumentError(f"{{loss!r}} must be one of {', '.join(LOSSES)}", loss=loss)
        chosen = POOLINGS[pooling]
        if chosen.reads_pooler and not backbone.pooler:
            raise ArgumentError(
                "{pooling!r} reads the backbone's pooled output: build it with {backbone.pooler!k}=true",
                pooling=pooling,
                **{"backbone.pooler": backbone.pooler},
            )
        self.backbone, self.pooling = backbone, pooling
        self.pool, self.scoring = chosen.pool, LOSSES[loss]()
        width = chosen.width(backbone)
        hidden = int(backbone.joint_dim * hidden_mult)
        self.head = nn.Sequential(
            nn.Linear(width, hidden),
            nn.GELU(),
            nn.LayerNorm(hidden),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_answers),
        )
        self.head.apply(init_weights)

    @property
    def num_answers(self) -> int:
        return self.head[-1].out_features

    def forward(
        self, images: Tensor, input_ids: Tensor, text_mask: Tensor, image_index: Tensor | None = None
    ) -> Tensor:
        """Answer logits (B, num_answers); ``image_index`` (B,): the row of ``images`` (U, 3, H, W)
        holding each question's image, each row encoded once (default: row i)."""
        joint = self.backbone(images, input_ids, text_mask, image_index)
        return self.head(self.pool(joint, text_mask))

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """The loss against soft scores (B, A), mean over questions (see ``loss`` in the class docs)."""
        return self.scoring.loss(logits.float(), targets)

    def probabilities(self, logits: Tensor) -> Tensor:
        """Each answer's probability (B, A) under the loss trained: sigmoid or softmax."""
        return self.scoring.probabilities(logits.float())


class VqaGenerator(nn.Module):
    """Generative VQA: the shared caption decoder writes the answer, reading the question-aware
    joint encoding (both streams after co-attention), so answers outside any vocabulary are possible.

    The decoder's ``context_dim`` is the vision width; the text stream is projected to it.
    """

    def __init__(self, backbone: TwoStreamModel, decoder: CaptionDecoder) -> None:
        super().__init__()
        if decoder.context_dim != backbone.vision.dim:
            raise ArgumentError(
                "{decoder.context_dim} must equal {backbone.vision.dim}",
                **{"decoder.context_dim": decoder.context_dim, "backbone.vision.dim": backbone.vision.dim},
            )
        self.backbone, self.decoder = backbone, decoder
        self.text_proj = nn.Linear(backbone.text.dim, backbone.vision.dim)
        init_weights(self.text_proj)

    def context(
        self, images: Tensor, input_ids: Tensor, text_mask: Tensor, image_index: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Joint tokens (B, 1 + N + T, Dv) and their mask (question padding excluded);
        ``image_index``: see `VqaClassifier.forward`."""
        joint = self.backbone(images, input_ids, text_mask, image_index)
        vision = joint.per_text(joint.vision)
        context = torch.cat([vision, self.text_proj(joint.text)], dim=1)
        vision_mask = text_mask.new_ones(vision.shape[:2])
        return context, torch.cat([vision_mask, text_mask], dim=1)

    def loss(
        self,
        images: Tensor,
        input_ids: Tensor,
        text_mask: Tensor,
        answer_ids: Tensor,
        pad_id: int,
        image_index: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced cross-entropy of the answer ``[BOS] a1 .. an [EOS]`` (pads ignored)."""
        context, mask = self.context(images, input_ids, text_mask, image_index)
        logits = self.decoder(answer_ids[:, :-1], context, context_mask=mask)
        return F.cross_entropy(logits.flatten(0, 1).float(), answer_ids[:, 1:].flatten(), ignore_index=pad_id)
