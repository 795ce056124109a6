"""``mmtx-caption``: print a caption for each image file (and, with ``attention=DIR``, write
where each word was read from in the image)."""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from mmtx.attention_maps import attention_grid, caption_maps, write_png
from mmtx.checkpoint import load_task
from mmtx.cli.common import CONFIG_DIR, friendly_errors, generation_override, image_size
from mmtx.data.images import read_image
from mmtx.data.transforms import build_resize, normalize_images


def caption_files(cfg: DictConfig) -> list[str]:
    """Captions for ``cfg.images`` in order, made by the checkpoint's model; with
    ``cfg.attention`` a folder, one PNG per image there: the caption and a heat map per word."""
    task = load_task(cfg.ckpt, map_location=cfg.device)
    task.generation = generation_override(task.generation, cfg.generation)
    resize = build_resize(image_size(task, cfg.image_size))
    paths = [cfg.images] if isinstance(cfg.images, str) else list(cfg.images)
    folder = Path(cfg.attention) if cfg.get("attention") else None
    captions: list[str] = []
    for start in range(0, len(paths), cfg.batch_size):
        chunk = paths[start : start + cfg.batch_size]
        pixels = torch.stack([resize(read_image(p)) for p in chunk])  # uint8 (B, 3, S, S)
        images = normalize_images(pixels.to(cfg.device))
        ids = task.generate_ids(images)
        texts = task.tokenizer.decode_batch(ids.cpu())
        captions += texts
        if folder is not None:
            for path, image, text, (words, word_maps) in zip(chunk, pixels, texts, caption_maps(task, images, ids)):
                write_png(attention_grid(image, text, words, word_maps), folder, Path(path).stem)
    return captions


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="caption")
@friendly_errors
def main(cfg: DictConfig) -> None:
    paths = [cfg.images] if isinstance(cfg.images, str) else list(cfg.images)
    for path, caption in zip(paths, caption_files(cfg)):
        print(f"{path}\t{caption}")
    if cfg.get("attention"):
        print(f"attention maps: {cfg.attention}")


if __name__ == "__main__":
    main()
