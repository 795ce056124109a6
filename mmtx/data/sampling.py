"""Which examples each process reads, in what order: the same for any number of processes, resumable.

Every process draws the same seeded permutation of the data set for an epoch and keeps every
``world_size``-th index from its ``rank``, so the examples of global batch ``k`` (all processes'
``k``-th batches together) are those of batch ``k`` of a single process with the whole global
batch: a DDP run and a one-process run see the same data in the same order. Each example also
gets its own random seed (the examples of a group, an image's texts, share one), drawn with the
permutation, that fixes its augmentation whatever worker process decodes it; and a run resumed
mid-epoch starts at the batch where it stopped. With both, a resumed run replays exactly what the
uninterrupted one would have done.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from mmtx.data.bad_data import DecodeFailures, ScreenedLoader


class ShardedBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of ``(index, seed)`` pairs for one process of ``world_size``.

    Args:
        size: examples in the data set.
        batch_size: examples per batch *per process*.
        shuffle: a new permutation each epoch (training); else the data set's order.
        drop_last: drop the last incomplete global batch (training); each process takes a
            contiguous slice of every global batch, in rank order, so the processes' batches
            joined in rank order are one process's batch with them all. Without it (evaluation)
            the index list is padded with repeats of its start so every process gets the same
            number of examples, as ``DistributedSampler`` does; the evaluation removes repeats.
        seed: the run's seed; the permutation and per-example seeds come from ``(seed, epoch)``.
        groups: a group id per example (e.g. its image): when shuffling, the groups are shuffled
            and each group's examples follow one another, so a batch holds all of few groups
            (an image's questions or captions share one pass of the image encoder). A group may
            still be cut by a batch boundary. The examples of a group share one seed per epoch,
            so an image is augmented alike for each of its texts (one mirror draw for all its
            captions) and stays one image of the batch.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        groups: Sequence[int] | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        self.size, self.batch_size, self.shuffle, self.drop_last = size, batch_size, shuffle, drop_last
        self.seed, self.rank, self.world_size = seed, rank, world_size
        if groups is not None and len(groups) != size:
            raise ValueError(f"groups has {len(groups)} ids for {size} examples")
        # dense group ids 0..G-1, so that a permutation of the groups orders the examples
        self.groups = None if groups is None else torch.unique(torch.as_tensor(groups), return_inverse=True)[1]
        self.epoch = 0
        self._skip: tuple[int, int] | None = None  # (epoch, batches already taken) after a resume

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch (through :attr:`sampler`)."""
        self.epoch = epoch

    @property
    def sampler(self) -> ShardedBatchSampler:
        """Itself. Lightning hands each training epoch's number to the ``set_epoch`` of a loader's
        ``sampler`` and of its ``batch_sampler.sampler``; a loader built on this batch sampler has
        torch's plain ``SequentialSampler`` as its ``sampler``, so this is where Lightning finds it."""
        return self

    def resume(self, epoch: int, batches_done: int) -> None:
        """Start ``epoch`` after its first ``batches_done`` batches (once)."""
        self.epoch, self._skip = epoch, (epoch, batches_done)

    def _share(self) -> int:
        """Examples per process per epoch."""
        if self.drop_last:  # whole global batches only
            return self.size // (self.batch_size * self.world_size) * self.batch_size
        return -(-self.size // self.world_size)  # every example, the last ones padded with repeats

    def __len__(self) -> int:
        """Batches per epoch for this process (a resumed epoch yields only the rest of them)."""
        return -(-self._share() // self.batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        if not self.shuffle:
            order = torch.arange(self.size)
        elif self.groups is None:
            order = torch.randperm(self.size, generator=g)
        else:  # the groups in a random order, each group's examples in the data set's order
            num_groups = int(self.groups.max()) + 1
            rank_of_group = torch.empty(num_groups, dtype=torch.long)
            rank_of_group[torch.randperm(num_groups, generator=g)] = torch.arange(num_groups)
            # sort by (the group's place in the shuffle, the example's index)
            order = torch.argsort(rank_of_group[self.groups] * self.size + torch.arange(self.size))
        if self.groups is None:
            seeds = torch.randint(2**62, (self.size,), generator=g)
        else:  # one seed per group, shared by its examples
            seeds = torch.randint(2**62, (int(self.groups.max()) + 1,), generator=g)[self.groups]
        total = self._share() * self.world_size
        if total > self.size:  # evaluation on several processes: pad so every share is equal
            order = order.repeat(-(-total // self.size))
        if self.drop_last:
            # each process takes a contiguous slice of every global batch, in rank order (a group
            # stays on one process; gathered over the processes, the rows are one process's batch)
            mine = order[:total].view(-1, self.world_size, self.batch_size)[:, self.rank].flatten().tolist()
        else:
            mine = order[:total][self.rank :: self.world_size].tolist()
        seeds = seeds.tolist()

        start = 0
        if self._skip is not None:
            epoch, done = self._skip
            self._skip = None
            if epoch == self.epoch:
                start = done
        for b in range(start, len(self)):
            batch = mine[b * self.batch_size : (b + 1) * self.batch_size]
            yield [(i, seeds[i]) for i in batch]


class SeededDataset(Dataset):
    """Reads ``dataset[index]`` with the random generators seeded from the sampler's per-example seed.

    Random augmentations (torchvision draws from torch's global generator) then depend on the
    example and the epoch only, not on which worker process decodes it or what it decoded
    before; the caller's generator state is left as it was.
    """

    def __init__(self, dataset: Dataset, reseed: bool = True) -> None:
        self.dataset = dataset
        self.reseed = reseed  # False where reading an example draws no random number: no fork, no seeding

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, item: tuple[int, int]) -> Any:
        index, seed = item
        if not self.reseed:
            return self.dataset[index]
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only: torch.manual_seed also queues seeds for every accelerator
            # type, formatting a stack trace each time, which cost as much as decoding an image
            torch.random.default_generator.manual_seed(seed)
            return self.dataset[index]


def position_in_epoch(trainer: Any, sampler: ShardedBatchSampler | None) -> dict[str, int]:
    """Where a fitting ``trainer`` is in the epoch ``sampler`` serves: ``{"epoch",
    "batches_done"}`` ({} when it is not fitting), for a data module's ``state_dict`` and a
    resumed sampler.

    The epoch is the sampler's, the one Lightning handed it (`set_epoch`), not
    ``trainer.current_epoch``: after a resume from a checkpoint written at an epoch's last batch,
    Lightning's ``current_epoch`` runs one ahead of the epoch it serves. Lightning exposes no
    public count of the batches taken in the current epoch; its fit loop's progress counter
    (``batch_progress.current.ready``) is that count, reset each epoch (tests guard it: test_faults).
    """
    from lightning.pytorch.trainer.states import TrainerFn

    if trainer is None or sampler is None or trainer.state.fn != TrainerFn.FITTING:
        return {}
    batches_done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    return {"epoch": sampler.epoch, "batches_done": batches_done}


def serve(
    dataset: Dataset,
    sampler: ShardedBatchSampler,
    *,
    collate: Callable[[list[Any]], Any],
    failures: DecodeFailures,
    num_workers: int,
    seed: int,
    reseed: bool = True,
) -> ScreenedLoader:
    """A loader of ``sampler``'s batches of ``dataset``, each example read under its own seed
    (`SeededDataset`; ``reseed=False`` where reading draws no random number) and images that fail
    to decode in a worker handled by ``failures`` in this process."""
    if num_workers > 0:
        # the workers fork from this process and share its memory until they write to it; the
        # cyclic garbage collector writes to every object it visits, so each worker would copy
        # the pages of all the records, vocabularies... held here. Frozen, they are left alone.
        gc.freeze()
    return ScreenedLoader(
        SeededDataset(dataset, reseed=reseed),
        failures=failures,
        batch_sampler=sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),  # worker seeds: not from the global RNG
    )
