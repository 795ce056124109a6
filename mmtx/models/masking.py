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
    ordinary = torch.ones(vocab_size, dtype=torch.bool)
    ordinary[list(special_ids or [])] = False
    choices = ordinary.nonzero().squeeze(1).to(input_ids.device)  # ids a random replacement may take
    pick = draws.randint(len(choices), *input_ids.shape, device=device)
    random_tokens = choices[pick]
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
