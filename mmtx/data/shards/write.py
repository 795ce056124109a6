"""Caption and VQA records written as WebDataset tar shards that `data=webdataset` and
`data=webdataset_vqa` read: each image re-encoded once at a training size, so that training reads
small JPEGs instead of decoding full-size photos every epoch."""

from __future__ import annotations

import io
import os
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from PIL import Image
from torchvision.transforms.v2.functional import resize
from tqdm import tqdm
from webdataset import TarWriter

from mmtx.data.annotations import atomic_write_json
from mmtx.data.captions.files import CaptionRecord
from mmtx.data.images import ImageLoadError, read_image
from mmtx.data.shards.files import SHARD_LIST
from mmtx.data.vqa.files import VqaRecord


class ShardSample(NamedTuple):
    """What one sample of a shard holds besides its image: ``KEY.json`` and, if any, ``KEY.txt``."""

    path: Any  # the image file (a path or a `FileSlice`)
    meta: dict[str, Any]
    text: str | None


def caption_samples(records: list[CaptionRecord]) -> list[ShardSample]:
    """One sample per image: its id and all its ``captions`` in the ``.json``, the first in the ``.txt``."""
    return [ShardSample(r.path, {"image_id": r.image_id, "captions": list(r.captions)}, r.captions[0] if r.captions else "")
            for r in records]  # fmt: skip


def vqa_samples(records: list[VqaRecord]) -> list[ShardSample]:
    """One sample per image, in the order the images first appear: its id and its ``questions``
    (each with its id, text, answers and types) in the ``.json``, as `read_vqa_shards` reads them."""
    by_image: dict[int, ShardSample] = {}
    for r in records:
        sample = by_image.setdefault(r.image_id, ShardSample(r.path, {"image_id": r.image_id, "questions": []}, None))
        entry = {"question_id": r.question_id, "question": r.question, "answers": list(r.answers)}
        entry |= {
            k: v for k, v in (("answer_type", r.answer_type), ("question_type", r.question_type)) if v is not None
        }
        sample.meta["questions"].append(entry)
    return list(by_image.values())


def encode_jpeg(path: Any, image_size: int | None, quality: int = 90) -> bytes:
    """The image at ``path`` as JPEG bytes, its shorter side resized to ``image_size`` (never
    enlarged; ``None`` keeps its size)."""
    pixels = read_image(path)  # (3, H, W) uint8, upright
    if image_size is not None and min(pixels.shape[1:]) > image_size:
        pixels = resize(pixels, image_size, antialias=True)
    out = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_shards(
    records: list[ShardSample],
    out: str | os.PathLike,
    split: str,
    shard_size: int = 1000,
    image_size: int | None = 256,
    quality: int = 90,
    skip_bad_images: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """Write ``records`` as ``out/{split}-00000.tar``, ... of ``shard_size`` samples each: per
    record ``KEY.jpg`` (see `encode_jpeg`), ``KEY.json`` and ``KEY.txt`` (see `caption_samples`,
    `vqa_samples`); KEY is the record's position, zero-padded.

    Each shard is written under a temporary name and renamed when complete, so a run that was
    interrupted writes only the shards still missing when started again with the same records
    and settings. An image that fails to decode stops the run, or with ``skip_bad_images`` is
    left out and listed. Returns ``{"shards": [names], "samples": n, "left_out": [...]}``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names, samples, left_out = [], 0, []
    with (
        ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool,
        tqdm(total=len(records), desc=f"writing {split} shards", unit="img", file=sys.stderr, disable=None) as bar,
    ):
        for k, start in enumerate(range(0, len(records), shard_size)):
            chunk = records[start : start + shard_size]
            name = f"{split}-{k:05d}.tar"
            names.append(name)
            target = out / name
            if target.exists():  # written completely by an earlier run
                samples += _samples_in(target)
                bar.update(len(chunk))
                continue
            encoded = pool.map(lambda r: _encoded(r, image_size, quality), chunk)
            partial = out / f".{name}.partial"
            with TarWriter(str(partial)) as sink:
                for position, (record, image) in enumerate(zip(chunk, encoded), start):
                    bar.update()
                    if isinstance(image, ImageLoadError):
                        if not skip_bad_images:
                            raise image
                        left_out.append(f"{image.path}: {image.reason}")
                        continue
                    sample = {"__key__": f"{position:09d}", "jpg": image, "json": record.meta}
                    sink.write(sample if record.text is None else {**sample, "txt": record.text})
                    samples += 1
            os.replace(partial, target)
    return {"shards": names, "samples": samples, "left_out": left_out}


def _encoded(record: ShardSample, image_size: int | None, quality: int) -> bytes | ImageLoadError:
    try:
        return encode_jpeg(record.path, image_size, quality)
    except ImageLoadError as err:
        return err


def _samples_in(shard: Path) -> int:
    with tarfile.open(shard, mode="r:") as tar:
        return sum(1 for info in tar if info.name.endswith(".jpg"))


def write_shard_list(out: str | os.PathLike, splits: dict[str, dict[str, Any]], settings: dict[str, Any]) -> Path:
    """``out/shards.json``: each split's shards and sample count, and the settings they were
    written with (`data=webdataset data.train.shards=out/shards.json:train` reads a split)."""
    path = Path(out) / SHARD_LIST
    document = {
        "splits": {s: {"shards": v["shards"], "samples": v["samples"]} for s, v in splits.items()},
        "settings": settings,
    }
    atomic_write_json(path, document)
    return path
