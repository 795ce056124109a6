"""``data=pairs``: your own image-caption rows in a JSONL or CSV file, read, screened, trained on."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from mmtx.data.annotations import AnnotationError
from mmtx.data.captions import read_pairs
from tests.conftest import TINY_MODEL

ROWS = [  # (image, caption): two rows of one image add up
    ("red.png", "a red ball"), ("sub/blue.png", "a blue box"), ("red.png", "a red circle on grey"),
    ("green.png", "a green ball"),
]  # fmt: skip


def write_images(root: Path) -> None:
    for name, colour in (("red.png", "red"), ("sub/blue.png", "blue"), ("green.png", "green")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image = Image.new("RGB", (48, 40), "grey")
        ImageDraw.Draw(image).ellipse((10, 8, 36, 32), fill=colour)
        image.save(root / name)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    return path


def test_jsonl_and_csv_give_the_same_records(tmp_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "p.jsonl", [{"image": i, "caption": c} for i, c in ROWS])
    table = write_csv(tmp_path / "p.csv", ROWS)
    records = read_pairs(jsonl, tmp_path)
    assert records == read_pairs(table, tmp_path)
    assert [(r.image_id, r.path, r.captions) for r in records] == [
        (1, tmp_path / "red.png", ("a red ball", "a red circle on grey")),
        (2, tmp_path / "sub/blue.png", ("a blue box",)),
        (3, tmp_path / "green.png", ("a green ball",)),
    ]
    listed = write_jsonl(tmp_path / "l.jsonl", [{"image": "red.png", "caption": ["a red ball", "a red  circle"]}])
    assert read_pairs(listed, tmp_path)[0].captions == ("a red ball", "a red circle")  # a list: all of them


def test_parquet_gives_the_records_of_jsonl(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"image": [i for i, _ in ROWS], "caption": [c for _, c in ROWS]}), tmp_path / "p.parquet")
    jsonl = write_jsonl(tmp_path / "p.jsonl", [{"image": i, "caption": c} for i, c in ROWS])
    assert read_pairs(tmp_path / "p.parquet", tmp_path) == read_pairs(jsonl, tmp_path)
    lists = pa.table({"image": ["red.png", "green.png"], "caption": [["a red ball", "red"], ["a green ball"]]})
    pq.write_table(lists, tmp_path / "l.parquet")  # a list column: all of an image's captions
    assert [r.captions for r in read_pairs(tmp_path / "l.parquet", tmp_path)] == [
        ("a red ball", "red"),
        ("a green ball",),
    ]
    pq.write_table(pa.table({"image": ["red.png"], "text": ["a red ball"]}), tmp_path / "bad.parquet")
    with pytest.raises(AnnotationError, match="bad.parquet: cannot read its image and caption columns"):
        read_pairs(tmp_path / "bad.parquet", tmp_path)


def test_bad_rows_are_named_by_line_or_left_out(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"image": "red.png", "caption": "fine"}\n'
        '{"caption": "no image"}\n'
        "not json\n"
        '{"image": "../escape.png", "caption": "out of the root"}\n'
        '{"image": "green.png", "caption": "   "}\n'
        '{"image": "green.png", "caption": [1, 2]}\n'
    )
    with pytest.raises(AnnotationError) as info:
        read_pairs(path, tmp_path)
    message = str(info.value)
    assert "5 bad entries" in message
    for line, reason in ((2, "missing key 'image'"), (3, "invalid JSON"), (4, "escapes the image root"),
                         (5, "empty caption"), (6, "expected a string")):  # fmt: skip
        assert any(f"line {line}" in row and reason in row for row in message.splitlines()), (line, message)
    skipped: list[str] = []
    assert [r.captions for r in read_pairs(path, tmp_path, skipped)] == [("fine",)] and len(skipped) == 5
    with pytest.raises(AnnotationError, match="must name the columns image and caption"):
        read_pairs(_headerless(tmp_path / "h.csv"), tmp_path)
    with pytest.raises(AnnotationError, match=r"is \.jsonl, \.csv or \.parquet, not \.txt"):
        read_pairs(tmp_path / "pairs.txt", tmp_path)


def _headerless(path: Path) -> Path:
    path.write_text("red.png,a red ball\n")
    return path


@pytest.mark.slow
def test_train_and_evaluate_on_pairs_from_jsonl_and_csv(cli, tmp_path: Path) -> None:
    write_images(tmp_path / "photos")
    train = write_jsonl(tmp_path / "train.jsonl", [{"image": i, "caption": c} for i, c in ROWS * 3])
    val = write_csv(tmp_path / "val.csv", ROWS)
    cli.run(
        "mmtx-train",
        "data=pairs",
        f"data.train.file={train}",
        f"data.train.images={tmp_path / 'photos'}",
        f"data.val.file={val}",
        f"data.val.images={tmp_path / 'photos'}",
        "data.image_size=32",
        "data.batch_size=4",
        *TINY_MODEL,
        "trainer.max_steps=3",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    result = cli.run("mmtx-eval", f"ckpt={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}", cwd=tmp_path)
    assert "CIDEr" in result.stdout and "(3 examples)" in result.stdout, result.stdout
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert sorted(p["image_id"] for p in predictions) == [1, 2, 3]
