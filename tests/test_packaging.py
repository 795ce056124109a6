"""The wheel a user installs carries everything mmtx reads at run time: every module and the
Hydra configs of the top-level conf/, as mmtx/conf."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_every_config(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = tmp_path.glob("mmtx-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {name for name in names if name.endswith(".yaml")}
    expected = {f"mmtx/{p.relative_to(ROOT)}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert "mmtx/conf/train.yaml" in expected and shipped == expected
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "mmtx").rglob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))  # no subpackage left out of pyproject's list
