"""Pretraining on N processes at B/N computes what one process computes at B: the contrastive
loss and alignment's negatives over the global batch, masks drawn for the whole batch, losses
normalised over it (2 gloo processes against one, on the model itself)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.multiprocessing as mp

from mmtx.models import TextEncoder, VisionEncoder
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.global_batch import GlobalBatch
from mmtx.models.pretraining import Objectives, TwoStreamPretrainer
from mmtx.models.two_stream import TwoStreamModel

B = 8
# every objective on, hard negatives by contrastive similarity
OBJECTIVES = Objectives(mlm=1.0, mpm=1.0, itm=1.0, itc=0.5, caption=1.0, mask_prob=0.3, negative_prob=0.5)


def pretrainer() -> TwoStreamPretrainer:
    torch.manual_seed(0)
    vision = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2)
    text = TextEncoder(40, dim=32, depth=1, num_heads=2, max_length=16)
    decoder = functools.partial(CaptionDecoder, dim=32, depth=1, num_heads=2, max_length=16)
    return TwoStreamPretrainer(TwoStreamModel(vision, text, co_layers=1, joint_dim=32), mask_id=4,
                               special_ids=list(range(7)), caption_decoder=decoder)  # fmt: skip


def global_batch() -> tuple[torch.Tensor, ...]:
    """B pairs, two captions of image 3 among them, captions of ragged lengths (longest in row 6)."""
    g = torch.Generator().manual_seed(1)
    images = torch.randn(B, 3, 32, 32, generator=g)
    lengths = [4, 6, 5, 7, 4, 5, 12, 6]
    ids = torch.zeros(B, max(lengths) + 2, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, 0], ids[i, 1 : n + 1], ids[i, n + 1] = 1, torch.randint(7, 40, (n,), generator=g), 2
    image_ids = torch.tensor([0, 1, 2, 3, 3, 5, 6, 7])
    return images, ids, ids != 0, image_ids


def step(
    model: TwoStreamPretrainer, batch: GlobalBatch, rows: slice
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One forward and backward on ``rows`` of the global batch (texts cut to their own longest)."""
    images, ids, mask, image_ids = (t[rows] for t in global_batch())
    width = int(mask.sum(1).max())
    out = model(images, ids[:, :width], mask[:, :width], image_ids, OBJECTIVES, batch)
    out["loss"].backward()
    return {k: v.item() for k, v in out.items()}, {n: p.grad.clone() for n, p in model.named_parameters()}


def _process(rank: int, world_size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        b = B // world_size
        gather = lambda x: torch.stack(dist_fn.all_gather(x))  # noqa: E731 (what Lightning's all_gather(sync_grads=True) returns)
        batch = GlobalBatch(rank, world_size, gather, torch.Generator().manual_seed(5))
        model = pretrainer()
        logged, grads = step(model, batch, slice(rank * b, (rank + 1) * b))
        for g in grads.values():  # what DDP does: the mean of the processes' gradients
            dist.all_reduce(g)
            g /= world_size
        logged = {k: torch.tensor(v) for k, v in logged.items()}
        for v in logged.values():  # what the task logs: the mean of the processes' values
            dist.all_reduce(v)
            v /= world_size
        if rank == 0:
            torch.save({"logged": {k: v.item() for k, v in logged.items()}, "grads": grads}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_compute_the_losses_and_gradients_of_one(tmp_path: Path) -> None:
    want_logged, want_grads = step(pretrainer(), GlobalBatch(generator=torch.Generator().manual_seed(5)), slice(0, B))
    out = tmp_path / "two.pt"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_process, args=(2, str(tmp_path / "init"), str(out)), nprocs=2)
    got = torch.load(out)
    assert set(got["logged"]) == set(want_logged) >= {"itc_loss", "itm_loss", "mlm_loss", "mpm_loss", "caption_loss"}
    for k, v in want_logged.items():
        assert got["logged"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for name, g in want_grads.items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_draws_for_the_global_batch_are_one_process_draws_sliced() -> None:
    """Each process's masks and negatives are its rows of those one process draws for the batch."""

    def draws(rank: int, world_size: int) -> GlobalBatch:
        return GlobalBatch(
            rank, world_size, lambda x: x[None].expand(world_size, *x.shape), torch.Generator().manual_seed(3)
        )

    whole = draws(0, 1)
    full = (
        whole.rand(8, 5),
        whole.randint(9, 8, 5),
        whole.multinomial(torch.rand(8, 8, generator=torch.Generator().manual_seed(0))),
    )
    for rank in range(2):
        part = draws(rank, 2)
        got = (
            part.rand(4, 5),
            part.randint(9, 4, 5),
            part.multinomial(torch.rand(8, 8, generator=torch.Generator().manual_seed(0))),
        )
        for a, b in zip(got, full):
            assert torch.equal(a, b[rank * 4 : (rank + 1) * 4])
    with pytest.raises(ValueError, match="world_size=2 needs an all_gather"):
        GlobalBatch(0, 2)
