"""Collecting evaluation outputs from every process, each example counted once."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch.strategies import Strategy


def gather_unique(items: list[dict[str, Any]], key: str, strategy: Strategy) -> list[dict[str, Any]]:
    """All processes' ``items``, deduplicated by ``items[key]`` and sorted by it.

    A DistributedSampler pads the last batches with repeated examples so every process gets the
    same number; dropping repeats keeps the metrics identical to a single-process run.
    """
    if strategy.world_size > 1 and dist.is_available() and dist.is_initialized():
        parts: list[list[dict[str, Any]]] = [None] * strategy.world_size  # type: ignore[list-item]
        dist.all_gather_object(parts, items)
        items = [item for part in parts for item in part]
    unique = {item[key]: item for item in items}
    return [unique[k] for k in sorted(unique)]
