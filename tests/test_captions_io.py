"""COCO and Karpathy caption readers: grouping, ordering, paths, and errors that name the culprit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mmtx.data.annotations import AnnotationError
from mmtx.data.captions import (
    CaptionRecord,
    read_coco_captions,
    read_karpathy,
    write_coco_captions,
)


def _write(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def _coco() -> dict[str, Any]:
    return {
        "info": {},
        "images": [
            {"id": 30, "file_name": "b.jpg", "width": 640, "height": 480},
            {"id": 7, "file_name": "sub/a.jpg"},
            {"id": 12, "file_name": "c.jpg"},  # no captions, e.g. a test image
        ],
        "annotations": [
            {"id": 1, "image_id": 30, "caption": "A dog on a couch.\n"},
            {"id": 2, "image_id": 7, "caption": "  two  cats "},
            {"id": 3, "image_id": 30, "caption": "A brown dog."},
        ],
    }


def test_coco_groups_by_image_sorted_by_id(tmp_path: Path) -> None:
    records = read_coco_captions(_write(tmp_path / "captions.json", _coco()), tmp_path / "imgs")
    assert records == [
        CaptionRecord(7, tmp_path / "imgs" / "sub" / "a.jpg", ("two cats",)),
        CaptionRecord(12, tmp_path / "imgs" / "c.jpg", ()),
        CaptionRecord(30, tmp_path / "imgs" / "b.jpg", ("A dog on a couch.", "A brown dog.")),
    ]


def test_coco_round_trips_through_writer(tmp_path: Path) -> None:
    images = tmp_path / "imgs"
    records = [
        CaptionRecord(2, images / "x" / "2.png", ("a red circle", "a big red ball")),
        CaptionRecord(5, images / "5.png", ("a tiny blue box",)),
    ]
    out = tmp_path / "out" / "captions.json"
    write_coco_captions(records, out, images, sizes={2: (64, 48)})
    document = json.loads(out.read_text())
    assert document["images"][0] == {"id": 2, "file_name": "x/2.png", "width": 64, "height": 48}
    assert [a["id"] for a in document["annotations"]] == [1, 2, 3]
    assert read_coco_captions(out, images) == records
    assert [p.name for p in out.parent.iterdir()] == ["captions.json"]  # no temp file left


def test_writer_refuses_images_outside_the_root_and_duplicate_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not under"):
        outside = [CaptionRecord(1, tmp_path / "elsewhere.png", ())]
        write_coco_captions(outside, tmp_path / "c.json", tmp_path / "imgs")
    twice = [CaptionRecord(1, tmp_path / "a.png", ()), CaptionRecord(1, tmp_path / "b.png", ())]
    with pytest.raises(ValueError, match="duplicate image id 1"):
        write_coco_captions(twice, tmp_path / "c.json", tmp_path)


def _broken(mutate) -> dict[str, Any]:
    document = _coco()
    mutate(document)
    return document


@pytest.mark.parametrize(
    ("document", "fragments"),
    [
        (_broken(lambda d: d.pop("annotations")), ["annotations", "missing key"]),
        (_broken(lambda d: d["annotations"][1].pop("caption")), ["annotations[1].caption", "missing key"]),
        (_broken(lambda d: d["images"][2].update(id="12")), ["images[2].id", "expected an integer"]),
        (_broken(lambda d: d["annotations"][2].update(image_id=99)), ["annotations[2].image_id", "99"]),
        (_broken(lambda d: d["images"][0].update(file_name="../x.jpg")), ["images[0].file_name", "escapes"]),
        (_broken(lambda d: d["images"][1].update(file_name="/etc/x")), ["images[1].file_name", "escapes"]),
        (_broken(lambda d: d["images"][1].update(id=30)), ["images[1].id", "duplicate image id 30"]),
        (_broken(lambda d: d["annotations"][0].update(caption="  ")), ["annotations[0].caption", "empty"]),
        ([1, 2], ["top level", "expected a JSON object"]),
    ],
)
def test_coco_errors_name_file_and_entry(tmp_path: Path, document: Any, fragments: list[str]) -> None:
    path = _write(tmp_path / "captions.json", document)
    with pytest.raises(AnnotationError) as info:
        read_coco_captions(path, tmp_path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_coco_missing_and_invalid_json_files(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="not found") as info:
        read_coco_captions(tmp_path / "nope.json", tmp_path)
    assert "nope.json" in str(info.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [}')
    with pytest.raises(AnnotationError, match=r"bad\.json: invalid JSON at line 1 column 13"):
        read_coco_captions(bad, tmp_path)


def _karpathy() -> dict[str, Any]:
    def entry(imgid: int, split: str, cocoid: int | None, filepath: str | None, **sentence: Any) -> dict:
        item = {"imgid": imgid, "split": split, "filename": f"{imgid}.jpg", "sentences": [sentence]}
        if cocoid is not None:
            item["cocoid"] = cocoid
        if filepath is not None:
            item["filepath"] = filepath
        return item

    return {
        "dataset": "coco",
        "images": [
            entry(0, "val", 391895, "val2014", raw="A man riding a bike.", tokens=["a", "man"]),
            entry(1, "restval", 20, "val2014", raw="Restval image.", tokens=[]),
            entry(2, "train", 500, "train2014", raw="  Train  image ", tokens=[]),
            entry(3, "train", 10, "train2014", tokens=["only", "tokens"]),
            entry(4, "test", None, None, raw="flickr style", tokens=[]),
        ],
    }


def test_karpathy_train_includes_restval_sorted_by_cocoid(tmp_path: Path) -> None:
    path = _write(tmp_path / "dataset_coco.json", _karpathy())
    records = read_karpathy(path, tmp_path, "train")
    assert [r.image_id for r in records] == [10, 20, 500]
    assert records[0] == CaptionRecord(10, tmp_path / "train2014" / "3.jpg", ("only tokens",))
    assert records[1].path == tmp_path / "val2014" / "1.jpg" and records[1].captions == ("Restval image.",)
    assert records[2].captions == ("Train image",)

    assert [r.image_id for r in read_karpathy(path, tmp_path, "restval")] == [20]
    assert read_karpathy(path, tmp_path, "val") == [
        CaptionRecord(391895, tmp_path / "val2014" / "0.jpg", ("A man riding a bike.",))
    ]
    # Flickr entries have no cocoid and no filepath.
    assert read_karpathy(path, tmp_path, "test") == [CaptionRecord(4, tmp_path / "4.jpg", ("flickr style",))]


def test_karpathy_unknown_split_lists_the_splits_present(tmp_path: Path) -> None:
    path = _write(tmp_path / "dataset_coco.json", _karpathy())
    with pytest.raises(AnnotationError) as info:
        read_karpathy(path, tmp_path, "validation")
    assert str(path) in str(info.value)
    assert "'validation'" in str(info.value) and "restval, test, train, val" in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "fragments"),
    [
        (lambda d: d["images"][0].update(filepath=".."), ["images[0].filepath/filename", "escapes"]),
        (lambda d: d["images"][0]["sentences"][0].update(raw=None, tokens=None), ["sentences[0].tokens"]),
        (lambda d: d["images"][0].pop("sentences"), ["images[0].sentences", "missing key"]),
        (lambda d: d["images"][0].pop("split"), ["images[0].split", "missing key"]),
    ],
)
def test_karpathy_errors_name_file_and_entry(tmp_path: Path, mutate, fragments: list[str]) -> None:
    document = _karpathy()
    mutate(document)
    path = _write(tmp_path / "dataset_coco.json", document)
    with pytest.raises(AnnotationError) as info:
        read_karpathy(path, tmp_path, "val")
    for fragment in [str(path), *fragments]:
        assert fragment in str(info.value)
