"""Distributed strategies with mmtx's transformer block as their unit."""

from __future__ import annotations

from typing import Literal

from lightning.pytorch.strategies import FSDPStrategy

from mmtx.nn.blocks import BLOCKS


def fsdp(
    activation_checkpointing: bool = False,
    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD",
    state_dict_type: Literal["full"] = "full",
    cpu_offload: bool = False,
) -> FSDPStrategy:
    """Lightning's FSDP sharding each residual block (`mmtx.nn.blocks.BLOCKS`; a ViLBERT
    co-attention layer's four blocks each) as its own unit; embeddings and heads stay in the root unit, so tied
    weights stay together.

    Args:
        activation_checkpointing: recompute each block's activations in the backward pass
            instead of keeping them (much less memory, about a third more compute).
        sharding_strategy: ``FULL_SHARD`` (ZeRO-3), ``SHARD_GRAD_OP`` (ZeRO-2), ``HYBRID_SHARD``
            (full within a node, replicated across nodes), ``NO_SHARD`` (DDP-like).
        state_dict_type: ``full`` writes one ordinary ``last.ckpt`` (gathered on rank 0, written
            atomically, loadable by mmtx-eval and resumable with ``ckpt_path=``). Lightning's
            ``sharded`` folders are refused: they are written in place, where a kill leaves a
            half-written folder, and mmtx cannot resume or check them.
    """
    if state_dict_type != "full":
        raise ValueError(
            f"state_dict_type={state_dict_type!r} is not supported: use 'full' (one checkpoint file, written "
            "atomically, resumable with ckpt_path=); sharded folders are written in place and cannot be resumed"
        )
    blocks = set(BLOCKS)
    return FSDPStrategy(
        auto_wrap_policy=blocks,
        activation_checkpointing_policy=blocks if activation_checkpointing else None,
        sharding_strategy=sharding_strategy,
        state_dict_type=state_dict_type,
        cpu_offload=cpu_offload,
    )
