"""``mmtx-shards``: write a caption data set (COCO, Karpathy, your own pairs) or VQA v2 files as
WebDataset tar shards for ``data=webdataset`` / ``data=webdataset_vqa``, the images re-encoded at
a training size."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from mmtx.commands.common import absolute_data_paths, to_container
from mmtx.config_check import ConfigError, check_shards_config
from mmtx.data.shards.files import SHARD_LIST
from mmtx.data.shards.write import caption_samples, vqa_samples, write_shard_list, write_shards
from mmtx.data.splits import SPLITS
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.vqa import VqaDataModule


def write(cfg: DictConfig) -> Path:
    """Write every split the data config has files for; returns the shard list's path."""
    check_shards_config(cfg)
    absolute_data_paths(cfg.data)
    # the records only: no tokenizer is learned and no image is decoded before writing
    datamodule = instantiate(cfg.data, tokenizer=Tokenizer.train)
    if not any(datamodule.has_split(split) for split in SPLITS):
        raise ConfigError(
            "the data config names no split's files: give e.g. data.train.annotations=... data.train.images=..."
        )
    out = Path(cfg.out)
    settings = {"data": to_container(cfg.data), "shard_size": cfg.shard_size, "image_size": cfg.image_size,
                "quality": cfg.quality}  # fmt: skip
    listed = out / SHARD_LIST
    if listed.exists():  # a run to finish, or one already done: only with the same settings
        if json.loads(listed.read_text()).get("settings") != settings:
            raise ConfigError(
                f"out={out} holds shards written with other settings (see {listed}); "
                "choose another out= or delete that folder"
            )
    elif out.exists() and any(out.iterdir()):
        raise ConfigError(f"out={out} is not empty; choose a new folder")
    write_shard_list(out, {}, settings)  # the settings first: an interrupted run resumes only with them

    vqa = isinstance(datamodule, VqaDataModule)
    samples = vqa_samples if vqa else caption_samples
    splits = {}
    for split in SPLITS:
        if datamodule.has_split(split):
            splits[split] = written = write_shards(
                samples(datamodule.records(split)),
                out,
                split,
                shard_size=cfg.shard_size,
                image_size=cfg.image_size,
                quality=cfg.quality,
                skip_bad_images=datamodule.on_bad_image == "skip",
            )
            print(
                f"{split}: {written['samples']} samples in {len(written['shards'])} shard(s)"
                + (f", {len(written['left_out'])} image(s) left out" if written["left_out"] else "")
            )
    path = write_shard_list(out, splits, settings)
    data = "webdataset_vqa" if vqa else "webdataset"
    print(f"shard list: {path} (train with data={data} data.train.shards={path}:train data.val.shards={path}:val)")
    return path


def run(cfg: DictConfig) -> None:
    """Write the data config's splits as WebDataset shards (`write`)."""
    write(cfg)
