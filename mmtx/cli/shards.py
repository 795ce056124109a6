"""``mmtx-shards``: write a caption data set (COCO, Karpathy, your own pairs) or VQA v2 files as
WebDataset tar shards for ``data=webdataset`` / ``data=webdataset_vqa``, the images re-encoded at
a training size."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("shards")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="shards")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.shards import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
