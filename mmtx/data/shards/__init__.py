"""WebDataset tar shards: reading them (`files`), their data module (`datamodule`), writing them (`write`)."""

from mmtx.data.shards.datamodule import ShardCaptions
from mmtx.data.shards.files import read_shards, shard_paths

__all__ = ["ShardCaptions", "read_shards", "shard_paths"]
