"""One data-parallel process's view of the global batch.

Objectives that compare the examples of a batch with each other (a contrastive loss, negatives
drawn from the batch) or draw random numbers per example (masking, negative sampling) change with
the number of processes unless each process sees the whole batch. :class:`GlobalBatch` gathers
every process's rows (gradients flow back to the process that owns them, as open_clip's
``gather_with_grad`` and ALBEF's ``all_gather_with_grad``) and draws random numbers for every row
of the global batch, keeping its own: N processes at B/N then compute what one process at B does.

Process ``rank`` holds rows ``[rank * b, (rank + 1) * b)`` of the global batch, in order (the data
modules' samplers give each process a contiguous slice: :mod:`mmtx.data.sampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GlobalBatch:
    """This process's place in the global batch, a gather, and a generator shared by all processes.

    Args:
        rank, world_size: this process and the number of processes.
        all_gather: ``(b, ...) -> (world_size, b, ...)``, differentiable (Lightning's
            ``LightningModule.all_gather(x, sync_grads=True)``); unused on one process.
        generator: seeded the same on every process (else each process's draws differ).
    """

    rank: int = 0
    world_size: int = 1
    all_gather: Callable[[Tensor], Tensor] | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if self.world_size > 1 and self.all_gather is None:
            raise ValueError(f"world_size={self.world_size} needs an all_gather")

    def gather(self, x: Tensor) -> Tensor:
        """Every process's rows (B, ...) in global order; the gradient of the own rows flows back."""
        if self.world_size == 1:
            return x
        return self.all_gather(x).flatten(0, 1)

    def total(self, x: Tensor) -> Tensor:
        """``x`` summed over the processes, without a gradient (e.g. a count of tokens)."""
        if self.world_size == 1:
            return x.detach()
        return self.all_gather(x.detach()).sum(0)

    def mean(self, total: Tensor, count: Tensor) -> Tensor:
        """This process's share of a mean over every process's items: its ``total`` over the
        processes' summed ``count``, times their number (data-parallel training averages gradients)."""
        return total * self.world_size / self.total(count).clamp_min(1)

    def longest(self, length: int, device: torch.device | None = None) -> int:
        """The largest ``length`` of any process (e.g. the width one process with the whole batch
        would have padded its texts to)."""
        if self.world_size == 1:
            return length
        return int(self.gather(torch.tensor([length], device=device)).max())

    def rows(self, b: int) -> slice:
        """This process's rows of a global batch of ``b`` rows per process."""
        return slice(self.rank * b, (self.rank + 1) * b)

    def rand(self, b: int, *shape: int, device: torch.device | None = None) -> Tensor:
        """Uniform numbers (b, *shape): this process's rows of those drawn for the global batch."""
        return torch.rand(b * self.world_size, *shape, generator=self.generator, device=device)[self.rows(b)]

    def randint(self, high: int, b: int, *shape: int, device: torch.device | None = None) -> Tensor:
        """Integers in [0, high) (b, *shape), drawn like :meth:`rand`."""
        full = torch.randint(high, (b * self.world_size, *shape), generator=self.generator, device=device)
        return full[self.rows(b)]

    def multinomial(self, weights: Tensor) -> Tensor:
        """One index per row of this process's rows, drawn from the global batch's ``weights``
        (B, M), every row drawn as one process would (B,) -> (b,)."""
        b = weights.shape[0] // self.world_size
        return torch.multinomial(weights, 1, generator=self.generator).squeeze(1)[self.rows(b)]
