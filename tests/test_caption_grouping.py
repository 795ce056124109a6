"""An image's captions batched together (`data.group_by_image`): each image encoded once, the loss
and its gradients those of every caption read with its own image."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from mmtx.data.sampling import ShardedBatchSampler
from mmtx.data.synthetic import GridCaptions
from mmtx.data.tokenizer import Tokenizer
from mmtx.models.captioner import ImageCaptioner
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.vit import VisionEncoder


def _captioner() -> ImageCaptioner:
    torch.manual_seed(0)
    encoder = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv", stem_norm="group")
    decoder = CaptionDecoder(
        vocab_size=40, context_dim=32, dim=32, depth=1, num_heads=2, max_length=12, read_where=True
    )
    return ImageCaptioner(encoder, decoder)


def test_loss_with_an_image_index_is_the_loss_of_each_caption_with_its_own_image() -> None:
    model = _captioner()
    images = torch.randn(2, 3, 32, 32)
    index = torch.tensor([0, 0, 1, 0, 1])
    ids = torch.randint(3, 40, (5, 10))
    ids[:, 0], ids[3:, 7:] = 1, 0  # BOS; two shorter captions padded
    grouped = model.loss(images, ids, pad_id=0, image_index=index)
    grouped_grads = torch.autograd.grad(grouped, list(model.parameters()), allow_unused=True)
    each = model.loss(images[index], ids, pad_id=0)  # every caption with its own copy of the image
    each_grads = torch.autograd.grad(each, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(grouped, each)
    assert sum(g is not None for g in each_grads) > 20
    for a, b in zip(grouped_grads, each_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)  # both None where unused


def test_a_group_shares_one_seed_and_its_examples_follow_one_another() -> None:
    groups = [0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4]
    sampler = ShardedBatchSampler(len(groups), 12, shuffle=True, drop_last=True, seed=3, groups=groups)
    (batch,) = list(sampler)
    order = [groups[i] for i, _ in batch]
    assert sorted(order) == groups and order != groups  # shuffled by group,
    for g in set(groups):  # each group's examples one after another
        at = [k for k, o in enumerate(order) if o == g]
        assert at == list(range(at[0], at[0] + len(at)))
    seeds = {g: {s for i, s in batch if groups[i] == g} for g in set(groups)}
    assert all(len(s) == 1 for s in seeds.values()) and len({s.pop() for s in seeds.values()}) == 5
    ungrouped = list(ShardedBatchSampler(len(groups), 12, shuffle=True, drop_last=True, seed=3))[0]
    assert len({s for _, s in ungrouped}) == 12  # without groups: a seed per example


def _grid(tmp_path: Path, **kwargs: Any) -> GridCaptions:
    return GridCaptions(
        str(tmp_path / "grid"), num_train=40, num_val=2, seed=1, image_size=32, batch_size=20,
        mirror_words=[["left", "right"]], tokenizer=functools.partial(Tokenizer.train, vocab_size=80), **kwargs,
    )  # fmt: skip


def test_grouped_batches_hold_each_image_once_mirrored_alike_for_all_its_captions(tmp_path: Path) -> None:
    module = _grid(tmp_path, group_by_image=True)
    original = {r.image_id: r.captions for r in module.records("train")}
    batches = list(module.train_dataloader())
    assert len(batches) == 10
    mirrored = []
    for b in batches:
        index, ids, rows = b["image_index"], b["image_ids"].tolist(), b["images"].shape[0]
        assert b["input_ids"].shape[0] == 20 and rows == len(ids) == len(set(ids))  # one row per image
        assert rows <= 5  # 20 captions, 5 per image: 4 images, 5 where a batch cuts an image's captions
        assert index.tolist() == sorted(index.tolist())  # an image's captions one after another
        for r in range(rows):  # mirrored or not, all of an image's captions read alike
            (refs,) = {tuple(b["references"][i]) for i in range(20) if index[i] == r}
            unsided = [re.sub(r"\b(left|right)\b", "SIDE", c) for c in refs]  # the row's own image's captions
            assert unsided == [re.sub(r"\b(left|right)\b", "SIDE", c) for c in original[ids[r]]]
            if any(w in c.split() for c in refs for w in ("left", "right")):  # else a mirror shows in pixels only
                mirrored.append(refs != tuple(original[ids[r]]))
    assert any(mirrored) and not all(mirrored)  # some images mirrored, some not
    evaluation = next(iter(module.val_dataloader()))
    assert "image_index" not in evaluation and evaluation["images"].shape[0] == 2


def test_ungrouped_batches_stack_an_image_per_caption(tmp_path: Path) -> None:
    batch = next(iter(_grid(tmp_path).train_dataloader()))
    assert "image_index" not in batch and batch["images"].shape[0] == batch["input_ids"].shape[0] == 20


@pytest.mark.slow
def test_mmtx_train_with_grouped_captions_trains_and_writes_its_checkpoint(
    cli, tiny: list[str], tmp_path: Path
) -> None:
    from mmtx.checkpoint import read_checkpoint

    run = tmp_path / "grouped"
    cli.run("mmtx-train", *tiny, "data=grid", "data.group_by_image=true", "data.mirror_words=[[left,right]]",
            "trainer.max_steps=4", "logger=csv", f"hydra.run.dir={run}", cwd=tmp_path)  # fmt: skip
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 4
