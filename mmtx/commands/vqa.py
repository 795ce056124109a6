"""``mmtx-vqa``: answer a question about an image, or a whole official questions file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig

from mmtx.attention_maps import attention_grid, question_maps, write_png
from mmtx.checkpoint import CheckpointError, load_task
from mmtx.commands.common import image_size
from mmtx.config_check import ConfigError
from mmtx.data.images import read_image
from mmtx.data.transforms import build_resize, normalize_images
from mmtx.data.vqa.files import read_vqa
from mmtx.tasks.vqa import AnswerTask


def answer_questions(
    task: AnswerTask, pairs: list[tuple[str | Path, str]], image_size: int, batch_size: int, k: int
) -> list[list[tuple[str, float]]]:
    """The top ``k`` (answer, score) for each (image file, question), in order."""
    resize = build_resize(image_size)
    results = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        pixels = torch.stack([resize(read_image(path)) for path, _ in chunk])
        results += task.answer(*model_inputs(task, pixels, [q for _, q in chunk]), k=k)
    return results


def model_inputs(task: AnswerTask, pixels: torch.Tensor, questions: list[str]) -> tuple[torch.Tensor, ...]:
    """The model's inputs on its device: uint8 images (B, 3, S, S) normalised, the questions' ids and mask."""
    ids, mask = task.tokenizer.encode_batch(questions, task.model.backbone.text.max_length)
    return normalize_images(pixels.to(task.device)), ids.to(task.device), mask.to(task.device)


def run(cfg: DictConfig) -> None:
    """Answer ``question`` about ``image``, or every question of ``questions`` into ``predictions``."""
    if not (cfg.questions and cfg.images) and not (cfg.image and cfg.question):  # before loading anything
        given = ", ".join(k for k in ("image", "question", "questions", "images") if cfg.get(k)) or "neither"
        raise ConfigError(f'give image=FILE question="..." or questions=FILE.json images=DIR (given: {given})')
    task = load_task(cfg.ckpt, map_location=cfg.device)
    if not isinstance(task, AnswerTask):
        raise CheckpointError(f"{cfg.ckpt} is a {type(task).__name__} checkpoint, not a VQA one (task=vqa)")
    size = image_size(task, cfg.image_size)
    if cfg.questions:
        records = read_vqa(cfg.questions, None, cfg.images)
        top = answer_questions(task, [(r.path, r.question) for r in records], size, cfg.batch_size, 1)
        results = [{"question_id": r.question_id, "answer": t[0][0]} for r, t in zip(records, top)]
        Path(cfg.predictions).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.predictions).write_text(json.dumps(results))
        print(f"answered {len(results)} questions: {cfg.predictions}")
    else:
        pixels = build_resize(size)(read_image(cfg.image))
        inputs = model_inputs(task, pixels[None], [cfg.question])
        top = task.answer(*inputs, k=cfg.top_k)[0]
        for answer, score in top:
            print(f"{score:.4f}\t{answer}")
        if cfg.get("attention"):  # the image with the question, and where it looked under the answer
            maps = question_maps(task.model, *inputs).cpu()
            grid = attention_grid(pixels, cfg.question, [top[0][0]], maps, columns=2)
            print(f"attention map: {write_png(grid, Path(cfg.attention), Path(cfg.image).stem)}")
