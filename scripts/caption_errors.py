"""Why a captioner's wrong captions are wrong, on generated scenes (shapes or grid).

`val/correctness` counts the captions that are entirely true; this tells the others apart by the
first check each fails (`mmtx.data.synthetic.scoring.caption_error`: a stray claiming word, the
shapes named, a size, a kind, a place, a relation), overall and by how many shapes the scene
holds. It reads the predictions `mmtx-eval` writes (the COCO results format) and the data set
they describe, and prints ONE JSON line::

    mmtx-eval ckpt=RUN/checkpoints/last.ckpt predictions=captions.json
    python scripts/caption_errors.py data/grid-relations-3000-300-seed0 captions.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from mmtx.data.synthetic.grid import grid_scenes
from mmtx.data.synthetic.scenes import ShapeScene
from mmtx.data.synthetic.scoring import ERRORS, caption_error
from mmtx.data.synthetic.shapes import shapes_val_scenes


def scenes_of(root: Path, split: str) -> dict[int, ShapeScene]:
    """The drawn scenes of a generated data set, by image id, read as its data module reads them."""
    meta_path = root / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        read = grid_scenes if isinstance(meta, dict) and meta.get("format") == "mmtx-grid" else shapes_val_scenes
        return read(meta, split)  # the meta dict, not read again
    except OSError as error:
        raise SystemExit(f"{meta_path}: {error.strerror} (the root of a data set mmtx generated)") from None
    except (KeyError, TypeError, ValueError) as error:
        raise SystemExit(f"{meta_path}: not a data set of generated scenes ({error})") from None


def errors(predictions: dict[int, str], scenes: dict[int, ShapeScene]) -> dict:
    """Counts of each first error, overall and by the scene's number of shapes."""
    missing = [i for i in predictions if i not in scenes]
    if missing:
        raise SystemExit(f"{len(missing)} predicted image id(s) are not in the data set, first {missing[0]}")
    overall: Counter[str] = Counter()
    by_shapes: dict[int, Counter[str]] = {}
    for image_id, caption in predictions.items():
        scene = scenes[image_id]
        error = caption_error(caption, scene) or "correct"
        overall[error] += 1
        by_shapes.setdefault(len(scene.shapes), Counter())[error] += 1
    order = ("correct", *ERRORS)

    def ordered(counts: Counter[str]) -> dict[str, int]:
        return {key: counts[key] for key in order if counts[key]}

    return {
        "captions": len(predictions),
        "correct": round(overall["correct"] / len(predictions), 4),
        "first_error": ordered(overall),
        "by_shapes": {str(n): ordered(c) for n, c in sorted(by_shapes.items())},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path, help="the generated data set's root (it holds meta.json)")
    p.add_argument("predictions", type=Path, help="[{'image_id': ..., 'caption': ...}] as mmtx-eval writes them")
    p.add_argument("--split", default="val", help="the split the predictions are of")
    args = p.parse_args()
    try:
        rows = json.loads(args.predictions.read_text(encoding="utf-8"))
        predictions = {int(row["image_id"]): str(row["caption"]) for row in rows}
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise SystemExit(f"{args.predictions}: not a COCO captions results file ({error})") from None
    if not predictions:
        raise SystemExit(f"{args.predictions}: no predictions")
    print(json.dumps(errors(predictions, scenes_of(args.data, args.split))))


if __name__ == "__main__":
    main()
