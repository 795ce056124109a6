"""Image-text retrieval recall (R@K), as reported for COCO/Flickr30k retrieval."""

from __future__ import annotations

import torch
from torch import Tensor


def retrieval_recall(scores: Tensor, text_image: Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Recall at K in both directions, in percent.

    ``scores`` (N_images, M_texts): higher = better match. ``text_image`` (M,): the image index
    each text describes. Image->text: an image counts as found if any of its texts ranks in its
    top K. Text->image: a text counts if its image ranks in its top K. Ties count against the
    model (a constant scorer gets chance-level recall, not 100%).
    """
    n, m = scores.shape
    if text_image.shape != (m,) or (text_image < 0).any() or (text_image >= n).any():
        raise ValueError(f"text_image must hold {m} image indices in [0, {n})")
    truth = text_image[None, :] == torch.arange(n, device=scores.device)[:, None]  # (N, M)
    out = {}
    # rank of the best true text for each image: how many wrong texts score at least as high
    best_true = scores.masked_fill(~truth, float("-inf")).max(1).values
    i2t_rank = ((scores >= best_true[:, None]) & ~truth).sum(1)
    true_score = scores.gather(0, text_image[None, :]).squeeze(0)
    t2i_rank = ((scores >= true_score[None, :]) & ~truth).sum(0)
    for k in ks:
        out[f"i2t_R@{k}"] = 100.0 * (i2t_rank < k).float().mean().item()
        out[f"t2i_R@{k}"] = 100.0 * (t2i_rank < k).float().mean().item()
    return out
