"""``mmtx-eval``: evaluate a checkpoint; print a table, write metrics and predictions as JSON."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("eval")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.eval import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
