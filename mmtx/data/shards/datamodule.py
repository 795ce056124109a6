"""WebDataset tar shards as data modules: captions (captioning and pretraining read them alike) and VQA."""

from __future__ import annotations

from mmtx.data.annotations import TextLimit
from mmtx.data.captions.datamodule import CaptionDataModule
from mmtx.data.captions.files import CaptionRecord
from mmtx.data.shards.files import read_shards, read_vqa_shards
from mmtx.data.splits import FileSplits, split_files
from mmtx.data.vqa.datamodule import VqaDataModule
from mmtx.data.vqa.files import VqaRecord


class ShardCaptions(FileSplits, CaptionDataModule):
    """Image-caption samples in tar shards: ``{split: {shards: a path, a brace pattern, a list or
    mmtx-shards' shards.json}}``. Images are not scanned before training (a million of them would
    be decoded twice): one that fails to decode follows ``on_bad_image`` where it is met."""

    index_file = "shards"
    preflight_scan = False

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[CaptionRecord]:
        return read_shards(split_files(self.splits, split, ("shards",))["shards"], skipped=skipped, limit=limit)


class ShardVqa(FileSplits, VqaDataModule):
    """VQA samples in tar shards, each image with its questions and answers in its ``.json``
    (`mmtx.data.shards.files.read_vqa_shards`); the splits and images as in `ShardCaptions`."""

    index_file = "shards"
    preflight_scan = False

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[VqaRecord]:
        return read_vqa_shards(split_files(self.splits, split, ("shards",))["shards"], skipped=skipped, limit=limit)
