"""``mmtx-export``: write a checkpoint as safetensors weights, a JSON config and its tokenizer, in
mmtx's format or as a transformers VisionEncoderDecoderModel."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("export")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.export import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
