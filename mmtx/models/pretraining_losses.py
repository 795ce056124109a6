"""The two-stream pretraining objectives' losses, one function each, on one process's rows.

Each takes what its head computed and this process's place in the global batch
(:class:`GlobalBatch`): a mean over tokens or patches is this process's share of the global
batch's mean (`GlobalBatch.mean`), so that the processes' averaged gradients are those of one
process with the whole batch. :class:`mmtx.models.pretraining.TwoStreamPretrainer` masks the
inputs, runs the model and weighs these.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtx.models.global_batch import GlobalBatch
from mmtx.models.masking import IGNORE


def caption_loss(
    decoder: Callable[[Tensor, Tensor], Tensor],
    input_ids: Tensor,
    text_mask: Tensor,
    vision: Tensor,
    batch: GlobalBatch,
) -> Tensor:
    """Teacher-forced cross-entropy of ``[BOS] w1 .. wn -> w1 .. wn [EOS]`` (pads ignored),
    written from the vision stream's own tokens ``vision`` (B, 1 + N, Dv)."""
    logits = decoder(input_ids[:, :-1], vision)
    targets = input_ids[:, 1:].masked_fill(~text_mask[:, 1:], IGNORE)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    return batch.mean(loss, (targets != IGNORE).sum())


def itc_loss(
    vision: Tensor, text: Tensor, all_vision: Tensor, all_text: Tensor, positives: Tensor, scale: Tensor
) -> Tensor:
    """The contrastive loss of this process's image embeddings ``vision`` (b, E) against every
    process's texts ``all_text`` (B, E), and of its texts against every image; ``positives``
    (b, B) marks the pairs of the same image."""
    i2t, t2i = scale * vision @ all_text.T, scale * text @ all_vision.T
    return (soft_cross_entropy(i2t, positives) + soft_cross_entropy(t2i, positives)) / 2


def itm_loss(logits: Tensor, aligned: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy of the alignment logits (b, 2) [not aligned, aligned]."""
    return F.cross_entropy(logits.float(), aligned.long()), (logits.argmax(-1) == aligned.long()).float().mean()


def mlm_loss(
    head: nn.Module, text: Tensor, labels: Tensor, aligned: Tensor, batch: GlobalBatch
) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy of the masked words ``labels`` (b, T) (`IGNORE` elsewhere),
    predicted by ``head`` from the fused text tokens ``text`` (b, T, Dt); only on aligned pairs,
    as ViLBERT (an aligned pair reads its own text).

    The head reads every token and the loss keeps the masked ones, as BERT's implementations
    do: picking the masked tokens out first would take their number to the host, a wait for
    the GPU in every step."""
    labels = labels.masked_fill(~aligned[:, None], IGNORE)
    logits = head(text).float()  # (b, T, V)
    count = (labels != IGNORE).sum()
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    right = (logits.argmax(-1) == labels).sum().float()  # an IGNORE label never equals a prediction
    return batch.mean(loss, count), batch.mean(right, count)


def mpm_loss(
    head: nn.Module, patches: Tensor, targets: Tensor, picked: Tensor, aligned: Tensor, batch: GlobalBatch
) -> Tensor:
    """Mean squared error of the ``picked`` (b, N) patches' targets (b, N, P) regressed by
    ``head`` from the fused patch tokens ``patches`` (b, N, Dv); only on aligned pairs. The
    head reads every patch (see :func:`mlm_loss`)."""
    sel = picked & aligned[:, None]
    errors = F.mse_loss(head(patches).float(), targets, reduction="none").sum(-1)  # (b, N)
    return batch.mean(torch.where(sel, errors, 0).sum(), sel.sum() * targets.shape[-1])


def soft_cross_entropy(logits: Tensor, positives: Tensor) -> Tensor:
    """Cross-entropy of each row's softmax against the uniform distribution over its positives
    (``positives`` (R, C) bool, at least one per row), averaged over the rows."""
    targets = positives.float()
    return -(targets / targets.sum(1, keepdim=True) * logits.float().log_softmax(1)).sum(1).mean()


def contrastive_loss(sim: Tensor, positives: Tensor) -> Tensor:
    """Symmetric InfoNCE (CLIP) with possibly several positives per row: cross-entropy against
    the uniform distribution over each row's (and column's) positives."""
    return (soft_cross_entropy(sim, positives) + soft_cross_entropy(sim.T, positives.T)) / 2
