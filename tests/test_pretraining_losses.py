"""The pretraining objectives' losses, each against the textbook formula on one process."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmtx.models.global_batch import GlobalBatch
from mmtx.models.masking import IGNORE
from mmtx.models.pretraining_losses import (
    caption_loss,
    contrastive_loss,
    itc_loss,
    itm_loss,
    mlm_loss,
    mpm_loss,
)


def test_global_mean_on_one_process_is_the_plain_mean() -> None:
    total, count = torch.tensor(12.0), torch.tensor(4)
    assert GlobalBatch().mean(total, count).item() == 3.0
    assert GlobalBatch().mean(total, torch.tensor(0)).item() == 12.0  # no item: the total, not a division by 0
    # two processes: this one's total over both counts, times two (their gradients are averaged)
    other = torch.tensor(6)
    two = GlobalBatch(rank=0, world_size=2, all_gather=lambda x: torch.stack([x, other.to(x.dtype)]))
    torch.testing.assert_close(two.mean(total, count), torch.tensor(2.4))


def test_caption_loss_is_the_mean_next_token_cross_entropy_over_real_tokens() -> None:
    torch.manual_seed(0)
    vocab, dim = 11, 8
    embed, head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

    def decoder(ids: torch.Tensor, vision: torch.Tensor) -> torch.Tensor:  # reads the image's mean token
        return head(embed(ids) + vision.mean(1, keepdim=True))

    ids = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0]])
    mask = ids != 0
    vision = torch.randn(2, 3, dim)
    logits = decoder(ids[:, :-1], vision)
    real = mask[:, 1:]
    want = F.cross_entropy(logits[real], ids[:, 1:][real])
    torch.testing.assert_close(caption_loss(decoder, ids, mask, vision, GlobalBatch()), want)


def test_itc_loss_on_one_process_is_clip_s_symmetric_loss() -> None:
    torch.manual_seed(0)
    vision, text = F.normalize(torch.randn(4, 6), dim=-1), F.normalize(torch.randn(4, 6), dim=-1)
    scale, positives = torch.tensor(10.0), torch.eye(4, dtype=torch.bool)
    got = itc_loss(vision, text, vision, text, positives, scale)
    sim = scale * vision @ text.T
    want = (F.cross_entropy(sim, torch.arange(4)) + F.cross_entropy(sim.T, torch.arange(4))) / 2
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, contrastive_loss(sim, positives))
    # two captions of one image: each is half the target of that image's row
    positives[0, 1] = positives[1, 0] = True
    got = itc_loss(vision, text, vision, text, positives, scale)
    i2t, t2i = sim.log_softmax(1), sim.T.log_softmax(1)
    rows = [-(i2t[0, 0] + i2t[0, 1]) / 2, -(i2t[1, 0] + i2t[1, 1]) / 2, -i2t[2, 2], -i2t[3, 3]]
    cols = [-(t2i[0, 0] + t2i[0, 1]) / 2, -(t2i[1, 0] + t2i[1, 1]) / 2, -t2i[2, 2], -t2i[3, 3]]
    torch.testing.assert_close(got, (torch.stack(rows).mean() + torch.stack(cols).mean()) / 2)


def test_itm_loss_and_accuracy() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.5]])
    aligned = torch.tensor([False, True, True])
    loss, acc = itm_loss(logits, aligned)
    torch.testing.assert_close(loss, F.cross_entropy(logits, aligned.long()))
    torch.testing.assert_close(acc, torch.tensor(2 / 3))


def test_mlm_loss_reads_the_masked_words_of_aligned_pairs_only() -> None:
    torch.manual_seed(0)
    head = nn.Linear(8, 13)
    with torch.no_grad():
        head.bias[7] = 100.0  # every word predicted as 7: one of the three scored words is right
    text = torch.randn(3, 5, 8)
    labels = torch.full((3, 5), IGNORE)
    labels[0, 1], labels[1, 2], labels[1, 4], labels[2, 0] = 3, 7, 2, 9
    aligned = torch.tensor([True, True, False])  # row 2's masked word is not scored
    loss, acc = mlm_loss(head, text, labels, aligned, GlobalBatch())
    rows = torch.tensor([[0, 1], [1, 2], [1, 4]])
    logits = head(text[rows[:, 0], rows[:, 1]])
    target = torch.tensor([3, 7, 2])
    torch.testing.assert_close(loss, F.cross_entropy(logits, target))
    torch.testing.assert_close(acc, torch.tensor(1 / 3))


def test_mpm_loss_is_the_mean_squared_error_of_picked_patches_of_aligned_pairs() -> None:
    torch.manual_seed(0)
    head = nn.Linear(8, 4)
    patches, targets = torch.randn(2, 6, 8), torch.randn(2, 6, 4)
    picked = torch.zeros(2, 6, dtype=torch.bool)
    picked[0, [1, 3]] = picked[1, 2] = True
    aligned = torch.tensor([True, False])  # row 1's picked patch is not scored
    got = mpm_loss(head, patches, targets, picked, aligned, GlobalBatch())
    want = F.mse_loss(head(patches[0, [1, 3]]), targets[0, [1, 3]])
    torch.testing.assert_close(got, want)
