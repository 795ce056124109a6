"""scripts/caption_errors.py: the wrong captions of a generated data set, by their first error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mmtx.data.captions import read_coco_captions
from mmtx.data.synthetic.grid import generate_grid
from mmtx.data.synthetic.shapes import generate_shapes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "caption_errors.py"


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def _references(root: Path, out: Path, changed: dict[int, str]) -> Path:
    """Each validation image's first reference caption, some replaced, in mmtx-eval's format."""
    records = read_coco_captions(root / "captions_val.json", root / "val")
    rows = [{"image_id": r.image_id, "caption": changed.get(k, r.captions[0])} for k, r in enumerate(records)]
    out.write_text(json.dumps(rows))
    return out


def test_counts_each_wrong_caption_by_its_first_error_and_shapes(tmp_path: Path) -> None:
    root = tmp_path / "grid"
    generate_grid(root, num_train=0, num_val=12)
    predictions = _references(root, tmp_path / "p.json", {0: "a lone big orange ball", 1: ""})
    result = _run(root, predictions)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["captions"] == 12 and seen["correct"] == round(10 / 12, 4)
    assert seen["first_error"] == {"correct": 10, "stray word": 1, "shapes named": 1}
    by_shapes = seen["by_shapes"]
    assert sum(sum(counts.values()) for counts in by_shapes.values()) == 12
    assert set(by_shapes) <= {"1", "2", "3"}


def test_reads_shapes_scenes_too_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    root = tmp_path / "shapes"
    generate_shapes(root, num_train=0, num_val=6, image_size=32)
    seen = json.loads(_run(root, _references(root, tmp_path / "p.json", {})).stdout)
    assert seen["first_error"] == {"correct": 6}

    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps([{"image_id": 5, "caption": "a lone big red ball"}]))
    bad = _run(root, unknown)
    assert bad.returncode != 0 and bad.stderr.strip() == "1 predicted image id(s) are not in the data set, first 5"
    for path, says in ((tmp_path, "meta.json: No such file"), (root, "not a COCO captions results file")):
        bad = _run(path, tmp_path / "none.json" if path == root else unknown)
        assert bad.returncode != 0 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
