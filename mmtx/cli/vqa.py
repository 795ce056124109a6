"""``mmtx-vqa``: answer a question about an image, or a whole official questions file."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("vqa")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="vqa")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.vqa import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
