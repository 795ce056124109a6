"""Inputs for the bad-input tests: a small COCO-format caption data set with known bad images and
bad annotation entries, and a tiny captioner checkpoint as mmtx-train writes it.

`write_dirty_coco` draws plain coloured squares (32 px) with two captions each, then adds one
example of each kind of bad input, and returns what a ``skip`` run must leave out (and an
``error`` run must name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from tests.conftest import TINY_MODEL
from tests.helpers import compose_train

COLORS = {"red": (220, 40, 40), "blue": (50, 90, 235), "green": (40, 175, 60)}
LONG_CAPTION = "a red square on a red square " * 12  # ~85 tokens: cut at any small max_length


@dataclass
class DirtyCoco:
    """Where the files are and what is wrong with them (paths as the data module reports them)."""

    root: Path
    bad_images: dict[str, str] = field(default_factory=dict)  # path -> a word its reason contains
    bad_entries: dict[str, str] = field(default_factory=dict)  # "file: where" -> a word of the reason
    long_captions: list[str] = field(default_factory=list)  # "image <id> caption <k>"
    train_images: int = 0  # good training images

    def split(self, name: str) -> dict[str, str]:
        return {"annotations": str(self.root / f"captions_{name}.json"), "images": str(self.root / name)}

    def overrides(self) -> list[str]:
        """``mmtx-train data=coco`` settings that read this data set."""
        out = ["data=coco"]
        for name in ("train", "val"):
            out += [f"data.{name}.{key}={value}" for key, value in self.split(name).items()]
        return out


def _square(path: Path, color: str) -> None:
    Image.new("RGB", (32, 32), COLORS[color]).save(path)


def write_dirty_coco(root: Path, num_train: int = 24, num_val: int = 6) -> DirtyCoco:
    """Write ``root/{train,val}/`` and ``root/captions_{train,val}.json``; the train split gets
    the bad inputs (val is clean, so a skip run still validates on everything)."""
    data = DirtyCoco(root)
    colors = list(COLORS)
    documents = {}
    for split, count, first_id in (("train", num_train, 1), ("val", num_val, 1000)):
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for k in range(count):
            image_id, color = first_id + k, colors[k % len(colors)]
            _square(folder / f"{image_id}.png", color)
            images.append({"id": image_id, "file_name": f"{image_id}.png"})
            for caption in (f"a {color} square", f"the picture is {color}"):
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "caption": caption})
        documents[split] = (images, annotations)
    data.train_images = num_train

    train, (images, annotations) = root / "train", documents["train"]
    ann_file = root / "captions_train.json"

    def bad_image(image_id: int, name: str, reason: str) -> None:
        images.append({"id": image_id, "file_name": name})
        annotations.append({"id": len(annotations) + 1, "image_id": image_id, "caption": "a red square"})
        data.bad_images[str(train / name)] = reason

    (train / "empty.png").touch()
    bad_image(901, "empty.png", "empty")
    full = (train / "1.png").read_bytes()
    (train / "truncated.png").write_bytes(full[: len(full) // 2])
    bad_image(902, "truncated.png", "Truncated")
    (train / "notes.jpg").write_text("these are not pixels\n")
    bad_image(903, "notes.jpg", "cannot identify")
    bad_image(904, "missing.png", "No such file")

    def bad_entry(where: str, reason: str) -> None:
        data.bad_entries[f"{ann_file}: {where}"] = reason

    images.append({"id": 905, "file_name": "../escape.png"})
    bad_entry(f"images[{len(images) - 1}].file_name", "escapes the image root")
    images.append({"id": 906, "file_name": "/etc/hostname"})
    bad_entry(f"images[{len(images) - 1}].file_name", "escapes the image root")
    images.append({"id": 907})
    bad_entry(f"images[{len(images) - 1}].file_name", "missing key 'file_name'")
    images.append({"id": 1, "file_name": "2.png"})
    bad_entry(f"images[{len(images) - 1}].id", "duplicate image id 1")
    annotations.append({"id": 0, "image_id": 2, "caption": "   "})
    bad_entry(f"annotations[{len(annotations) - 1}].caption", "empty caption")
    annotations.append({"id": 0, "image_id": 2})
    bad_entry(f"annotations[{len(annotations) - 1}].caption", "missing key 'caption'")
    annotations.append({"id": 0, "image_id": 77, "caption": "a red square"})
    bad_entry(f"annotations[{len(annotations) - 1}].image_id", "image id 77 is not in images[]")
    annotations.append({"id": 0, "image_id": "3", "caption": "a red square"})
    bad_entry(f"annotations[{len(annotations) - 1}].image_id", "expected an integer, got a string")
    annotations.append({"id": 0, "image_id": 3, "caption": "NONUTF8"})  # the bytes are swapped in below
    bad_entry(f"annotations[{len(annotations) - 1}].caption", "byte 0xe9")
    annotations.append({"id": 0, "image_id": 4, "caption": LONG_CAPTION})
    data.long_captions.append("image 4 caption 2")

    text = json.dumps({"info": {}, "images": images, "annotations": annotations}).encode()
    ann_file.write_bytes(text.replace(b"NONUTF8", b"caf\xe9 latte"))  # Latin-1, not UTF-8
    val_images, val_annotations = documents["val"]
    (root / "captions_val.json").write_text(json.dumps({"images": val_images, "annotations": val_annotations}))
    return data


def tiny_model_config(*overrides: str) -> dict[str, Any]:
    """The tiny captioner's resolved ``model`` config (32-px images, patches of 8)."""
    from omegaconf import OmegaConf

    cfg = compose_train([*TINY_MODEL, "data.image_size=32", "paths.output_dir=/unused", *overrides])
    return OmegaConf.to_container(cfg.model, resolve=True)  # type: ignore[return-value]


def write_tiny_checkpoint(path: Path) -> Path:
    """A tiny, untrained captioner's checkpoint with what mmtx-train puts in one (task class,
    hyperparameters, weights): enough for loading and resume checks, without a training run."""
    from mmtx.checkpoint import TASK_KEY
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.caption import CaptionTask

    tokenizer = Tokenizer.train(["a red square", "a blue circle"], vocab_size=40).to_str()
    task = CaptionTask(model=tiny_model_config(), tokenizer=tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({TASK_KEY: "mmtx.tasks.caption.CaptionTask", "hyper_parameters": dict(task.hparams),
                "state_dict": task.state_dict(), "global_step": 3}, path)  # fmt: skip
    return path
