"""scripts/bench_data.py end to end on a few generated images: every source it names is measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_data.py"


def test_bench_data_measures_the_folder_and_the_shards_it_writes(tmp_path: Path) -> None:
    args = [
        "--sources",
        "coco,coco_shards",
        "--coco-count",
        "8",
        "--batch-size",
        "2",
        "--batches",
        "2",
        "--workers",
        "0",
        "--stages",
        "--root",
        str(tmp_path),
    ]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    for source in ("coco", "coco_shards"):
        measured = result[source]["workers_0"]
        assert measured["images"] == 4 and measured["images_per_s"] > 0
        stages = result[source]["stages"]
        assert min(stages.values()) > 0  # milliseconds, measured (no timing is asserted)
    folder, shards_stages = result["coco"]["stages"], result["coco_shards"]["stages"]
    assert shards_stages["bound_vs_coco"] == round(
        folder["example_ms"] / (shards_stages["decode_ms"] + shards_stages["resize_ms"]), 2
    )
    shards = tmp_path / "coco-shards-8-256px"
    assert (shards / "done").read_text().split() == ["train-00000.tar"]  # written once, then reused
