"""The wheel a user installs carries everything mmtx reads at run time: its Hydra configs."""

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
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".yaml")}
    expected = {str(p.relative_to(ROOT)) for p in (ROOT / "mmtx" / "conf").rglob("*.yaml")}
    assert "mmtx/conf/train.yaml" in expected and shipped == expected
