"""Random masking for masked language and masked patch modelling."""

from __future__ import annotations

import torch
from torch import Tensor

from mmtx.models.global_batch import GlobalBatch

IGNORE = -100  # label of positions that are not predicted


def mask_tokens(
    input_ids: Tensor,
    maskable: Tensor,
    mask_id: int,
    vocab_size: int,
    prob: float = 0.15,
    draws: GlobalBatch | None = None,
    special_ids: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masking: pick ``prob`` of the maskable tokens; of those 80% become [MASK], 10% a
    random token, 10% stay. Returns (masked inputs, labels with IGNORE where not picked).

    ``maskable`` (B, T) is False on padding and special tokens. Random replacements avoid
    ``special_ids``. ``draws``: where the random numbers come from (default: one process,
    torch's generator).
    """
    draws, device = draws or GlobalBatch(), input_ids.device
    rand = draws.rand(*input_ids.shape, device=device)
    picked = (rand < prob) & maskable
    labels = torch.where(picked, input_ids, IGNORE)
    how = draws.rand(*input_ids.shape, device=device)
    inputs = torch.where(picked & (how < 0.8), mask_id, input_ids)
    # the k-th id that is not special, for a k drawn below the number of such ids (no table of
    # them: building one on the device would take its length to the host)
    skipped = sorted({s for s in special_ids or [] if 0 <= s < vocab_size})
    random_tokens = draws.randint(vocab_size - len(skipped), *input_ids.shape, device=device)
    for special in skipped:  # ascending: each special id at or below the token shifts it up one
        random_tokens = random_tokens + (random_tokens >= special)
    inputs = torch.where(picked & (how >= 0.8) & (how < 0.9), random_tokens, inputs)
    return inputs, labels


def mask_patches(
    batch: int,
    num_patches: int,
    prob: float = 0.15,
    replace_prob: float = 0.9,
    draws: GlobalBatch | None = None,
    device: torch.device | None = None,
) -> tuple[Tensor, Tensor]:
    """Pick ``prob`` of the patches (at least one per image) to predict; of those, ``replace_prob``
    get the mask embedding and the rest stay visible, as ViLBERT zeroes 90% of masked regions.

    Returns (picked, replaced), both (B, N) bool, ``replaced`` a subset of ``picked``.
    """
    draws = draws or GlobalBatch()
    rand = draws.rand(batch, num_patches, device=device)
    picked = rand < prob
    # every image predicts at least one patch, so the loss is defined for any batch
    first = rand.argmin(dim=1)
    picked[torch.arange(batch, device=device), first] = True
    replaced = picked & (draws.rand(batch, num_patches, device=device) < replace_prob)
    return picked, replaced
