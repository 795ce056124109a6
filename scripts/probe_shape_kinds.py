"""Does a checkpoint's image encoder see which shape kinds a shapes scene holds? A linear probe.

For each checkpoint (a captioner, a two-stream pretraining or a VQA run), the image encoder's own
output on shapes scenes (before any co-attention: the CLS token, and the mean and the maximum of
the patch tokens) is fitted by a logistic regression per kind (circle, square, triangle: is
there one in the scene?) on ``--train`` scenes and scored on ``--val`` other scenes. Prints ONE
JSON line: the share of scenes each probe gets right, and the majority-class baseline::

    python scripts/probe_shape_kinds.py RUN_A/checkpoints/last.ckpt RUN_B/checkpoints/last.ckpt

``--fresh SECONDS`` adds a reference row: ``experiment=vqa_shapes``'s vision stream, freshly
initialised and trained for SECONDS on the kind labels of the probe's training scenes (a linear
layer on the same pooled features, AdamW at that preset's learning rate, batches of 64 scenes,
bf16 autocast where the CPU has native bf16), then probed like the checkpoints: what the
architecture learns of the kinds when it is told them directly. ``--override KEY=VALUE`` (repeatable)
changes that stream's config first, to compare variants in seconds, e.g.
``--fresh 16 --override model.backbone.vision.depth=2``.

Why: VQA and retrieval on shapes fail where a question or a caption turns on a shape's kind,
while the captioner names kinds right; the probe says whether the encoder has the kinds at all.
The scenes are drawn as the shapes VQA data set draws them (its own seeds), so no data set is read.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mmtx.checkpoint import load_task
from mmtx.data.synthetic.scenes import KINDS
from mmtx.data.synthetic.shapes import draw_scene
from mmtx.data.transforms import build_transforms
from mmtx.hardware import cpu_has_native_bf16


def scenes(split: str, count: int, image_size: int) -> tuple[Tensor, Tensor]:
    """Normalised images (count, 3, S, S) and kind-presence labels (count, len(KINDS))."""
    transform = build_transforms(image_size, train=False)
    images, labels = [], []
    for index in range(count):
        image, _, scene = draw_scene(random.Random(f"mmtx-shapes-vqa/0/{split}/{index}"), image_size, num_captions=1)
        images.append(transform(image))
        labels.append([float(any(shape.kind == kind for shape in scene.shapes)) for kind in KINDS])
    return torch.stack(images), torch.tensor(labels)


def pooled(tokens: Tensor) -> Tensor:
    """[CLS; mean of patches; max of patches] of encoder tokens (B, 1 + N, dim) -> (B, 3 * dim)."""
    return torch.cat([tokens[:, 0], tokens[:, 1:].mean(1), tokens[:, 1:].amax(1)], dim=-1).float()


@torch.no_grad()
def image_features(encode: Callable[[Tensor], Tensor], images: Tensor, chunk: int = 250) -> Tensor:
    """`pooled` tokens of ``encode`` (images -> tokens) over ``images``, in chunks (B, 3 * dim)."""
    return torch.cat([pooled(encode(images[s : s + chunk])) for s in range(0, len(images), chunk)])


def checkpoint_encoder(task: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    """The image encoder of a task: a captioner's encoder, or a two-stream model's vision
    stream (its own blocks, then its norm: before any co-attention)."""
    model = task.model
    if hasattr(model, "backbone"):
        return lambda images: model.backbone.vision.norm(model.backbone.encode_vision(images)[0])
    return model.encoder


def fresh_encoder(
    images: Tensor, labels: Tensor, seconds: float, image_size: int, overrides: list[str]
) -> Callable[[Tensor], Tensor]:
    """``experiment=vqa_shapes``'s vision stream (with Hydra ``overrides``) trained from scratch for
    ``seconds`` on the kind labels directly (a linear layer on its `pooled` tokens, binary
    cross-entropy per kind)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from mmtx.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="train", overrides=["experiment=vqa_shapes", f"data.image_size={image_size}", *overrides]
        )
    encoder = instantiate(cfg.model.backbone.vision)
    head = torch.nn.Linear(3 * encoder.dim, labels.shape[1])
    params = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.task.lr, weight_decay=cfg.task.weight_decay)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=cpu_has_native_bf16())
    start, steps = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        batch = torch.randint(0, len(images), (64,))
        with autocast:
            logits = head(pooled(encoder(images[batch])))
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    print(f"[probe] fresh encoder: {steps} steps in {seconds:g} s", file=sys.stderr, flush=True)
    return encoder.eval()


def probe_accuracy(train: Tensor, train_labels: Tensor, val: Tensor, val_labels: Tensor) -> list[float]:
    """Fit one standardised logistic regression per label column (L-BFGS, a little L2); the
    share of ``val`` rows each gets right."""
    mean, std = train.mean(0), train.std(0) + 1e-5
    train, val = (train - mean) / std, (val - mean) / std
    weight = torch.zeros(train.shape[1], train_labels.shape[1], requires_grad=True)
    bias = torch.zeros(train_labels.shape[1], requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=300)

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(train @ weight + bias, train_labels) + 1e-3 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return (((val @ weight + bias) > 0).float() == val_labels).float().mean(0).tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="mmtx-train checkpoints (.ckpt)")
    parser.add_argument("--train", type=int, default=1500, help="scenes the probes are fitted on")
    parser.add_argument("--val", type=int, default=300, help="other scenes they are scored on")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument(
        "--fresh",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also train experiment=vqa_shapes's vision stream on the kind labels for SECONDS, then probe it",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override of the --fresh encoder's config (repeatable), e.g. model.backbone.vision.depth=2",
    )
    args = parser.parse_args(argv)
    if args.train < 2 or args.val < 1 or args.fresh < 0:
        parser.error("--train must be at least 2, --val at least 1 and --fresh not negative")
    if args.override and not args.fresh:
        parser.error("--override changes the --fresh stream's config: give --fresh SECONDS too")
    if not args.checkpoints and not args.fresh:
        parser.error("give checkpoints to probe, --fresh SECONDS, or both")
    torch.manual_seed(0)
    x_train, y_train = scenes("train", args.train, args.image_size)
    x_val, y_val = scenes("val", args.val, args.image_size)
    result = {"kinds": list(KINDS), "majority": [round(max(p, 1 - p), 3) for p in y_val.mean(0).tolist()]}
    for path in args.checkpoints:
        print(f"[probe] {path}", file=sys.stderr, flush=True)
        encode = checkpoint_encoder(load_task(path))
        accuracy = probe_accuracy(image_features(encode, x_train), y_train, image_features(encode, x_val), y_val)
        result[path] = [round(a, 3) for a in accuracy]
    if args.fresh:
        encode = fresh_encoder(x_train, y_train, args.fresh, args.image_size, args.override)
        accuracy = probe_accuracy(image_features(encode, x_train), y_train, image_features(encode, x_val), y_val)
        name = " ".join(["fresh encoder", *args.override])
        result[f"{name}, {args.fresh:g} s on the kinds"] = [round(a, 3) for a in accuracy]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
