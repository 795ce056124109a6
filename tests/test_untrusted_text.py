"""Text read from files a user is handed is bounded: captions, questions and answers are cut to
``data.max_text_chars`` as they are read (counted, and logged per file), and a JSONL line, a tar
shard's text member or a CSV row too large to read is a bad annotation named by file and line.

Each test is written as the attack it stops: a multi-megabyte caption that would be tokenized at
every batch and handed to METEOR's Java, a shard member whose header claims 256 MiB, a CSV cell
over the csv module's field limit.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import tarfile
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mmtx.data.annotations import MAX_TEXT_CHARS, AnnotationError, TextLimit, load_json_object, read_text
from mmtx.data.bad_data import BadDataError
from mmtx.data.captions import CocoCaptions, PairsCaptions, read_coco_captions, read_karpathy, read_pairs
from mmtx.data.captions.files import MAX_LINE_CHARS
from mmtx.data.shards import read_shards, read_vqa_shards
from mmtx.data.shards.files import MAX_MEMBER_BYTES
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.vqa import read_vqa

HUGE = 5_000_000  # characters: a scraped caption of 5 MB
LOGGER = "mmtx.data"


def huge_text(chars: int = HUGE, word: str = "spam ") -> str:
    """``chars`` characters of words (whitespace collapsing leaves them as long)."""
    return (word * (chars // len(word) + 1))[:chars].strip()


def cut_lines(caplog: pytest.LogCaptureFixture, file: Path) -> list[str]:
    """The log lines that report texts of ``file`` cut to the text limit."""
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"{file}: cut ") and "data.max_text_chars" in r.getMessage()]  # fmt: skip


def write_json(path: Path, document: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def write_png(path: Path, colour: str = "red") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), colour).save(path)
    return path


# --- captions, questions and answers are cut as they are read ---------------------------------


def test_a_huge_caption_in_a_jsonl_pairs_file_is_cut_and_reported(tmp_path: Path, caplog) -> None:
    long = huge_text(MAX_LINE_CHARS - 100)  # the longest caption a JSONL line can hold
    rows = [{"image": "a.png", "caption": long}, {"image": "b.png", "caption": ["a short one", long]}]
    file = tmp_path / "pairs.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = read_pairs(file, tmp_path)
    assert [r.captions for r in records] == [(long[:MAX_TEXT_CHARS],), ("a short one", long[:MAX_TEXT_CHARS])]
    assert cut_lines(caplog, file) == [
        f"{file}: cut 2 text(s) longer than data.max_text_chars={MAX_TEXT_CHARS} characters (the longest has {len(long)})"
    ]


def test_a_huge_caption_in_coco_captions_is_cut_and_reported(tmp_path: Path, caplog) -> None:
    long = huge_text()
    file = write_json(tmp_path / "captions.json", {
        "images": [{"id": 1, "file_name": "1.jpg"}, {"id": 2, "file_name": "2.jpg"}],
        "annotations": [{"image_id": 1, "caption": long}, {"image_id": 1, "caption": "a red ball"},
                        {"image_id": 2, "caption": "  x " + long}],
    })  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = read_coco_captions(file, tmp_path)
    assert [r.captions for r in records] == [(long[:MAX_TEXT_CHARS], "a red ball"), (("x " + long)[:MAX_TEXT_CHARS],)]
    assert len(cut_lines(caplog, file)) == 1 and f"{file}: cut 2 text(s)" in cut_lines(caplog, file)[0]
    limit = TextLimit(50)  # what a data module passes from data.max_text_chars
    records = read_coco_captions(file, tmp_path, limit=limit)
    assert max(len(c) for r in records for c in r.captions) == 50
    assert [(what, length) for what, length in limit.cut] == [
        (f"{file}: annotations[0].caption", len(long)),
        (f"{file}: annotations[2].caption", len(long) + 2),
    ]


def test_a_huge_sentence_in_a_karpathy_file_is_cut_and_reported(tmp_path: Path, caplog) -> None:
    long = huge_text()
    file = write_json(tmp_path / "dataset_coco.json", {"images": [
        {"split": "train", "cocoid": 1, "filepath": "train2014", "filename": "1.jpg",
         "sentences": [{"raw": long}, {"tokens": long.split()}, {"raw": "a dog"}]},
    ]})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        [record] = read_karpathy(file, tmp_path, "train")
    assert record.captions == (long[:MAX_TEXT_CHARS], long[:MAX_TEXT_CHARS], "a dog")
    assert len(cut_lines(caplog, file)) == 1 and f"{file}: cut 2 text(s)" in cut_lines(caplog, file)[0]


def test_a_huge_question_and_answer_in_vqa_files_are_cut_and_reported(tmp_path: Path, caplog) -> None:
    long = huge_text()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "1.png").touch()  # found by name: the reader does not open it
    questions = write_json(tmp_path / "questions.json", {"questions": [
        {"question_id": 10, "image_id": 1, "question": long + "?"},
        {"question_id": 11, "image_id": 1, "question": "what colour is it?"},
    ]})  # fmt: skip
    annotations = write_json(tmp_path / "annotations.json", {"annotations": [
        {"question_id": 10, "image_id": 1, "answers": [{"answer": "red"}, {"answer": long}]},
        {"question_id": 11, "image_id": 1, "answers": [{"answer": "red"}]},
    ]})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = read_vqa(questions, annotations, tmp_path / "images")
    assert [r.question for r in records] == [long[:MAX_TEXT_CHARS], "what colour is it?"]
    assert records[0].answers == ("red", long[:MAX_TEXT_CHARS])
    assert len(cut_lines(caplog, questions)) == 1 and f"{questions}: cut 1 text(s)" in cut_lines(caplog, questions)[0]
    assert (
        len(cut_lines(caplog, annotations)) == 1
        and f"{annotations}: cut 1 text(s)" in cut_lines(caplog, annotations)[0]
    )
    limit = TextLimit(50)  # the questions' and the annotations' reader both cut to it and list in it
    [record, _] = read_vqa(questions, annotations, tmp_path / "images", limit=limit)
    assert record.question == long[:50] and record.answers == ("red", long[:50])
    assert limit.cut == [(f"{questions}: questions[0].question", len(long) + 1),
                         (f"{annotations}: annotations[0].answers[1].answer", len(long))]  # fmt: skip


# --- what is too large to read at all is a bad annotation -------------------------------------


def test_a_jsonl_line_over_the_line_limit_is_a_bad_annotation(tmp_path: Path, caplog) -> None:
    write_png(tmp_path / "a.png")
    file = tmp_path / "pairs.jsonl"
    lines = [json.dumps({"image": "a.png", "caption": text}) for text in ("a red square", huge_text(), "red")]
    file.write_text("\n".join(lines) + "\n")
    skipped: list[str] = []
    assert read_pairs(file, tmp_path, skipped=skipped)[0].captions == ("a red square", "red")
    assert skipped == [f"{file}: line 2: {len(lines[1])} characters, over the {MAX_LINE_CHARS} a JSONL line may have"]
    with pytest.raises(AnnotationError) as info:  # the error policy: one line naming file and line
        read_pairs(file, tmp_path)
    assert str(info.value) == skipped[0]

    module = _one_bad_row_under_both_policies(
        file, tmp_path, r"pairs.jsonl: line 2: .* over the 1048576 a JSONL line may have", caplog
    )
    assert [d.what for d in module.report.items if d.kind == "annotation"] == skipped


def _one_bad_row_under_both_policies(file: Path, images: Path, match: str, caplog) -> PairsCaptions:
    """A pairs file whose one bad row stops the data module (``error``) or is left out and
    counted (``skip``, returned), its good row ("a red square", "red") kept."""
    files = {"file": str(file), "images": str(images)}
    with pytest.raises(BadDataError, match=match):
        PairsCaptions(train=files, num_workers=0).records("train")
    module = PairsCaptions(train=files, num_workers=0, on_bad_annotation="skip")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert module.records("train")[0].captions == ("a red square", "red")
    assert "left out 1 bad annotation entries" in caplog.text
    return module


def write_sparse_shard(path: Path, claimed: int) -> Path:
    """A tar shard whose sample ``b`` has a ``.txt`` member of ``claimed`` bytes, all of them a
    hole in a sparse file (nothing written to disk), between two good samples."""

    def member(name: str, data: bytes) -> bytes:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        return info.tobuf(tarfile.GNU_FORMAT) + data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)

    image = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(image, format="PNG")
    with path.open("wb") as f:
        f.write(
            member("a.png", image.getvalue()) + member("a.txt", b"a red square") + member("b.png", image.getvalue())
        )
        big = tarfile.TarInfo("b.txt")
        big.size = claimed
        f.write(big.tobuf(tarfile.GNU_FORMAT))
        f.seek(claimed, io.SEEK_CUR)  # the member's bytes: a hole
        f.write(
            member("c.png", image.getvalue()) + member("c.txt", b"a red square too") + b"\0" * 2 * tarfile.BLOCKSIZE
        )
    return path


def test_a_shard_text_member_claiming_256_mib_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    claimed = 256 * 2**20
    shard = write_sparse_shard(tmp_path / "00000.tar", claimed)
    assert shard.stat().st_size > claimed  # a real member of 256 MiB, as far as tarfile can tell
    with tarfile.open(shard) as tar:
        assert tar.getmember("b.txt").size == claimed

    read: list[tuple[str, int]] = []
    extract = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile",
                        lambda tar, member: read.append((member.name, member.size)) or extract(tar, member))  # fmt: skip
    skipped: list[str] = []
    records = read_shards(shard, skipped=skipped)
    assert [r.captions for r in records] == [("a red square",), ("a red square too",)]
    assert skipped == [f"{shard}: b.txt: {claimed} bytes, over the {MAX_MEMBER_BYTES} a text member may have"]
    assert read == [("a.txt", 12), ("c.txt", 16)]  # b.txt was never opened
    with pytest.raises(AnnotationError, match=rf"00000.tar: b.txt: {claimed} bytes, over the {MAX_MEMBER_BYTES}"):
        read_shards(shard)


def test_long_shard_captions_and_questions_are_cut_and_reported_per_shard(tmp_path: Path, caplog) -> None:
    from tests.test_shards import encoded, write_shard

    long = huge_text(300_000)  # two of them fit in a member
    first = write_shard(tmp_path / "00000.tar", [{"__key__": "a", "jpg": encoded("red"), "txt": long}])
    second = write_shard(tmp_path / "00001.tar", [
        {"__key__": "b", "jpg": encoded("red"), "json": json.dumps({"captions": ["ok", long, long]}).encode()},
    ])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = read_shards([first, second])
    assert [r.captions for r in records] == [
        (long[:MAX_TEXT_CHARS],),
        ("ok", long[:MAX_TEXT_CHARS], long[:MAX_TEXT_CHARS]),
    ]
    assert f"{first}: cut 1 text(s)" in cut_lines(caplog, first)[0]
    assert f"{second}: cut 2 text(s)" in cut_lines(caplog, second)[0]

    question = {"question_id": 1, "question": long, "answers": ["red", long]}
    vqa = write_shard(tmp_path / "vqa.tar", [
        {"__key__": "v", "jpg": encoded("red"), "json": json.dumps({"image_id": 3, "questions": [question]}).encode()},
    ])  # fmt: skip
    [record] = read_vqa_shards(vqa)
    assert record.question == long[:MAX_TEXT_CHARS] and record.answers == ("red", long[:MAX_TEXT_CHARS])
    limit = TextLimit(50)
    [record] = read_vqa_shards(vqa, limit=limit)
    assert record.question == long[:50] and record.answers == ("red", long[:50])
    assert limit.cut == [(f"{vqa}: v.json questions[0].question", len(long)),
                         (f"{vqa}: v.json questions[0].answers[1]", len(long))]  # fmt: skip


def write_csv_with_a_huge_cell(path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        writer.writerow(["a.png", "a red square"])
        writer.writerow(["a.png", huge_text(csv.field_size_limit() + 1000)])  # line 3
        writer.writerow(["a.png", "red"])
    return path


def test_a_csv_cell_over_the_field_limit_is_a_bad_annotation_named_by_line(tmp_path: Path, caplog) -> None:
    write_png(tmp_path / "a.png")
    file = write_csv_with_a_huge_cell(tmp_path / "pairs.csv")
    limit = csv.field_size_limit()
    skipped: list[str] = []
    assert read_pairs(file, tmp_path, skipped=skipped)[0].captions == ("a red square", "red")
    assert skipped == [f"{file}: line 3: unreadable CSV row: field larger than field limit ({limit})"]
    with pytest.raises(AnnotationError) as info:  # not csv.Error
        read_pairs(file, tmp_path)
    assert str(info.value) == skipped[0]
    assert csv.field_size_limit() == limit  # the global limit is left as it was

    _one_bad_row_under_both_policies(
        file, tmp_path, r"pairs.csv: line 3: unreadable CSV row: field larger than field limit", caplog
    )

    header = tmp_path / "header.csv"
    header.write_text(f"image,{'c' * (limit + 1)}\na.png,red\n")
    with pytest.raises(
        AnnotationError, match=rf"header.csv: line 1: unreadable CSV header: field larger than field limit \({limit}\)"
    ):
        read_pairs(header, tmp_path)


# --- the data module: what it serves and validates against is cut ------------------------------


def test_the_data_module_serves_and_validates_against_cut_captions(tmp_path: Path, caplog) -> None:
    long = huge_text()
    for split in ("train", "val"):
        for k, colour in ((1, "red"), (2, "blue")):
            write_png(tmp_path / split / f"{k}.png", colour)
        write_json(tmp_path / f"{split}.json", {
            "images": [{"id": 1, "file_name": "1.png"}, {"id": 2, "file_name": "2.png"}],
            "annotations": [{"image_id": 1, "caption": "a red square"}, {"image_id": 1, "caption": long},
                            {"image_id": 2, "caption": "a blue square"}],
        })  # fmt: skip
    splits = {s: {"annotations": str(tmp_path / f"{s}.json"), "images": str(tmp_path / s)} for s in ("train", "val")}
    module = CocoCaptions(**splits, image_size=32, batch_size=2, num_workers=0, max_length=12, max_text_chars=300,
                          tokenizer=functools.partial(Tokenizer.train, vocab_size=60))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        module.setup("fit")
        batch = next(iter(module.val_dataloader()))
    assert module.records("train")[0].captions == ("a red square", long[:300])
    assert sorted(module.datasets["train"][i]["caption"] for i in range(3)) == [
        "a blue square",
        "a red square",
        long[:300],
    ]
    assert batch["references"] == [["a red square", long[:300]], ["a blue square"]]  # what the caption metrics score
    assert module.references("val") == {1: ["a red square", long[:300]], 2: ["a blue square"]}
    cut = [
        (d.split, d.what, d.reason) for d in module.report.items if d.kind == "truncated" and "characters" in d.reason
    ]
    assert cut == [(s, f"{tmp_path / f'{s}.json'}: annotations[1].caption", f"{len(long)} characters > data.max_text_chars=300")
                   for s in ("train", "val")]  # fmt: skip
    for split in ("train", "val"):
        assert f"{tmp_path / f'{split}.json'}: cut 1 text(s) longer than data.max_text_chars=300" in caplog.text


def test_max_text_chars_is_a_data_setting_of_every_source() -> None:
    from omegaconf import OmegaConf

    from mmtx.cli.common import CONFIG_DIR
    from mmtx.config_check import data_built_problems
    from tests.helpers import compose_train

    for preset in sorted((Path(CONFIG_DIR) / "data").glob("*.yaml")):
        assert OmegaConf.load(preset).max_text_chars == MAX_TEXT_CHARS, preset
    assert not [p for p in data_built_problems(compose_train(["data=pairs"])) if "max_text_chars" in p]
    assert data_built_problems(compose_train(["data=pairs", "data.max_text_chars=0"])) == [
        "data.max_text_chars=0 must be a positive integer"
    ]
    with pytest.raises(ValueError, match="^max_text_chars=0 must be a positive integer"):
        CocoCaptions(max_text_chars=0)


def test_json_nested_deeper_than_python_recurses_is_a_bad_annotation(tmp_path: Path) -> None:
    """A 200 kB line of brackets: json.loads raises RecursionError, not ValueError."""
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"image": "a.png", "caption": "a cat"}) + "\n" + "[" * 200_000 + "\n")
    skipped: list[str] = []
    assert len(read_pairs(pairs, tmp_path, skipped=skipped)) == 1
    assert len(skipped) == 1 and "line 2: invalid JSON: maximum recursion depth" in skipped[0]
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    with pytest.raises(AnnotationError, match="invalid JSON: nested too deeply"):
        load_json_object(deep)


def test_an_annotation_path_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path) -> None:
    for path in (Path("/dev/zero"), tmp_path):  # endless, and a folder
        with pytest.raises(AnnotationError, match="is not a regular file"):
            read_text(path)
