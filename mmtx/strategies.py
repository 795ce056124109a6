"""Distributed strategies with mmtx's transformer block as their unit."""

from __future__ import annotations

from typing import Literal

from lightning.pytorch.strategies import FSDPStrategy

from mmtx.nn.blocks import TransformerBlock


def fsdp(
    activation_checkpointing: bool = False,
    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD",
    state_dict_type: Literal["full", "sharded"] = "full",
    cpu_offload: bool = False,
) -> FSDPStrategy:
    """Lightning's FSDP sharding each :class:`TransformerBlock` (a ViLBERT co-attention layer's
    four blocks each) as its own unit; embeddings and heads stay in the root unit, so tied
    weights stay together.

    Args:
        activation_checkpointing: recompute each block's activations in the backward pass
            instead of keeping them (much less memory, about a third more compute).
        sharding_strategy: ``FULL_SHARD`` (ZeRO-3), ``SHARD_GRAD_OP`` (ZeRO-2), ``HYBRID_SHARD``
            (full within a node, replicated across nodes), ``NO_SHARD`` (DDP-like).
        state_dict_type: ``full`` writes one ordinary ``last.ckpt`` (gathered on rank 0, loadable
            by mmtx-eval); ``sharded`` writes a folder of shards (faster for very large models).
    """
    blocks = {TransformerBlock}
    return FSDPStrategy(
        auto_wrap_policy=blocks,
        activation_checkpointing_policy=blocks if activation_checkpointing else None,
        sharding_strategy=sharding_strategy,
        state_dict_type=state_dict_type,
        cpu_offload=cpu_offload,
    )
