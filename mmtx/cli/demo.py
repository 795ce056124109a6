"""``mmtx-demo``: a local web page to try a checkpoint (Gradio, the extra ``mmtx[demo]``);
what the page does and how it treats uploads: `mmtx.commands.demo`."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("demo")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="demo")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.demo import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
