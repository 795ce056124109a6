"""scripts/vqa_families.py: every shapes question lands in the family that generated it, and each
family is scored with the official accuracy."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from mmtx.data.synthetic.shapes import draw_scene
from mmtx.data.synthetic.shapes_vqa import _candidates, generate_shapes_vqa
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vqa_families.py"


def test_every_generated_question_is_named_by_its_own_family() -> None:
    family = load_script("vqa_families").family
    seen = set()
    for index in range(200):
        _, _, scene = draw_scene(random.Random(f"families/{index}"), 64, num_captions=1)
        for candidate in _candidates(scene):
            assert family(candidate.question) == candidate.family, candidate
            seen.add(candidate.family)
    assert len(seen) == 14  # every family of the generator was drawn and recognised


def test_scores_each_family_with_the_official_accuracy(tmp_path: Path) -> None:
    files = generate_shapes_vqa(tmp_path / "vqa", num_train=0, num_val=12, image_size=32, seed=0)
    questions_file, annotations_file, _ = files["val"]
    questions = json.loads(questions_file.read_text())["questions"]
    annotations = {a["question_id"]: a for a in json.loads(annotations_file.read_text())["annotations"]}
    family = load_script("vqa_families").family
    # right on every counting question, "purple" (wrong) on every other one
    predictions = [
        {
            "question_id": q["question_id"],
            "answer": annotations[q["question_id"]]["multiple_choice_answer"]
            if q["question"].startswith("how many")
            else "purple",
        }
        for q in questions
    ]
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(predictions))
    out = tmp_path / "families.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "vqa"), str(path), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads(out.read_text())[str(path)]
    assert sum(n for n, _ in table.values()) == len(questions)
    for name, (_n, accuracy) in table.items():
        if name.startswith("count"):
            assert accuracy == 100.0, name
        elif not name.startswith(("color of", "what is")):  # purple can be right there
            assert accuracy == 0.0, name
    assert "unknown" not in table and any(family(q["question"]).startswith("count") for q in questions)
