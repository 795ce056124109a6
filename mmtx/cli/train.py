"""``mmtx-train``: train a model from a Hydra config (``mmtx-train --help`` lists the groups)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("train")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
@friendly_errors
def main(cfg: DictConfig) -> float | None:
    from mmtx.commands.train import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
