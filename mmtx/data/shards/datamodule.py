"""WebDataset tar shards as a caption data module (captioning and pretraining read it alike)."""

from __future__ import annotations

from mmtx.data.base import FileSplits, split_files
from mmtx.data.captions.datamodule import CaptionDataModule
from mmtx.data.captions.files import CaptionRecord
from mmtx.data.shards.files import read_shards


class ShardCaptions(FileSplits, CaptionDataModule):
    """Image-caption samples in tar shards: ``{split: {shards: a path, a brace pattern, a list or
    mmtx-shards' shards.json}}``. Images are not scanned before training (a million of them would
    be decoded twice): one that fails to decode follows ``on_bad_image`` where it is met."""

    index_file = "shards"
    preflight_scan = False

    def load_records(self, split: str, skipped: list[str]) -> list[CaptionRecord]:
        return read_shards(split_files(self.splits, split, ("shards",))["shards"], skipped=skipped)
