"""``mmtx-caption``: caption image files, or every image in a folder; print each caption or write
them all as COCO results (``predictions=FILE``), and, with ``attention=DIR``, draw where each
word was read from in the image."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("caption")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="caption")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.caption import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
