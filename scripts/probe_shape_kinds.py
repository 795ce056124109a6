"""Does a checkpoint's image encoder see which shape kinds a shapes scene holds? A linear probe.

For each checkpoint (a captioner, a two-stream pretraining or a VQA run), the image encoder's own
output on shapes scenes (before any co-attention: the CLS token, and the mean and the maximum of
the patch tokens) is fitted by a logistic regression per kind (circle, square, triangle: is
there one in the scene?) on ``--train`` scenes and scored on ``--val`` other scenes. Prints ONE
JSON line: the share of scenes each probe gets right, and the majority-class baseline::

    python scripts/probe_shape_kinds.py RUN_A/checkpoints/last.ckpt RUN_B/checkpoints/last.ckpt

Why: VQA and retrieval on shapes fail where a question or a caption turns on a shape's kind,
while the captioner names kinds right; the probe says whether the encoder has the kinds at all.
The scenes are drawn as the shapes VQA data set draws them (its own seeds), so no data set is read.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import torch
import torch.nn.functional as F
from torch import Tensor

from mmtx.checkpoint import load_task
from mmtx.data.synthetic.shapes import KINDS, draw_scene
from mmtx.data.transforms import build_transforms


def scenes(split: str, count: int, image_size: int) -> tuple[Tensor, Tensor]:
    """Normalised images (count, 3, S, S) and kind-presence labels (count, len(KINDS))."""
    transform = build_transforms(image_size, train=False)
    images, labels = [], []
    for index in range(count):
        image, _, scene = draw_scene(random.Random(f"mmtx-shapes-vqa/0/{split}/{index}"), image_size, num_captions=1)
        images.append(transform(image))
        labels.append([float(any(shape.kind == kind for shape in scene.shapes)) for kind in KINDS])
    return torch.stack(images), torch.tensor(labels)


@torch.no_grad()
def image_features(task: torch.nn.Module, images: Tensor, chunk: int = 250) -> Tensor:
    """[CLS; mean of patches; max of patches] of the task's image encoder (B, 3 * dim)."""
    model = task.model
    out = []
    for s in range(0, len(images), chunk):
        if hasattr(model, "backbone"):  # two-stream: the vision stream's own blocks, then its norm
            tokens = model.backbone.vision.norm(model.backbone.encode_vision(images[s : s + chunk])[0])
        else:  # captioner
            tokens = model.encoder(images[s : s + chunk])
        out.append(torch.cat([tokens[:, 0], tokens[:, 1:].mean(1), tokens[:, 1:].amax(1)], dim=-1).float())
    return torch.cat(out)


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
    parser.add_argument("checkpoints", nargs="+", help="mmtx-train checkpoints (.ckpt)")
    parser.add_argument("--train", type=int, default=1500, help="scenes the probes are fitted on")
    parser.add_argument("--val", type=int, default=300, help="other scenes they are scored on")
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args(argv)
    if args.train < 2 or args.val < 1:
        parser.error("--train must be at least 2 and --val at least 1")
    torch.manual_seed(0)
    x_train, y_train = scenes("train", args.train, args.image_size)
    x_val, y_val = scenes("val", args.val, args.image_size)
    result = {"kinds": list(KINDS), "majority": [round(max(p, 1 - p), 3) for p in y_val.mean(0).tolist()]}
    for path in args.checkpoints:
        print(f"[probe] {path}", file=sys.stderr, flush=True)
        task = load_task(path)
        accuracy = probe_accuracy(image_features(task, x_train), y_train, image_features(task, x_val), y_val)
        result[path] = [round(a, 3) for a in accuracy]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
