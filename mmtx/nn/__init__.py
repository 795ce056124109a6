"""Shared building blocks: one attention, one block, the embeddings and positions."""

from mmtx.nn.attention import Attention, KVCache
from mmtx.nn.blocks import BlockCache, CoAttentionLayer, CrossAttentionBlock, Mlp, TransformerBlock
from mmtx.nn.embeddings import PatchEmbed, resample_positions, sinusoidal_1d, sinusoidal_2d
from mmtx.nn.rotary import Rotary, apply_rotary
from mmtx.nn.where_attention import WhereCrossAttention

__all__ = [
    "Attention",
    "BlockCache",
    "CoAttentionLayer",
    "CrossAttentionBlock",
    "KVCache",
    "Mlp",
    "PatchEmbed",
    "Rotary",
    "TransformerBlock",
    "WhereCrossAttention",
    "apply_rotary",
    "resample_positions",
    "sinusoidal_1d",
    "sinusoidal_2d",
]
