"""The README's recipes run as written: its commands are read from README.md, not copied here.

"Your own data" is what a newcomer follows first; its shell block and its Python example run on a
handful of photos in a fresh directory, with only a tiny model and a few steps added to
``mmtx-train`` so that the test is quick.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from tests.conftest import TINY_MODEL

README = Path(__file__).resolve().parents[1] / "README.md"


def section(title: str) -> str:
    """The text of README's ``## title`` section, up to the next ``## ``."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.split("#", 1)[0].strip()]


def write_photos(root: Path) -> None:
    """Six small 'photos' and COCO-format captions for train (5 images, 10 captions) and val (2)."""
    images = root / "mydata" / "images"
    (images / "sub").mkdir(parents=True)
    scenes = {  # file: (background, shape colour, words)
        "beach.jpg": ("khaki", "blue", "a blue ball on the sand"),
        "sub/dog.png": ("green", "brown", "a brown dog on the grass"),
        "c.jpg": ("white", "red", "a red box on a white table"),
        "d.jpg": ("black", "yellow", "a yellow moon in the night"),
        "e.png": ("gray", "purple", "a purple cup on a gray floor"),
        "f.jpg": ("navy", "orange", "an orange fish in the sea"),
    }
    ids = {name: i + 1 for i, name in enumerate(scenes)}
    for name, (background, colour, _) in scenes.items():
        image = Image.new("RGB", (96, 72), background)
        ImageDraw.Draw(image).ellipse((20, 14, 70, 60), fill=colour)
        image.save(images / name)

    def split(names: list[str]) -> dict:
        return {
            "images": [{"id": ids[n], "file_name": n} for n in names],
            "annotations": [{"image_id": ids[n], "caption": c}
                            for n in names for c in (scenes[n][2], f"{scenes[n][2]} today")],
        }  # fmt: skip

    (root / "mydata" / "train.json").write_text(json.dumps(split(["sub/dog.png", "c.jpg", "d.jpg", "e.png", "f.jpg"])))
    (root / "mydata" / "val.json").write_text(json.dumps(split(["beach.jpg", "sub/dog.png"])))


@pytest.mark.slow
def test_your_own_data_recipe_runs_as_written(cli, tmp_path: Path) -> None:
    """Train, evaluate, caption, export and caption from the export, then the Python example."""
    write_photos(tmp_path)
    text = section("Your own data")
    shell = code_blocks(text, "bash")[0]  # the recipe; the next block shows data=pairs (tests/test_pairs.py)
    (python,) = code_blocks(text, "python")
    commands = shell_commands(shell)
    assert [c[0] for c in commands] == ["mmtx-train", "mmtx-eval", "mmtx-caption", "mmtx-export", "mmtx-caption"]

    outputs = []
    for name, *args in commands:
        if name == "mmtx-train":  # the recipe's run, small and short
            args += [*TINY_MODEL, "trainer.max_steps=3", "trainer.enable_progress_bar=false"]
        outputs.append(cli.run(name, *args, cwd=tmp_path).stdout)

    assert (tmp_path / "runs" / "mine" / "checkpoints" / "last.ckpt").is_file()
    assert "CIDEr" in outputs[1]
    captions = [line for line in outputs[2].splitlines() if line.startswith("mydata/images/beach.jpg\t")]
    assert len(captions) == 1 and captions[0].split("\t")[1].strip(), outputs[2]
    assert outputs[4] == outputs[2]  # "the same captions, from the export"

    example = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert example.returncode == 0, example.stderr
    assert example.stdout.strip() == captions[0].split("\t")[1].strip()
