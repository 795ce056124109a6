"""The README's recipes run as written: its commands are read from README.md, not copied here.

"Your own data" is what a newcomer follows first; its shell block and its Python example run on a
handful of photos in a fresh directory, with only a tiny model and a few steps added to
``mmtx-train`` so that the test is quick. The README stays a five-minute read in the reader's
order, and what it says a plain run draws and where it writes is what the configs do. Every
other command of the README and docs/ is dry-run by tests/test_docs.py.
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
from tests.helpers import compose_train, load_script

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"


def section(title: str, page: Path = README) -> str:
    """The text of ``page``'s section headed ``title`` (any level), up to the next heading of its
    level or above (outside code blocks): README.md by default, or a page of docs/."""
    lines, start, level, fenced = page.read_text().split("\n"), None, 0, False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.*)", line)
        if heading and start is None and heading.group(2) == title:
            start, level = i, len(heading.group(1))
        elif heading and start is not None and len(heading.group(1)) <= level:
            return "\n".join(lines[start:i])
    assert start is not None, f"{page.name} has no section {title!r}"
    return "\n".join(lines[start:])


# the sections a newcomer reads, in this order (others may sit between them)
READERS_ORDER = [
    "Install", "Quick start", "Python API", "Captioning", "Two-stream pretraining", "Visual question answering",
    "Your own data", "Configuration", "Scaling and faults", "Pretrained weights and export", "Layout", "Documentation",
]  # fmt: skip


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


def test_readme_is_a_five_minute_read_in_the_readers_order() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 350, "README.md over 350 lines: move the detail to a page of docs/"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert [h for h in headings if h in READERS_ORDER] == READERS_ORDER, headings
    commands = shell_commands(code_blocks(section("Quick start"), "bash")[0])
    assert [c[0] for c in commands] == ["mmtx-train", "mmtx-eval", "mmtx-caption"]  # train, evaluate, caption


def test_the_readme_says_what_a_plain_run_draws_and_where_it_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick start's data set, data folder and run directory are those of conf/ (shapes size,
    ``paths.data_dir``, ``hydra.run.dir``), and its figures' image counts those of
    scripts/learning_curves.py."""
    from omegaconf import OmegaConf

    text = section("Quick start")
    cfg = OmegaConf.to_container(compose_train([]), resolve=False)  # as written, interpolations unresolved
    data, choices = cfg["data"], cfg["hydra"]["runtime"]["choices"]
    assert (
        f"draws {data['num_train']} training and {data['num_val']} validation shapes scenes ({data['image_size']} px"
        in text
    )
    assert data["root"] == "${paths.data_dir}/shapes-${.image_size}px-${.num_train}-${.num_val}-seed${.seed}"
    assert cfg["paths"]["data_dir"] == "${oc.env:MMTX_DATA_DIR,${hydra:runtime.cwd}/data}"
    assert f"`data/shapes-{data['image_size']}px-{data['num_train']}-{data['num_val']}-seed{data['seed']}/`" in text
    assert cfg["hydra"]["run"]["dir"] == "outputs/${run_name}/${now:%Y-%m-%d_%H-%M-%S}"
    assert cfg["run_name"] == "${hydra:runtime.choices.task}-${hydra:runtime.choices.data}"
    assert f"`outputs/{choices['task']}-{choices['data']}/DATE_TIME/`" in text
    assert "`outputs/<task>-<data>/<YYYY-MM-DD_HH-MM-SS>/`" in text
    budget = re.search(r"'(\d\d:\d\d:\d\d:\d\d)'", cfg["trainer"]["max_time"]).group(1)
    assert f"`trainer.max_time={budget}`" in README.read_text()

    curves = load_script("learning_curves")
    monkeypatch.setattr(sys, "argv", ["learning_curves.py"])
    args = curves.parse_args()
    assert f"**{args.num_train} training / {args.num_val} validation images**" in text
    assert f"a plain `mmtx-train` draws {data['num_train']} / {data['num_val']}" in text
