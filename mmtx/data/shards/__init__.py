"""WebDataset tar shards: reading them (`files`), their data modules (`datamodule`), writing them (`write`)."""

from mmtx.data.shards.datamodule import ShardCaptions, ShardVqa
from mmtx.data.shards.files import read_shards, read_vqa_shards, shard_paths

__all__ = ["ShardCaptions", "ShardVqa", "read_shards", "read_vqa_shards", "shard_paths"]
