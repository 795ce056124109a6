"""``mmtx-caption``: caption image files, or every image in a folder; print each caption or write
them all as COCO results (``predictions=FILE``), and, with ``attention=DIR``, draw where each
word was read from in the image."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from mmtx.attention_maps import attention_grid, caption_maps, write_png
from mmtx.checkpoint import load_task
from mmtx.commands.common import generation_override, image_size
from mmtx.config_check import ConfigError
from mmtx.data.images import ImageLoadError, read_image
from mmtx.data.transforms import build_resize, normalize_images
from mmtx.data.vqa.files import image_id_from_name

ID_NAMES = "COCO_val2014_000000123456.jpg or 123456.jpg"  # the file names COCO image ids are read from


def image_paths(images: str | list[str]) -> tuple[list[str], bool]:
    """The files ``images`` names, and whether it named a folder: a list of files, one file, or a
    folder, whose files are taken sorted by name (its subfolders' and hidden files are not)."""
    if isinstance(images, str) and Path(images).is_dir():
        files = sorted(p for p in Path(images).iterdir() if p.is_file() and not p.name.startswith("."))
        return [str(p) for p in files], True
    return ([images] if isinstance(images, str) else [str(p) for p in images]), False


def caption_images(cfg: DictConfig, paths: list[str], skip_bad: bool) -> Iterator[tuple[str, str]]:
    """(file, caption) for each of ``paths`` in order, made by the checkpoint's model a batch at a
    time (what is held at once is one batch), with a progress bar on the terminal. With
    ``skip_bad``, a file that is not an image mmtx reads is left out with one line naming it;
    else it stops the run. With ``cfg.attention`` a folder, one PNG per image there: the caption
    and a heat map per word."""
    task = load_task(cfg.ckpt, map_location=cfg.device)
    task.generation = generation_override(task.generation, cfg.generation)
    resize = build_resize(image_size(task, cfg.image_size))
    folder = Path(cfg.attention) if cfg.get("attention") else None
    with tqdm(total=len(paths), desc="captioning", unit="img", file=sys.stderr, disable=None, leave=False) as bar:
        for start in range(0, len(paths), cfg.batch_size):
            chunk, read = [], []
            for path in paths[start : start + cfg.batch_size]:
                try:
                    read.append(resize(read_image(path)))  # the full-size image is dropped here
                    chunk.append(path)
                except ImageLoadError as err:
                    if not skip_bad:
                        raise
                    tqdm.write(f"skipped {err.path}: {err.reason}", file=sys.stderr)
            if chunk:
                pixels = torch.stack(read)  # uint8 (B, 3, S, S)
                images = normalize_images(pixels.to(cfg.device))
                ids = task.generate_ids(images)
                texts = task.tokenizer.decode_batch(ids.cpu())
                if folder is not None:
                    maps = caption_maps(task, images, ids)
                    for path, image, text, (words, word_maps) in zip(chunk, pixels, texts, maps):
                        write_png(attention_grid(image, text, words, word_maps), folder, Path(path).stem)
                yield from zip(chunk, texts)
            bar.update(len(paths[start : start + cfg.batch_size]))


def with_image_ids(paths: list[str], predictions: str) -> dict[str, int]:
    """{file: its COCO image id} for the ``paths`` whose names carry one; the others are left out
    with a line each. An error when none does, or when two files have one id."""
    ids: dict[str, int] = {}
    named: dict[int, str] = {}
    for path in paths:
        image_id = image_id_from_name(Path(path).name)
        if image_id is None:
            print(f"skipped {path}: no COCO image id in its name ({ID_NAMES})", file=sys.stderr)
        elif image_id in named:
            raise ConfigError(f"predictions={predictions}: {named[image_id]} and {path} are both image {image_id}")
        else:
            ids[path] = named[image_id] = image_id
    if paths and not ids:
        raise ConfigError(
            f"predictions={predictions}: COCO results need image ids, read from the file names "
            f"({ID_NAMES}); no image here is named so, e.g. {Path(paths[0]).name}"
        )
    return ids


def run(cfg: DictConfig) -> None:
    """Caption the files of ``images``: print each caption, or write them all to ``predictions``."""
    paths, from_folder = image_paths(cfg.images)
    if not paths:
        raise ConfigError(f"images={cfg.images}: no files in that folder")
    if not cfg.predictions:
        for path, caption in caption_images(cfg, paths, skip_bad=from_folder):
            tqdm.write(f"{path}\t{caption}")  # beside the progress bar
    else:  # before the model is loaded: the files' image ids
        ids = with_image_ids(paths, cfg.predictions)
        results = [
            {"image_id": ids[path], "caption": caption}
            for path, caption in caption_images(cfg, list(ids), skip_bad=from_folder)
        ]
        Path(cfg.predictions).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.predictions).write_text(json.dumps(results))
        print(f"captioned {len(results)} of {len(paths)} files: {cfg.predictions}")
    if cfg.get("attention"):
        print(f"attention maps: {cfg.attention}")
