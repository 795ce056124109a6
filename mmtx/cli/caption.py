"""``mmtx-caption``: print a caption for each image file."""

from __future__ import annotations


import hydra
import torch
from omegaconf import DictConfig

from mmtx.checkpoint import load_task
from mmtx.cli.common import CONFIG_DIR, friendly_errors, generation_override
from mmtx.data.images import read_image
from mmtx.data.transforms import build_transforms


def caption_files(cfg: DictConfig) -> list[str]:
    """Captions for ``cfg.images`` in order, made by the checkpoint's model."""
    task = load_task(cfg.ckpt, map_location=cfg.device)
    task.generation = generation_override(task.generation, cfg.generation)
    transform = build_transforms(cfg.image_size or task.model.encoder.image_size, train=False)
    paths = [cfg.images] if isinstance(cfg.images, str) else list(cfg.images)
    captions = []
    for start in range(0, len(paths), cfg.batch_size):
        batch = torch.stack([transform(read_image(p)) for p in paths[start : start + cfg.batch_size]])
        captions += task.caption(batch.to(cfg.device))
    return captions


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="caption")
@friendly_errors
def main(cfg: DictConfig) -> None:
    paths = [cfg.images] if isinstance(cfg.images, str) else list(cfg.images)
    for path, caption in zip(paths, caption_files(cfg)):
        print(f"{path}\t{caption}")


if __name__ == "__main__":
    main()
