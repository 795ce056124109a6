"""Bad input gets a clear error or a counted skip: images, annotation files, the data modules'
``on_bad_image`` / ``on_bad_annotation`` policies, decode failures inside loader workers, texts
cut at ``max_length``, and checkpoints that are truncated, foreign or do not fit the model."""

from __future__ import annotations

import functools
import json
import logging
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from mmtx.checkpoint import TASK_KEY, CheckpointError, check_resume, load_task, read_checkpoint
from mmtx.config_error import ArgumentError
from mmtx.data.annotations import AnnotationError
from mmtx.data.bad_data import REPORT_FILE, BadDataError, BadDataReport
from mmtx.data.captions import CocoCaptions, read_coco_captions, read_karpathy
from mmtx.data.images import ImageLoadError, check_image, load_image, scan_images
from mmtx.data.tokenizer import Tokenizer, TokenizerError
from mmtx.data.transforms import build_transforms
from mmtx.data.vqa import VqaV2, read_vqa
from tests.bad_inputs import tiny_model_config, write_dirty_coco, write_tiny_checkpoint


def _save(img: Image.Image, path: Path, **params: Any) -> Path:
    img.save(path, **params)
    return path


def _noise(size: tuple[int, int] = (48, 48)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (*size[::-1], 3), dtype=np.uint8))


# --- images: every mode and size loads, every broken file is named ----------------------------


def _palette_with_transparency() -> Image.Image:
    img = Image.new("P", (4, 4), 1)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    return img


GOOD_IMAGES = {
    "L.png": lambda: Image.new("L", (40, 30), 90),
    "LA.png": lambda: Image.new("LA", (40, 30), (90, 128)),
    "P.png": lambda: Image.new("P", (40, 30), 3),
    "P-transparent.png": _palette_with_transparency,
    "RGBA.png": lambda: Image.new("RGBA", (40, 30), (10, 20, 30, 0)),
    "CMYK.jpg": lambda: Image.new("CMYK", (40, 30), (0, 255, 255, 0)),
    "CMYK.tif": lambda: Image.new("CMYK", (40, 30), (0, 255, 255, 0)),
    "I16.png": lambda: Image.fromarray(np.full((30, 40), 40000, dtype=np.uint16)),
    "I32.tif": lambda: Image.fromarray(np.full((30, 40), 70000, dtype=np.int32)),
    "F.tif": lambda: Image.fromarray(np.full((30, 40), 0.5, dtype=np.float32)),
    "1.bmp": lambda: Image.new("1", (40, 30), 1),
    "RGB.gif": lambda: Image.new("RGB", (40, 30), (1, 2, 3)),
    "RGB.webp": lambda: Image.new("RGB", (40, 30), (1, 2, 3)),
    "one-pixel.png": lambda: Image.new("RGB", (1, 1), (255, 0, 0)),
    "tiny.jpg": lambda: Image.new("RGB", (3, 2), (0, 255, 0)),
    "sliver.png": lambda: Image.new("RGB", (600, 1), (0, 0, 255)),
}


@pytest.mark.parametrize("name", sorted(GOOD_IMAGES))
def test_every_mode_and_size_passes_the_check_and_becomes_a_model_input(tmp_path: Path, name: str) -> None:
    path = _save(GOOD_IMAGES[name](), tmp_path / name)
    assert check_image(path) is None
    image = load_image(path)
    assert image.mode == "RGB"
    for transform in (build_transforms(32, train=False), build_transforms(32, train=True, crop_scale=(0.3, 0.6))):
        out = transform(image)
        assert out.shape == (3, 32, 32) and torch.isfinite(out).all()


def _bad_images(folder: Path) -> dict[Path, str]:
    """Broken files and a fragment that the check's and the loader's reasons both contain."""
    folder.mkdir(parents=True, exist_ok=True)
    png = _save(_noise(), folder / "full.png").read_bytes()
    jpeg = _save(_noise(), folder / "full.jpg", quality=90).read_bytes()
    (folder / "empty.png").touch()
    (folder / "truncated.png").write_bytes(png[: len(png) // 2])
    (folder / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (folder / "text.jpg").write_text("not pixels at all\n")
    (folder / "random.png").write_bytes(np.random.default_rng(1).integers(0, 256, 500, dtype=np.uint8).tobytes())
    (folder / "a-directory.png").mkdir()
    return {
        folder / "missing.png": "No such file", folder / "empty.png": "empty",
        folder / "truncated.png": "runcated", folder / "truncated.jpg": "truncated",
        folder / "text.jpg": "cannot identify", folder / "random.png": "cannot identify",
        folder / "a-directory.png": "not a regular file",
    }  # fmt: skip


def test_broken_files_fail_the_check_and_the_loader_naming_the_file(tmp_path: Path) -> None:
    for path, fragment in _bad_images(tmp_path).items():
        reason = check_image(path)
        assert reason is not None and fragment in reason, (path, reason)
        with pytest.raises(ImageLoadError) as info:
            load_image(path)
        assert info.value.path == path and str(path) in str(info.value) and fragment in str(info.value)


def test_decompression_bombs_fail_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(Image.new("RGB", (64, 64)), tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 4096 pixels > twice the limit
    assert "DecompressionBombError" in check_image(path)
    with pytest.raises(ImageLoadError, match="DecompressionBomb"):
        load_image(path)


def test_complete_jpegs_with_data_after_the_end_marker_pass(tmp_path: Path) -> None:
    jpeg = _save(_noise(), tmp_path / "a.jpg", quality=90).read_bytes()
    padded = tmp_path / "padded.jpg"
    padded.write_bytes(jpeg + b"\0" * 100)
    trailer = tmp_path / "trailer.jpg"
    trailer.write_bytes(jpeg + b"camera maker notes")  # no end marker last: decoded to make sure
    assert check_image(padded) is None and check_image(trailer) is None


def test_scan_names_each_bad_file_once(tmp_path: Path) -> None:
    bad = _bad_images(tmp_path / "bad")
    good = [_save(Image.new("RGB", (8, 8)), tmp_path / f"{k}.png") for k in range(150)]  # several threads
    found = scan_images([*good, *bad, *bad, *good])  # repeats: checked once
    assert set(found) == set(bad)
    assert all(fragment in found[path] for path, fragment in bad.items())


# --- annotation files -------------------------------------------------------------------------


def _coco(captions: list[Any]) -> dict[str, Any]:
    return {
        "images": [{"id": 1, "file_name": "1.png"}, {"id": 2, "file_name": "2.png"}],
        "annotations": [{"id": k, "image_id": 1 + k % 2, "caption": c} for k, c in enumerate(captions)],
    }


def test_non_utf8_caption_is_blamed_on_its_entry(tmp_path: Path) -> None:
    path = tmp_path / "captions.json"
    path.write_bytes(json.dumps(_coco(["a red square", "MARK", "a blue square"])).encode().replace(b"MARK", b"caf\xe9"))
    with pytest.raises(AnnotationError, match=r"captions.json: annotations\[1\].caption: byte 0xe9 .* is not UTF-8"):
        read_coco_captions(path, tmp_path)
    skipped: list[str] = []
    records = read_coco_captions(path, tmp_path, skipped)
    assert [r.captions for r in records] == [("a red square", "a blue square"), ()]
    assert len(skipped) == 1 and "annotations[1].caption" in skipped[0]


def test_non_utf8_outside_a_string_and_lone_surrogates(tmp_path: Path) -> None:
    path = tmp_path / "captions.json"
    path.write_bytes(b'{"images": [], \xff "annotations": []}')
    with pytest.raises(AnnotationError, match=r"captions.json: not UTF-8 text at line 1 column 16 \(byte 0xff\)"):
        read_coco_captions(path, tmp_path)
    path.write_text(json.dumps(_coco(["x\ud800y"])))  # a "\ud800" escape: no tokenizer can encode it
    with pytest.raises(AnnotationError, match=r"annotations\[0\].caption: lone surrogate U\+D800"):
        read_coco_captions(path, tmp_path)


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "captions.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_coco(["caf\u00e9 au lait"])).encode())
    assert read_coco_captions(path, tmp_path)[0].captions == ("caf\u00e9 au lait",)


@pytest.mark.parametrize(
    ("text", "message"),
    [("[" * 100_000, "nested too deeply"), ('{"images": [' + "9" * 5000 + "]}", "invalid JSON"),
     ('{"images": [1, 2', "invalid JSON at line 1 column 17")],
)  # fmt: skip
def test_malformed_json_is_an_annotation_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "captions.json"
    path.write_text(text)
    with pytest.raises(AnnotationError, match=message):
        read_coco_captions(path, tmp_path)


def test_ids_must_fit_64_bits_and_names_hold_no_nul(tmp_path: Path) -> None:
    document = {"images": [{"id": 2**64, "file_name": "a.png"}, {"id": 2, "file_name": "b\x00.png"}], "annotations": []}
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(document))
    with pytest.raises(AnnotationError) as info:
        read_coco_captions(path, tmp_path)
    message = str(info.value)
    assert "2 bad entries" in message
    assert "images[0].id: 18446744073709551616 is out of range" in message
    assert "images[1].file_name: file name 'b\\x00.png' contains a NUL byte" in message


def test_every_bad_entry_is_named_up_to_a_limit(tmp_path: Path) -> None:
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(_coco([" "] * 25 + ["a red square"])))
    with pytest.raises(AnnotationError) as info:
        read_coco_captions(path, tmp_path)
    message = str(info.value)
    assert f"{path}: 25 bad entries:" in message
    assert all(f"annotations[{k}].caption: empty caption" in message for k in range(20))
    assert "annotations[20]" not in message and "... and 5 more" in message


def test_skipping_coco_entries_drops_an_image_with_its_captions(tmp_path: Path) -> None:
    document = {
        "images": [{"id": 1, "file_name": "1.png"}, {"id": 2, "file_name": "../2.png"},
                   {"id": 1, "file_name": "other.png"}, {"id": 3, "file_name": "3.png"}],
        "annotations": [{"image_id": 1, "caption": "one"}, {"image_id": 2, "caption": "two"},
                        {"image_id": 3, "caption": ""}, {"image_id": 3, "caption": "three"}],
    }  # fmt: skip
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(document))
    skipped: list[str] = []
    records = read_coco_captions(path, tmp_path, skipped)
    assert [(r.image_id, r.path.name, r.captions) for r in records] == [
        (1, "1.png", ("one",)),
        (3, "3.png", ("three",)),
    ]
    assert skipped == [
        f"{path}: images[1].file_name: file name '../2.png' escapes the image root {tmp_path}",
        f"{path}: images[2].id: duplicate image id 1",
        f"{path}: annotations[2].caption: empty caption",
    ]  # the captions of image 2 go with it, unreported


def test_skipping_karpathy_sentences_keeps_the_image(tmp_path: Path) -> None:
    document = {"images": [
        {"cocoid": 5, "filename": "5.jpg", "split": "val", "sentences": [{"raw": "good"}, {"raw": 3}, {"tokens": [1]}]},
        {"cocoid": 6, "filename": "6.jpg", "split": "val"},
    ]}  # fmt: skip
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps(document))
    with pytest.raises(AnnotationError, match="3 bad entries"):
        read_karpathy(path, tmp_path, "val")
    skipped: list[str] = []
    records = read_karpathy(path, tmp_path, "val", skipped)
    assert [(r.image_id, r.captions) for r in records] == [(5, ("good",))]
    assert [line.split(": ", 1)[1] for line in skipped] == [
        "images[0].sentences[1].raw: expected a string, got an integer",
        "images[0].sentences[2].tokens: expected an array of UTF-8 strings",
        "images[1].sentences: missing key 'sentences'",
    ]


def _vqa_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    images = tmp_path / "images"
    images.mkdir()
    for name in ("1.png", "2.png", "3.jpg", "000000000003.png"):  # image 3: two files
        (images / name).write_bytes(b"x")
    questions = {"questions": [{"question_id": q, "image_id": i, "question": "what?"}
                               for q, i in ((10, 1), (11, 1), (20, 2), (30, 3), (40, 4))]}  # fmt: skip
    answers = [{"answer": "red"}]
    annotations = {"annotations": [
        {"question_id": 10, "image_id": 1, "answers": answers}, {"question_id": 11, "image_id": 1, "answers": []},
        {"question_id": 30, "image_id": 3, "answers": answers}, {"question_id": 40, "image_id": 4, "answers": answers},
    ]}  # fmt: skip
    q, a = tmp_path / "q.json", tmp_path / "a.json"
    q.write_text(json.dumps(questions))
    a.write_text(json.dumps(annotations))
    return q, a, images


def test_questions_without_answers_annotation_or_one_image_file(tmp_path: Path) -> None:
    questions, annotations, images = _vqa_files(tmp_path)
    with pytest.raises(AnnotationError) as info:
        read_vqa(questions, annotations, images)
    assert "annotations[1].answers: no answers" in str(info.value)
    assert "no annotation for 1 question(s)" in str(info.value) and "question ids 20" in str(info.value)

    skipped: list[str] = []
    records = read_vqa(questions, annotations, images, skipped)
    # 11: no answers; 20: no annotation; 30: two files for image 3; 40: no file (left for the scan)
    assert [(r.question_id, r.path.name) for r in records] == [(10, "1.png"), (40, "000000000004.jpg")]
    assert [line.split(": ", 1)[1] for line in skipped] == [
        "annotations[1].answers: no answers",
        f"no annotation for 1 question(s) of {questions}, e.g. question ids 20",
        "several files for image id 3: 000000000003.png, 3.jpg",
    ]


# --- the data modules' policies ---------------------------------------------------------------


def _coco_module(tmp_path: Path, **kwargs: Any) -> tuple[CocoCaptions, Any]:
    data = write_dirty_coco(tmp_path / "coco")
    settings = dict(image_size=32, batch_size=4, num_workers=0, max_length=12)
    return CocoCaptions(train=data.split("train"), val=data.split("val"), **{**settings, **kwargs}), data


def test_error_policy_names_every_bad_file_and_entry_before_training(tmp_path: Path) -> None:
    module, data = _coco_module(tmp_path)
    with pytest.raises(BadDataError) as info:
        module.texts("train")  # the first use of the split: what the tokenizer is learnt from
    message = str(info.value)
    assert f"{len(data.bad_entries)} bad annotation entries (data.on_bad_annotation=error)" in message
    assert f"{len(data.bad_images)} bad image file(s) (data.on_bad_image=error)" in message
    for where, reason in [*data.bad_entries.items(), *data.bad_images.items()]:
        line = next((ln for ln in message.splitlines() if ln.strip().startswith(f"{where}:")), None)
        assert line is not None and reason in line, (where, message)
    assert "set data.on_bad_annotation=skip and data.on_bad_image=skip" in message
    assert module.records("val")  # the clean split reads


def test_error_lists_the_first_20_bad_images_and_counts_the_rest(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    document = {"images": [{"id": k, "file_name": f"{k}.png"} for k in range(30)], "annotations": []}
    for k in range(5):
        _save(Image.new("RGB", (8, 8)), folder / f"{k}.png")  # 25 of 30 files are missing
    (tmp_path / "c.json").write_text(json.dumps(document))
    module = CocoCaptions(train={"annotations": str(tmp_path / "c.json"), "images": str(folder)}, num_workers=0)
    with pytest.raises(BadDataError) as info:
        module.records("train")
    message = str(info.value)
    assert "25 bad image file(s)" in message and "... and 5 more" in message
    assert sum("No such file" in line for line in message.splitlines()) == 20


def test_skip_policy_leaves_out_and_reports_exactly_the_bad_data(tmp_path: Path, caplog) -> None:
    module, data = _coco_module(tmp_path, on_bad_image="skip")
    assert module.on_bad_annotation == "skip"  # follows on_bad_image unless set
    with caplog.at_level(logging.WARNING, logger="mmtx.data"):
        records = module.records("train")
    assert sorted(r.image_id for r in records) == list(range(1, data.train_images + 1))
    assert not any(str(r.path) in data.bad_images for r in records)
    found = [(d.split, d.kind, d.what) for d in module.report.items]
    assert sorted(w for _, kind, w in found if kind == "image") == sorted(data.bad_images)
    entries = [w for _, kind, w in found if kind == "annotation"]
    assert len(entries) == len(data.bad_entries) and {split for split, _, _ in found} == {"train"}
    for where, reason in data.bad_entries.items():
        assert any(e.startswith(f"{where}:") and reason in e for e in entries), where
    logged = caplog.text
    assert f"left out {len(data.bad_entries)} bad annotation entries" in logged
    assert f"left out {len(data.bad_images)} bad image file(s) and their {len(data.bad_images)} caption(s)" in logged

    report = module.report.write(tmp_path / "run" / REPORT_FILE)
    lines = report.read_text().splitlines()[1:]
    assert len(lines) == len(data.bad_images) + len(data.bad_entries)
    assert {tuple(line.split("\t")[:3]) for line in lines if "\timage\t" in line} == {
        ("train", "image", path) for path in data.bad_images
    }


def test_one_policy_each_for_images_and_annotations(tmp_path: Path) -> None:
    module, data = _coco_module(tmp_path, on_bad_image="skip", on_bad_annotation="error")
    with pytest.raises(BadDataError) as info:
        module.records("train")
    assert "bad annotation entries" in str(info.value) and "bad image file" not in str(info.value)
    module, data = _coco_module(tmp_path / "2", on_bad_image="error", on_bad_annotation="skip")
    with pytest.raises(BadDataError) as info:
        module.records("train")
    assert "bad annotation entries" not in str(info.value)
    assert f"{len(data.bad_images)} bad image file(s) (data.on_bad_image=error)" in str(info.value)


def test_no_image_left_is_an_error_even_when_skipping(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "gone.png"}], "annotations": []}))
    module = CocoCaptions(train={"annotations": str(tmp_path / "c.json"), "images": str(tmp_path)}, on_bad_image="skip")
    with pytest.raises(BadDataError, match="No image of the split is left"):
        module.records("train")


@pytest.mark.parametrize("key", ["on_bad_image", "on_bad_annotation"])
def test_unknown_policy_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ArgumentError, match=rf"^{key}='ignore' is not one of error, skip") as info:
        CocoCaptions(**{key: "ignore"})
    assert info.value.arguments == {key: "ignore"}  # what mmtx-train's start-up check names data.{key}


def _loader_over_a_file_that_breaks_after_the_scan(tmp_path: Path, policy: str, workers: int):
    module, data = _coco_module(
        tmp_path, on_bad_image="skip", num_workers=workers, tokenizer=functools.partial(Tokenizer.train, vocab_size=60)
    )
    module.records("train")  # the scan leaves the known bad files out
    module.on_bad_image = policy  # what happens to a file that breaks later
    broken = tmp_path / "coco" / "train" / "5.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # corrupted after the pre-flight check
    return module, broken


def test_decode_failure_in_the_main_process_names_the_file(tmp_path: Path) -> None:
    module, broken = _loader_over_a_file_that_breaks_after_the_scan(tmp_path, "error", workers=0)
    with pytest.raises(ImageLoadError) as info:
        list(module.train_dataloader())
    assert info.value.path == broken and "set data.on_bad_image=skip" in str(info.value)


@pytest.mark.parametrize("workers", [0, 1])
def test_decode_failure_under_skip_is_replaced_and_counted(tmp_path: Path, workers: int) -> None:
    module, broken = _loader_over_a_file_that_breaks_after_the_scan(tmp_path, "skip", workers)
    for _ in range(2):  # two epochs: the file is counted once
        batches = list(module.train_dataloader())
        assert all(b["images"].shape == (4, 3, 32, 32) and "image_failures" not in b for b in batches)
    decoded = [d for d in module.report.items if d.kind == "decode"]
    assert [(d.split, d.what) for d in decoded] == [("train", str(broken))]


def test_decode_failure_in_a_worker_reaches_the_main_process_as_load_error(tmp_path: Path) -> None:
    module, broken = _loader_over_a_file_that_breaks_after_the_scan(tmp_path, "error", workers=1)
    with pytest.raises(ImageLoadError) as info:  # not a RuntimeError wrapping a worker traceback
        list(module.train_dataloader())
    assert info.value.path == broken and "cannot load image" in str(info.value)


def test_captions_longer_than_max_length_are_cut_counted_and_reported(tmp_path: Path, caplog) -> None:
    module, data = _coco_module(
        tmp_path, on_bad_image="skip", tokenizer=functools.partial(Tokenizer.train, vocab_size=60)
    )
    with caplog.at_level(logging.WARNING, logger="mmtx.data"):
        batch = next(iter(module.train_dataloader()))
    assert batch["input_ids"].shape[1] <= 12
    cut = [d for d in module.report.items if d.kind == "truncated"]
    assert [d.what for d in cut] == data.long_captions and "> data.max_length=12" in cut[0].reason
    assert "1 of" in caplog.text and "longer than data.max_length=12 tokens and are cut" in caplog.text


def test_vqa_module_drops_the_questions_of_bad_images(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    _save(Image.new("RGB", (8, 8)), images / "1.png")
    (images / "2.png").touch()  # empty; image 3 has no file at all
    questions = {"questions": [{"question_id": i * 10 + k, "image_id": i, "question": "what?"}
                               for i in (1, 2, 3) for k in range(2)]}  # fmt: skip
    annotations = {"annotations": [{"question_id": q["question_id"], "image_id": q["image_id"],
                                    "answers": [{"answer": "red"}]} for q in questions["questions"]]}  # fmt: skip
    (tmp_path / "q.json").write_text(json.dumps(questions))
    (tmp_path / "a.json").write_text(json.dumps(annotations))
    files = {"questions": str(tmp_path / "q.json"), "annotations": str(tmp_path / "a.json"), "images": str(images)}
    with pytest.raises(BadDataError, match="2 bad image file"):
        VqaV2(train=files).records("train")
    module = VqaV2(train=files, on_bad_image="skip")
    assert [r.question_id for r in module.records("train")] == [10, 11]
    assert sorted(Path(d.what).name for d in module.report.items) == ["000000000003.jpg", "2.png"]


def test_report_file_keeps_growing_once_written(tmp_path: Path) -> None:
    report = BadDataReport()
    assert report.write(tmp_path / REPORT_FILE) is None and not (tmp_path / REPORT_FILE).exists()
    report.add("train", "decode", "/data/x.jpg", "OSError: broken")
    assert (tmp_path / REPORT_FILE).read_text().splitlines()[1] == "train\tdecode\t/data/x.jpg\tOSError: broken"


# --- checkpoints ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mmtx_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "last.ckpt")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_unreadable_checkpoints_say_what_is_wrong(tmp_path: Path, mmtx_checkpoint: Path) -> None:
    whole = mmtx_checkpoint.read_bytes()
    (tmp_path / "truncated.ckpt").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "empty.ckpt").touch()
    (tmp_path / "notes.ckpt").write_text("step 1000: loss 2.3\n")
    (tmp_path / "counter.ckpt").write_bytes(pickle.dumps(_Unsafe()))
    (tmp_path / "random.ckpt").write_bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    torch.save([torch.zeros(2)], tmp_path / "list.ckpt")
    cases = {
        "truncated.ckpt": "is truncated or corrupt", "empty.ckpt": "the checkpoint file is empty",
        "notes.ckpt": "is a text file, not a PyTorch checkpoint", "counter.ckpt": "weights_only=True refused it",
        "random.ckpt": "not a checkpoint mmtx can load safely", "list.ckpt": "is not a checkpoint (it holds a list)",
        "missing.ckpt": "checkpoint not found",
    }  # fmt: skip
    for name, message in cases.items():
        with pytest.raises(CheckpointError) as info:
            read_checkpoint(tmp_path / name)
        assert message in str(info.value), (name, str(info.value))
        assert str(tmp_path / name) in str(info.value)
        assert "weights_only=False" not in str(info.value)  # never advise unsafe loading


class _Unsafe(dict):
    """A pickled object of a class torch does not allow: refused, never constructed."""


def test_foreign_and_incomplete_checkpoints(tmp_path: Path, mmtx_checkpoint: Path) -> None:
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "foreign.ckpt")
    with pytest.raises(CheckpointError, match="was not written by an mmtx task"):
        load_task(tmp_path / "foreign.ckpt")
    ckpt = torch.load(mmtx_checkpoint, weights_only=True)
    torch.save({k: v for k, v in ckpt.items() if k != "state_dict"}, tmp_path / "no_weights.ckpt")
    with pytest.raises(CheckpointError, match="not a complete mmtx checkpoint: no 'state_dict' entry"):
        load_task(tmp_path / "no_weights.ckpt")
    torch.save({**ckpt, TASK_KEY: "mmtx.tasks.caption.Gone"}, tmp_path / "renamed.ckpt")
    with pytest.raises(CheckpointError, match="mmtx.tasks.caption.Gone, which this mmtx does not have"):
        load_task(tmp_path / "renamed.ckpt")
    state = dict(ckpt["state_dict"])
    state["model.encoder.cls_token"] = torch.zeros(1, 1, 7)
    torch.save({**ckpt, "state_dict": state}, tmp_path / "reshaped.ckpt")
    with pytest.raises(
        CheckpointError, match=r"model.encoder.cls_token: \(1, 1, 7\) in the checkpoint, \(1, 1, 32\) now"
    ):
        load_task(tmp_path / "reshaped.ckpt")
    assert load_task(mmtx_checkpoint).model.encoder.dim == 32  # the intact one loads


def test_resume_with_another_model_size_names_the_keys(mmtx_checkpoint: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        check_resume(
            read_checkpoint(mmtx_checkpoint),
            mmtx_checkpoint,
            "mmtx.tasks.caption.CaptionTask",
            tiny_model_config("model.encoder.dim=64"),
        )
    message = str(info.value)
    assert "model.encoder.dim: 32 in the checkpoint, 64 now" in message
    assert "model.decoder.context_dim: 32 in the checkpoint, 64 now" in message
    assert re.search(r"so \d+ tensor\(s\) do not fit", message)
    assert "model.encoder.blocks.0.attn.proj.weight: (32, 32) in the checkpoint, (64, 64) now" in message
    assert f"init_from={mmtx_checkpoint}" in message

    with pytest.raises(
        CheckpointError, match=r"model.encoder.depth: 1 in the checkpoint, 2 now[\s\S]*not in the checkpoint"
    ):
        check_resume(
            read_checkpoint(mmtx_checkpoint),
            mmtx_checkpoint,
            "mmtx.tasks.caption.CaptionTask",
            tiny_model_config("model.encoder.depth=2"),
        )
    with pytest.raises(
        CheckpointError, match="written by mmtx.tasks.caption.CaptionTask, but the config trains mmtx.tasks.vqa.VqaTask"
    ):
        check_resume(read_checkpoint(mmtx_checkpoint), mmtx_checkpoint, "mmtx.tasks.vqa.VqaTask", tiny_model_config())
    # settings that leave every tensor's shape alone may change
    check_resume(
        read_checkpoint(mmtx_checkpoint),
        mmtx_checkpoint,
        "mmtx.tasks.caption.CaptionTask",
        tiny_model_config("model.decoder.dropout=0.3"),
    )


def test_resume_from_before_a_setting_existed_is_quiet_at_its_default(
    mmtx_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint written before a model setting existed lacks its key; the config's null (the
    constructor's default) is no change worth a warning, and any other value is."""
    ckpt = read_checkpoint(mmtx_checkpoint)
    del ckpt["hyper_parameters"]["model"]["encoder"]["stem_channels"]
    target = "mmtx.tasks.caption.CaptionTask"
    with caplog.at_level(logging.WARNING, logger="mmtx.checkpoint"):
        check_resume(ckpt, mmtx_checkpoint, target, tiny_model_config())
        assert "changed model settings" not in caplog.text
        check_resume(ckpt, mmtx_checkpoint, target, tiny_model_config("model.encoder.stem_channels=[8,8,16]"))
    assert "model.encoder.stem_channels: absent in the checkpoint, [8, 8, 16] now" in caplog.text


# --- tokenizer files that load but could not work ---------------------------------------------


def test_tokenizer_json_with_gaps_in_ids_or_no_unknown_token_is_refused() -> None:
    document = json.loads(Tokenizer.train(["a red circle", "a blue square"], vocab_size=40).to_str())
    vocab = document["model"]["vocab"]
    gap = json.loads(json.dumps(document))
    del gap["model"]["vocab"][min((t for t in vocab if not t.startswith("[")), key=vocab.get)]
    with pytest.raises(TokenizerError, match=r"token ids are not contiguous \(id \d+ in a vocabulary of \d+\)"):
        Tokenizer.from_str(json.dumps(gap))  # an id past the embedding table, at training time
    no_unk = json.loads(json.dumps(document))
    del no_unk["model"]["vocab"]["[UNK]"]
    with pytest.raises(TokenizerError, match="the tokenizer cannot encode text .*Missing \\[UNK\\] token"):
        Tokenizer.from_str(json.dumps(no_unk))  # else: a crash in a loader worker on the first odd word


def test_text_that_is_not_valid_unicode_is_a_tokenizer_error() -> None:
    tokenizer = Tokenizer.train(["a red circle"], vocab_size=40)
    with pytest.raises(TokenizerError, match=r"text 1 is not valid Unicode: lone surrogate U\+D800 at character 2"):
        tokenizer.encode_batch(["fine", "ab\ud800"], max_length=8)
    with pytest.raises(TypeError):  # not text at all: the library's own error
        tokenizer.encode_batch(["fine", 3], max_length=8)  # type: ignore[list-item]
