"""scripts/heldout_scenes.py: its references are entirely true, mirrored relations and wrong colours
are caught, the files carry the official keys, bad predictions are refused in one line, and a
seed draws the same files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "heldout_scenes.py"
MIRROR = {"left": "right", "right": "left", "above": "below", "below": "above", "over": "under", "under": "over"}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scenes")
    done = _run("draw", str(out), "--seed", "3", "--train", "12", "--val", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "train 12 images" in done.stdout and "val 8 images" in done.stdout
    return out


def _captions(out: Path, split: str = "val") -> list[dict]:
    return json.loads((out / f"captions_{split}.json").read_text())["annotations"]


def _score(out: Path, predictions: list[dict], tmp_path: Path) -> dict:
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(predictions))
    done = _run("score", str(out), str(path))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_references_are_entirely_true(drawn: Path) -> None:
    done = _run("score", str(drawn), "--references")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["captions_scored"] == 8 and result["missing"] == 0
    assert result["entirely_true"] == 1.0
    assert result["relations_stated"] > 0 and result["relations_right"] == 1.0

    module = load_script("heldout_scenes")
    for split in ("train", "val"):
        scenes = module.load_scenes(drawn, split)
        for entry in _captions(drawn, split):  # every reference, not only the first
            assert module.judge(entry["caption"], scenes[entry["image_id"]])["true"], entry


def test_mirrored_relations_are_all_wrong(drawn: Path, tmp_path: Path) -> None:
    mirrored = [
        {"image_id": entry["image_id"], "caption": re.sub(r"\w+", lambda m: MIRROR.get(m[0], m[0]), entry["caption"])}
        for entry in _captions(drawn)
    ]
    result = _score(drawn, mirrored, tmp_path)  # the first caption of each image is scored
    assert result["relations_stated"] > 0 and result["relations_right"] == 0.0
    for counts in result["relations"].values():
        assert counts["right"] == 0
    assert result["duplicates"] == 4 * 8


def test_a_wrong_colour_makes_a_caption_untrue(drawn: Path, tmp_path: Path) -> None:
    module = load_script("heldout_scenes")
    scenes = module.load_scenes(drawn, "val")
    entry = _captions(drawn)[0]
    shapes = scenes[entry["image_id"]]
    absent = next(colour for colour in module.COLOURS if all(s.colour != colour for s in shapes))
    said = next(word for word in entry["caption"].split() if word in module.COLOURS)
    wrong = re.sub(rf"\b{said}\b", absent, entry["caption"], count=1)
    assert not module.judge(wrong, shapes)["true"]
    assert module.judge(entry["caption"], shapes)["true"]

    result = _score(drawn, [{"image_id": entry["image_id"], "caption": wrong}], tmp_path)
    assert result["entirely_true"] == 0.0 and result["captions_scored"] == 1 and result["missing"] == 7
    assert result["relations_stated"] == 0  # a shape it cannot find states no relation
    assert result["not_true_first"] == {"size or colour": 1}
    assert result["kind_first_wrong_by_size"] == {"small": 0, "large": 0, "either": 0}


def test_what_a_caption_gets_wrong_first() -> None:
    module = load_script("heldout_scenes")
    circle = module.Shape("circle", "red", "small", 0, 0, (0.0, 0.0, 5.0, 5.0))
    square = module.Shape("square", "blue", "large", 1, 2, (0.0, 0.0, 5.0, 5.0))
    for caption, why, size in (
        ("a small red star to the left of a large blue square", "kind", "small"),
        ("a small red circle to the left of a large blue star", "kind", "large"),
        ("a red star to the left of a large blue square", "kind", "small"),
        ("a large red circle to the left of a large blue square", "size or colour", None),
        ("a small red circle to the right of a large blue square", "relation or place", None),
        ("a small red circle in the bottom right corner", "relation or place", None),
        ("red red red", "unparsed", None),
    ):
        verdict = module.judge(caption, [circle, square])
        assert not verdict["true"] and (verdict["wrong"], verdict["wrong_size"]) == (why, size), caption
    red_square = module.Shape("square", "red", "large", 2, 2, (0.0, 0.0, 5.0, 5.0))
    assert module.judge("a red star in the middle", [circle, red_square])["wrong_size"] == "either"  # no size said
    result = module.score({1: [circle, square]}, [(1, "a small red star to the left of a large blue square")])
    assert result["not_true_first"] == {"kind": 1}
    assert result["kind_first_wrong_by_size"] == {"small": 1, "large": 0, "either": 0}
    assert module.judge("a small red circle to the left of a large blue square", [circle, square])["wrong"] is None


def test_sentences_outside_the_grammar_are_not_true() -> None:
    module = load_script("heldout_scenes")
    shape = module.Shape("circle", "red", "small", 0, 0, (0.0, 0.0, 5.0, 5.0))
    other = module.Shape("square", "blue", "large", 1, 2, (0.0, 0.0, 5.0, 5.0))
    assert module.judge("A small red circle to the left of a large blue square.", [shape, other])["true"]
    assert module.judge("the big blue square is right of the little red circle", [shape, other])["true"]
    assert not module.judge("the small red circle is below the large blue square", [shape, other])["true"]
    assert module.judge("there's a small red circle in the top left corner", [shape])["true"]
    assert not module.judge("a small red circle in the middle", [shape])["true"]
    assert not module.judge("a small red circle and a blue square", [shape, other])["parsed"]
    assert not module.judge("", [shape])["true"]


def test_files_carry_the_official_keys(drawn: Path) -> None:
    for split, count in (("train", 12), ("val", 8)):
        captions = json.loads((drawn / f"captions_{split}.json").read_text())
        assert len(captions["images"]) == count
        assert all(set(image) == {"id", "file_name", "width", "height"} for image in captions["images"])
        assert all((drawn / split / image["file_name"]).is_file() for image in captions["images"])
        assert len(captions["annotations"]) == 5 * count
        assert all(set(a) == {"id", "image_id", "caption"} for a in captions["annotations"])

        questions = json.loads((drawn / f"questions_{split}.json").read_text())["questions"]
        assert all(set(q) == {"image_id", "question", "question_id"} for q in questions)
        per_image = [sum(q["image_id"] == image["id"] for q in questions) for image in captions["images"]]
        assert all(3 <= n <= 5 for n in per_image)
        annotations = json.loads((drawn / f"annotations_{split}.json").read_text())["annotations"]
        assert [a["question_id"] for a in annotations] == [q["question_id"] for q in questions]
        keys = {"question_id", "image_id", "question_type", "answer_type", "multiple_choice_answer", "answers"}
        for annotation in annotations:
            assert set(annotation) == keys and len(annotation["answers"]) == 10
            assert {a["answer"] for a in annotation["answers"]} == {annotation["multiple_choice_answer"]}
            assert [a["answer_id"] for a in annotation["answers"]] == list(range(1, 11))
            assert all(a["answer_confidence"] == "yes" for a in annotation["answers"])

        scenes = json.loads((drawn / f"scenes_{split}.json").read_text())["images"]
        for scene in scenes:
            assert 1 <= len(scene["shapes"]) <= 3
            assert len({(s["row"], s["column"]) for s in scene["shapes"]}) == len(scene["shapes"])
            for shape in scene["shapes"]:
                assert set(shape) == {"kind", "colour", "size", "row", "column", "box"}


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"image_id": 1, "caption": "x"}', b'[{"image_id": "1", "caption": "x"}]', b'[{"image_id": 1}]',
     b"[" * 100_000, b"\xff\xfe"],
)  # fmt: skip
def test_bad_predictions_are_refused_in_one_line(drawn: Path, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad predictions.json"
    path.write_bytes(content)
    done = _run("score", str(drawn), str(path))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and str(path) in done.stderr


@pytest.mark.parametrize(
    "content",
    ['{"images": []}', '{"annotations": []}', '{"annotations": [{"image_id": 1}]}', '[1]',
     '{"annotations": [{"image_id": "1", "caption": "x"}]}', '{"annotations": [{"image_id": true, "caption": "x"}]}',
     "[" * 100_000],
)  # fmt: skip
def test_a_malformed_references_file_is_refused_in_one_line(drawn: Path, tmp_path: Path, content: str) -> None:
    out = tmp_path / "copy"
    out.mkdir()
    (out / "scenes_val.json").write_bytes((drawn / "scenes_val.json").read_bytes())
    (out / "captions_val.json").write_text(content)
    done = _run("score", str(out), "--references")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "captions_val.json" in done.stderr


def test_the_first_bad_entry_of_either_file_is_named(drawn: Path, tmp_path: Path) -> None:
    good, bad = {"image_id": 1, "caption": "x"}, {"image_id": True, "caption": "y"}
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps([good, good, bad]))
    done = _run("score", str(drawn), str(predictions))
    assert "entry 2 is not an object with an int image_id and a str caption" in done.stderr
    out = tmp_path / "copy"
    out.mkdir()
    (out / "scenes_val.json").write_bytes((drawn / "scenes_val.json").read_bytes())
    (out / "captions_val.json").write_text(json.dumps({"annotations": [good, bad]}))
    done = _run("score", str(out), "--references")
    assert "annotation 1 is not an object with an int image_id and a str caption" in done.stderr


def test_a_scene_of_shapes_draw_does_not_draw_is_refused_in_one_line(drawn: Path, tmp_path: Path) -> None:
    scenes = json.loads((drawn / "scenes_val.json").read_text())
    scenes["images"][0]["shapes"][0]["size"] = "huge"
    out = tmp_path / "copy"
    out.mkdir()
    (out / "scenes_val.json").write_text(json.dumps(scenes))
    done = _run("score", str(out), "--references")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "scenes_val.json" in done.stderr and "huge" in done.stderr


def test_a_negative_seed_is_refused_in_one_line(tmp_path: Path) -> None:
    done = _run("draw", str(tmp_path / "out"), "--seed", "-1", "--train", "1", "--val", "1")
    assert done.returncode != 0 and done.stderr.strip() == "--seed -1: give a seed of 0 or more"
    assert not (tmp_path / "out").exists()


def test_an_oversized_predictions_file_is_refused(drawn: Path, tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as file:
        file.truncate(50 * 1024 * 1024 + 1)
    with pytest.raises(SystemExit, match="huge.json"):
        load_script("heldout_scenes").load_predictions(path)


def test_the_same_seed_draws_the_same_files(drawn: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert _run("draw", str(again), "--seed", "3", "--train", "12", "--val", "8").returncode == 0
    files = sorted(p.relative_to(drawn) for p in drawn.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((drawn / f).read_bytes() == (again / f).read_bytes() for f in files)

    other = tmp_path / "other"
    assert _run("draw", str(other), "--seed", "4", "--train", "12", "--val", "8").returncode == 0
    assert (other / "captions_val.json").read_bytes() != (drawn / "captions_val.json").read_bytes()
