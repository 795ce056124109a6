"""VQA v2 reader/writer (official format, image lookup by id, errors that name the culprit) and the
shapes VQA generator (answers grounded in the scene, annotator-like noise, balance, caching)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mmtx.data.annotations import AnnotationError
from mmtx.data.synthetic import shapes_vqa
from mmtx.data.synthetic.scenes import COLORS, Shape
from mmtx.data.synthetic.shapes import Scene, draw_scene
from mmtx.data.synthetic.shapes_vqa import ANSWERS_PER_QUESTION, ask_about_scene, generate_shapes_vqa
from mmtx.data.vqa import VqaRecord, read_vqa, write_vqa
from mmtx.metrics.vqa import question_accuracy


def _write(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def _questions() -> dict[str, Any]:
    return {
        "info": {},
        "task_type": "Open-Ended",
        "data_type": "mscoco",
        "data_subtype": "val2014",
        "questions": [
            {"image_id": 42, "question": "What color is the  bus?", "question_id": 42001},
            {"image_id": 42, "question": "How many people?", "question_id": 42000},
            {"image_id": 7, "question": "Is it raining?", "question_id": 7000},
        ],
    }


def _annotations() -> dict[str, Any]:
    def entry(question_id: int, image_id: int, answers: list[str], answer_type: str, question_type: str) -> dict:
        return {
            "question_id": question_id,
            "image_id": image_id,
            "answer_type": answer_type,
            "question_type": question_type,
            "multiple_choice_answer": answers[0],
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1} for k, a in enumerate(answers)],
        }

    return {
        "info": {},
        "data_subtype": "val2014",
        "annotations": [
            entry(7000, 7, ["no"] * 9 + ["yes"], "yes/no", "is it"),
            entry(42000, 42, ["2"] * 6 + ["two", "3", "2 ", "2"], "number", "how many"),
            entry(42001, 42, ["Red"] * 10, "other", "what color is the"),
            entry(99000, 99, ["x"] * 10, "other", "what"),  # a question not asked: ignored
        ],
    }


@pytest.fixture()
def vqa_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    images = tmp_path / "val2014"
    images.mkdir()
    for name in (
        "COCO_val2014_000000000042.jpg",
        "000000000007.png",
        "COCO_train2014_000000000099.jpg",
        "notes.txt",
        "COCO_val2014_000000000099.json",
    ):
        (images / name).write_bytes(b"\xff\xd8")  # the reader locates files and does not open them
    return _write(tmp_path / "q.json", _questions()), _write(tmp_path / "a.json", _annotations()), images


def test_reads_records_sorted_by_question_id_with_raw_answers(vqa_files: tuple[Path, Path, Path]) -> None:
    questions, annotations, images = vqa_files
    records = read_vqa(questions, annotations, images)
    assert [r.question_id for r in records] == [7000, 42000, 42001]
    assert records[0] == VqaRecord(
        7000, 7, images / "000000000007.png", "Is it raining?", ("no",) * 9 + ("yes",), "yes/no", "is it"
    )
    assert records[1].answers == ("2",) * 6 + ("two", "3", "2 ", "2")  # as typed: the metric normalises
    assert records[2].path == images / "COCO_val2014_000000000042.jpg"
    assert records[2].question == "What color is the bus?"  # whitespace collapsed
    assert (records[2].answer_type, records[2].question_type) == ("other", "what color is the")


def test_test_split_without_annotations(vqa_files: tuple[Path, Path, Path]) -> None:
    questions, _, images = vqa_files
    records = read_vqa(questions, None, images)
    assert len(records) == 3 and all(r.answers == () and r.answer_type is r.question_type is None for r in records)


def test_image_names_by_plain_id_and_without_data_subtype(tmp_path: Path) -> None:
    images = tmp_path / "imgs"
    images.mkdir()
    for name in ("5.jpg", "COCO_test2015_000000000006.JPG"):
        (images / name).write_bytes(b"x")
    document = {
        "questions": [
            {"image_id": 5, "question": "q?", "question_id": 1},
            {"image_id": 6, "question": "q?", "question_id": 2},
        ]
    }
    records = read_vqa(_write(tmp_path / "q.json", document), None, images)
    assert [r.path.name for r in records] == ["5.jpg", "COCO_test2015_000000000006.JPG"]  # any COCO subtype


def test_write_round_trips_through_the_reader(tmp_path: Path) -> None:
    images = tmp_path / "imgs"
    images.mkdir()
    (images / "000000000003.png").write_bytes(b"x")
    records = [
        VqaRecord(31, 3, images / "000000000003.png", "how many?", ("2", "two", "3", "3", "3"), "number", "how many"),
        VqaRecord(30, 3, images / "000000000003.png", "what?", ("red",), None, None),
    ]
    write_vqa(records, tmp_path / "out" / "q.json", tmp_path / "out" / "a.json", data_subtype="train2014")
    assert read_vqa(tmp_path / "out" / "q.json", tmp_path / "out" / "a.json", images) == sorted(
        records, key=lambda r: r.question_id
    )
    annotation = json.loads((tmp_path / "out" / "a.json").read_text())["annotations"][0]
    assert annotation["multiple_choice_answer"] == "3"
    assert [a["answer_id"] for a in annotation["answers"]] == [1, 2, 3, 4, 5]
    assert json.loads((tmp_path / "out" / "q.json").read_text())["data_subtype"] == "train2014"

    write_vqa(records, tmp_path / "test_q.json", None, data_subtype="test2015")  # test split: questions only
    assert [r.answers for r in read_vqa(tmp_path / "test_q.json", None, images)] == [(), ()]
    assert not (tmp_path / "None").exists()
    with pytest.raises(ValueError, match="duplicate question id 31"):
        write_vqa(records + records[:1], tmp_path / "q2.json", None, "x")
    with pytest.raises(ValueError, match="question 9 has no answers"):
        write_vqa([VqaRecord(9, 3, images, "q?", (), None, None)], tmp_path / "q3.json", tmp_path / "a3.json", "x")


def _edited(document: dict[str, Any], edit: Any) -> dict[str, Any]:
    edit(document)
    return document


@pytest.mark.parametrize(
    ("questions_edit", "annotations_edit", "message"),
    [
        (lambda d: d.pop("questions"), None, r"q.json: questions: missing key 'questions'"),
        (lambda d: d["questions"][1].pop("question_id"), None, r"q.json: questions\[1\].question_id: missing key"),
        (
            lambda d: d["questions"][0].update(image_id="42"),
            None,
            r"q.json: questions\[0\].image_id: expected an integer, got a string",
        ),
        (lambda d: d["questions"].append(d["questions"][0]), None, r"questions\[3\].question_id: duplicate .* 42001"),
        (lambda d: d["questions"][2].update(question=" "), None, r"questions\[2\].question: empty question"),
        (
            None,
            lambda d: d["annotations"].pop(0),
            r"a.json: no annotation for 1 question\(s\) of .*q.json, e.g. .* 7000",
        ),
        (
            None,
            lambda d: d["annotations"][1].update(image_id=7),
            r"a.json: annotations\[1\].image_id: image id 7, but question 42000 .* is about image 42",
        ),
        (None, lambda d: d["annotations"][0].update(answers=[]), r"annotations\[0\].answers: no answers"),
        (
            None,
            lambda d: d["annotations"][0]["answers"][3].pop("answer"),
            r"annotations\[0\].answers\[3\].answer: missing key 'answer'",
        ),
        (None, lambda d: d["annotations"][2].update(answer_type=3), r"annotations\[2\].answer_type: expected a string"),
    ],
)
def test_bad_files_name_the_file_and_entry(
    vqa_files: tuple[Path, Path, Path], questions_edit: Any, annotations_edit: Any, message: str
) -> None:
    questions, annotations, images = vqa_files
    if questions_edit:
        _write(questions, _edited(_questions(), questions_edit))
    if annotations_edit:
        _write(annotations, _edited(_annotations(), annotations_edit))
    with pytest.raises(AnnotationError, match=message):
        read_vqa(questions, annotations, images)


def test_missing_and_ambiguous_images_are_reported_by_id(vqa_files: tuple[Path, Path, Path]) -> None:
    questions, annotations, images = vqa_files
    document = _questions()
    document["questions"] += [{"image_id": i, "question": "q?", "question_id": i * 1000} for i in range(99, 107)]
    _write(questions, document)
    # 8 missing ids, the first 5 listed; the file for 99 is named for train2014, not this val2014 file
    with pytest.raises(
        AnnotationError,
        match=r"val2014: no image file for 8 image id\(s\) of .*q.json, "
        r"e.g. ids 99, 100, 101, 102, 103; expected names like "
        r"COCO_val2014_000000000099.jpg",
    ):
        read_vqa(questions, None, images)

    _write(questions, _questions())
    (images / "42.jpg").write_bytes(b"x")
    with pytest.raises(AnnotationError, match="several files for image id 42: 42.jpg, COCO_val2014_000000000042.jpg"):
        read_vqa(questions, annotations, images)
    with pytest.raises(AnnotationError, match="cannot list the image folder"):
        read_vqa(questions, annotations, images / "nowhere")
    with pytest.raises(AnnotationError, match="annotation file not found"):
        read_vqa(questions, images / "nowhere.json", images)


# ---- shapes VQA --------------------------------------------------------------------------------
_RELATIONS = {"left of": "left", "right of": "right", "above": "above", "below": "below"}


def _clearly(a: Shape, relation: str, b: Shape) -> bool:
    """`a` is `relation` of `b` by the shapes' 2:1 rule (image y points down)."""
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    return {
        "left": dx >= 2 * abs(dy),
        "right": -dx >= 2 * abs(dy),
        "above": dy >= 2 * abs(dx),
        "below": -dy >= 2 * abs(dx),
    }[relation]


def _on_side(a: Shape, relation: str, b: Shape) -> bool:
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    return {"left": dx > 0, "right": dx < 0, "above": dy > 0, "below": dy < 0}[relation]


def _truth(question: str, scene: Scene) -> str:
    """The answer to a shapes question, worked out from the scene's geometry."""
    shapes = scene.shapes
    named = {f"{s.color} {s.kind}": s for s in shapes}

    def only(matches: list[Shape]) -> Shape:
        assert len(matches) == 1, (question, scene)  # asked only when unambiguous
        return matches[0]

    yes_no = {True: "yes", False: "no"}
    if question == "how many shapes are there?":
        return str(len(shapes))
    if m := re.fullmatch(r"how many (circle|square|triangle)s are there\?", question):
        return str(sum(s.kind == m[1] for s in shapes))
    if m := re.fullmatch(r"how many (\w+) shapes are there\?", question):
        return str(sum(m[1] in (s.size, s.color) for s in shapes))
    if m := re.fullmatch(r"is there a (\w+)\?", question):
        return yes_no[any(s.kind == m[1] for s in shapes)]
    if m := re.fullmatch(r"is there a (\w+) shape\?", question):
        return yes_no[any(m[1] in (s.size, s.color) for s in shapes)]
    if m := re.fullmatch(r"is there a (\w+) (\w+)\?", question):
        return yes_no[any((s.color, s.kind) == (m[1], m[2]) for s in shapes)]
    if m := re.fullmatch(r"what color is the (\w+)\?", question):
        return only([s for s in shapes if s.kind == m[1]]).color
    if m := re.fullmatch(r"what color is the (\w+) shape\?", question):
        return only([s for s in shapes if s.size == m[1]]).color
    if m := re.fullmatch(r"what color is the (\w+) (\w+)\?", question):
        return only([s for s in shapes if (s.size, s.kind) == (m[1], m[2])]).color
    if m := re.fullmatch(r"what shape is the (\w+) object\?", question):
        return only([s for s in shapes if s.color == m[1]]).kind
    if m := re.fullmatch(r"what size is the (\w+ \w+)\?", question):
        return named[m[1]].size
    if m := re.fullmatch(rf"is the (\w+ \w+) ({'|'.join(_RELATIONS)}) the (\w+ \w+)\?", question):
        a, relation, b = named[m[1]], _RELATIONS[m[2]], named[m[3]]
        opposite = {"left": "right", "right": "left", "above": "below", "below": "above"}[relation]
        assert _clearly(a, relation, b) or _clearly(a, opposite, b), (question, scene)  # never a guess
        return yes_no[_clearly(a, relation, b)]
    if m := re.fullmatch(rf"what is ({'|'.join(_RELATIONS)}) the (\w+ \w+)\?", question):
        relation, b = _RELATIONS[m[1]], named[m[2]]
        answer = only([s for s in shapes if s is not b and _on_side(s, relation, b)])
        assert _clearly(answer, relation, b), (question, scene)
        return f"{answer.color} {answer.kind}"
    raise AssertionError(f"unexpected question {question!r}")


def _asked(count: int, seed: int = 0, per_scene: int = 5) -> list[tuple[Scene, list[shapes_vqa.ShapesQuestion]]]:
    rng = random.Random(seed)
    return [
        (scene, ask_about_scene(scene, rng, per_scene))
        for _, _, scene in (draw_scene(rng, 64, num_captions=1) for _ in range(count))
    ]


def test_questions_are_answered_by_the_scene() -> None:
    families = Counter()
    for scene, questions in _asked(300):
        assert len({q.question for q in questions}) == 5
        for q in questions:
            assert q.answer == _truth(q.question, scene), (q, scene)
            families[q.question_type] += 1
    assert set(families) == {
        "how many",
        "is there a",
        "what color is the",
        "what shape is the",
        "what size is the",
        "is the",
        "what is",
    }


def test_ten_annotator_answers_mostly_right_with_some_noise() -> None:
    dissent, total, kinds_of_dissent = 0, 0, set()
    for _, questions in _asked(200):
        for q in questions:
            assert len(q.answers) == ANSWERS_PER_QUESTION
            others = [a for a in q.answers if a != q.answer]
            assert len(others) <= 4  # the right answer always has the majority...
            assert question_accuracy(q.answer, q.answers) == 1.0  # ...and full credit
            dissent, total = dissent + len(others), total + len(q.answers)
            kinds_of_dissent.update(others)
    assert 0.08 < dissent / total < 0.25
    # wrong answers and synonyms, e.g. number words that the official normalisation accepts
    assert {"two", "ball", "little", "yes", "no"} <= kinds_of_dissent


def test_answer_types_and_yes_no_are_balanced() -> None:
    asked = [q for _, questions in _asked(300) for q in questions]
    types = Counter(q.answer_type for q in asked)
    assert set(types) == {"yes/no", "number", "other"}
    assert all(abs(n / len(asked) - 1 / 3) < 0.02 for n in types.values()), types
    yes_no = Counter(q.answer for q in asked if q.answer_type == "yes/no")
    assert abs(yes_no["yes"] / (yes_no["yes"] + yes_no["no"]) - 0.5) < 0.07, yes_no


def test_no_question_about_an_ambiguous_shape() -> None:
    left = Shape("circle", "red", "small", (10.0, 30.0), 4.0, COLORS["red"])
    right = Shape("circle", "blue", "small", (50.0, 30.0), 4.0, COLORS["blue"])
    diagonal = Shape("square", "green", "large", (30.0, 50.0), 9.0, COLORS["green"])  # neither clearly
    scene = Scene(64, (left, right, diagonal))
    asked = [q.question for q in ask_about_scene(scene, random.Random(1), 10)]
    asked += [c.question for c in shapes_vqa._candidates(scene)]
    assert "what color is the circle?" not in asked  # two circles
    assert "what color is the small shape?" not in asked  # two small shapes
    assert "what color is the large shape?" in asked and "what color is the square?" in asked
    assert "is the red circle left of the blue circle?" in asked
    assert not any("green square" in q and ("left" in q or "right" in q or "above" in q) for q in asked)
    assert "what is left of the blue circle?" not in asked  # the green square is left of it too
    assert "what is right of the red circle?" not in asked  # and right of the red one


def test_same_seed_same_questions() -> None:
    first, second = _asked(20, seed=3), _asked(20, seed=3)
    assert [qs for _, qs in first] == [qs for _, qs in second]
    assert [qs for _, qs in first] != [qs for _, qs in _asked(20, seed=4)]
    with pytest.raises(ValueError, match="count"):
        ask_about_scene(first[0][0], random.Random(0), 11)


def test_generate_writes_official_files_and_reuses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "shapes_vqa"
    files = generate_shapes_vqa(root, num_train=6, num_val=3, image_size=32, seed=2, questions_per_image=4)
    assert files == {
        split: (root / f"questions_{split}.json", root / f"annotations_{split}.json", root / split)
        for split in ("train", "val")
    }
    train, val = (read_vqa(*files[split]) for split in ("train", "val"))
    assert len(train) == 6 * 4 and len(val) == 3 * 4
    assert len({r.image_id for r in train}) == 6 and not {r.image_id for r in train} & {r.image_id for r in val}
    assert len({r.question_id for r in train + val}) == len(train + val)
    for record in train + val:
        assert len(record.answers) == 10 and record.answer_type in ("yes/no", "number", "other")
        with Image.open(record.path) as img:
            assert img.size == (32, 32) and img.mode == "RGB"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes_vqa"]  # no staging directory left

    asked = []
    monkeypatch.setattr(shapes_vqa, "ask_about_scene", lambda *a: asked.append(a) or ask_about_scene(*a))
    stamp = train[0].path.stat().st_mtime_ns
    assert generate_shapes_vqa(root, num_train=6, num_val=3, image_size=32, seed=2, questions_per_image=4) == files
    assert asked == [] and train[0].path.stat().st_mtime_ns == stamp  # reused, not rebuilt
    generate_shapes_vqa(root, num_train=6, num_val=3, image_size=32, seed=2, questions_per_image=2)
    assert len(asked) == 9 and len(read_vqa(*files["val"])) == 3 * 2  # other parameters: rebuilt


def test_generate_is_deterministic_and_refuses_foreign_directories(tmp_path: Path) -> None:
    first = generate_shapes_vqa(tmp_path / "a", num_train=3, num_val=1, image_size=32, seed=5)
    second = generate_shapes_vqa(tmp_path / "b", num_train=3, num_val=1, image_size=32, seed=5)
    for split in ("train", "val"):
        for path_a, path_b in zip(first[split], second[split]):
            if path_a.is_file():
                assert path_a.read_bytes() == path_b.read_bytes()
        assert [p.read_bytes() for p in sorted(first[split][2].iterdir())] == [
            p.read_bytes() for p in sorted(second[split][2].iterdir())
        ]

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="mine"):
        generate_shapes_vqa(foreign, num_train=1, num_val=1, image_size=32)
    assert (foreign / "thesis.tex").read_text() == "precious"
    for bad in (dict(num_train=-1), dict(image_size=16), dict(questions_per_image=0), dict(questions_per_image=11)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            generate_shapes_vqa(tmp_path / "x", **{"num_train": 1, "num_val": 1, **bad})
