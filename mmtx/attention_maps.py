"""Where a model looked: a captioner's cross-attention over the image per generated word, and a
VQA model's co-attention of the question over the image.

The weights are captured by forward hooks on a teacher-forced re-run of the generated tokens,
after generation, so the shared attention stays plain ``F.scaled_dot_product_attention`` (which
returns no weights) and decoding costs nothing more when no map is asked for.

A word's map is the mean over heads of the last decoder block's cross-attention when that word
was predicted: the block whose output the next-token head reads. (Attention rollout multiplies
the self-attention of one stream's layers; the image tokens a decoder attends to are the
encoder's final ones, each already a mix of patches, which no product over decoder layers
undoes: the map says which image tokens the word was read from, each shown at its patch.)
A question's map is the last co-attention layer's attention from the question's tokens to the
image tokens, averaged over heads and over the question's tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import Tensor

from mmtx.models.decoder import CaptionDecoder
from mmtx.models.text import mean_of_tokens
from mmtx.nn.attention import Attention


@torch.no_grad()
def attention_weights(modules: list[Attention], run: Callable[[], Any]) -> Tensor:
    """The weights (B, L, H, T, S) that each of the cross-attention ``modules`` computes while
    ``run()`` runs; each row sums to 1 over the S context tokens."""
    captured: list[Tensor] = []

    def record(module: Attention, args: tuple, kwargs: dict, output: Tensor) -> None:
        x, context = args[0], args[1] if len(args) > 1 else kwargs["context"]
        q = module._heads(module.q(x), 1)[0]  # (B, H, T, Dh)
        k = module._heads(module.kv(context), 2)[0]  # (B, H, S, Dh)
        if kwargs.get("context_index") is not None:  # fewer context rows than query rows
            k = k[kwargs["context_index"]]
        scores = (q.float() @ k.float().transpose(-1, -2)) * module.head_dim**-0.5
        mask = kwargs.get("key_padding_mask")
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        captured.append(scores.softmax(-1))

    hooks = [m.register_forward_hook(record, with_kwargs=True) for m in modules]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(captured, dim=1)


def cross_attention(
    decoder: CaptionDecoder, input_ids: Tensor, context: Tensor, context_mask: Tensor | None = None
) -> Tensor:
    """Every decoder block's cross-attention weights (B, L, H, T, S) for a teacher-forced pass of
    ``input_ids`` (B, T) over ``context`` (B, S, D)."""
    modules = [b.cross_attn for b in decoder.body.blocks if b.cross_attn is not None]
    return attention_weights(modules, lambda: decoder(input_ids, context, context_mask=context_mask))


@torch.no_grad()
def question_maps(model: Any, images: Tensor, input_ids: Tensor, mask: Tensor) -> Tensor:
    """A VQA model's map of each question (B, h, w) over its image: the last co-attention layer's
    question-to-image weights, averaged over heads and the question's tokens, over the patches."""
    backbone = model.backbone
    modules = [layer.text_cross.cross_attn for layer in backbone.co_layers]
    if not modules:
        raise ValueError("the model has no co-attention layer: nothing relates the question to the image")
    weights = attention_weights(modules, lambda: model(images, input_ids, mask))[:, -1].mean(1)  # (B, T, S)
    per_question = mean_of_tokens(weights, mask)  # (B, S)
    grid = backbone.vision.patch_embed.grid(*images.shape[-2:])
    return word_maps(per_question[:, None, None, None], grid)[:, 0]


def word_maps(weights: Tensor, grid: tuple[int, int], prefix: int = 1) -> Tensor:
    """Per query position, the map over the patch grid (B, T, h, w): the last block's weights
    (B, L, H, T, S) averaged over heads, the ``prefix`` non-patch tokens (CLS) dropped and the
    rest renormalised to sum to 1 over the patches."""
    last = weights[:, -1].mean(dim=1)[..., prefix:]  # (B, T, h*w)
    last = last / last.sum(-1, keepdim=True).clamp_min(1e-12)
    return last.unflatten(-1, grid)


@torch.no_grad()
def caption_maps(task, images: Tensor, ids: Tensor) -> list[tuple[list[str], Tensor]]:
    """For each image (B, 3, H, W) and its generated ``ids`` (B, L: no BOS, padded after EOS)
    from a `CaptionTask`: its tokens as text and their maps (n, h, w), one per token up to EOS."""
    tok, model = task.tokenizer, task.model
    bos = torch.full_like(ids[:, :1], tok.bos_id)
    context = model.encode(images)
    grid = model.encoder.patch_embed.grid(*images.shape[-2:])
    maps = word_maps(cross_attention(model.decoder, torch.cat([bos, ids], 1), context), grid)
    out = []
    for row, row_maps in zip(ids.tolist(), maps):
        n = next((i for i, t in enumerate(row) if t in (tok.eos_id, tok.pad_id)), len(row))
        words = [tok.backend.id_to_token(t) or "?" for t in row[:n]]
        out.append((words, row_maps[:n].cpu()))  # the query at position i predicted token i
    return out


# "inferno"-like: black, purple, red, orange, pale yellow
_HEAT = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float32)


def heat(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (h, w) -> RGB uint8 (h, w, 3) along a perceptual dark-to-bright scale."""
    position = np.clip(values, 0, 1) * (len(_HEAT) - 1)
    low = np.floor(position).astype(int).clip(0, len(_HEAT) - 2)
    frac = (position - low)[..., None]
    return ((1 - frac) * _HEAT[low] + frac * _HEAT[low + 1]).astype(np.uint8)


def overlay(image: Tensor, word_map: Tensor, alpha: float = 0.55) -> Image.Image:
    """The uint8 image (3, H, W) with ``word_map`` (h, w) upsampled onto it as a heat map."""
    H, W = image.shape[-2:]
    up = F.interpolate(word_map[None, None].float(), size=(H, W), mode="bilinear", align_corners=False)[0, 0]
    up = (up / up.max().clamp_min(1e-12)).numpy()
    pixels = image.permute(1, 2, 0).numpy().astype(np.float32)
    return Image.fromarray(((1 - alpha) * pixels + alpha * heat(up)).astype(np.uint8))


def attention_grid(image: Tensor, caption: str, words: list[str], maps: Tensor, columns: int = 4,
                   panel: int = 160) -> Image.Image:  # fmt: skip
    """One PNG-ready picture: the image with its caption, then a panel per word with its heat map."""
    rows = -(-(len(words) + 1) // columns)
    label = 18
    sheet = Image.new("RGB", (columns * panel, rows * (panel + label)), "white")
    draw = ImageDraw.Draw(sheet)
    plain = Image.fromarray(image.permute(1, 2, 0).numpy())
    panels = [(plain, caption)] + [(overlay(image, m), w) for w, m in zip(words, maps)]
    for k, (picture, text) in enumerate(panels):
        x, y = (k % columns) * panel, (k // columns) * (panel + label)
        sheet.paste(picture.resize((panel, panel), Image.Resampling.BICUBIC), (x, y + label))
        draw.text((x + 3, y + 3), text if len(text) <= 26 else text[:25] + "…", fill="black")
    return sheet


def write_png(picture: Image.Image, folder: Path, stem: str) -> Path:
    """Save ``picture`` as ``folder/stem.png`` (``stem_2.png``... when the name is taken: two
    images of one name from different folders)."""
    folder.mkdir(parents=True, exist_ok=True)
    target, n = folder / f"{stem}.png", 1
    while target.exists():
        n += 1
        target = folder / f"{stem}_{n}.png"
    picture.save(target)
    return target
