"""The wheel a user installs carries everything mmtx reads at run time: every module and the
Hydra configs of the top-level conf/, as mmtx/conf."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_every_config(tmp_path: Path) -> None:
    # built from a copy of the source files only: setuptools never cleans a checkout's build/, so a
    # wheel built in place can carry modules deleted since
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    source = tmp_path / "source"
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = tmp_path.glob("mmtx-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {name for name in names if name.endswith(".yaml")}
    expected = {f"mmtx/{p.relative_to(ROOT)}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert "mmtx/conf/train.yaml" in expected and shipped == expected
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "mmtx").rglob("*.py")}
    # every module (no subpackage left out of pyproject's list), and nothing else
    assert {name for name in names if name.endswith(".py")} == modules
