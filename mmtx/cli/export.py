"""``mmtx-export``: write a checkpoint as safetensors weights, a JSON config and its tokenizer."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mmtx.checkpoint import load_task
from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors
from mmtx.export import export_task


@check_override_keys("export")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
@friendly_errors
def main(cfg: DictConfig) -> None:
    out = export_task(load_task(cfg.ckpt), cfg.out)
    print(f"exported {cfg.ckpt} to {out}/ (model.safetensors, config.json, tokenizer.json)")


if __name__ == "__main__":
    main()
