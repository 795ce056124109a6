"""Shared fixtures: a hermetic environment for the command-line apps, tiny run settings, and one
tiny captioner trained for the tests of what a run writes and of the inference commands."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.helpers import Run

# A captioner of ~40k parameters on 32-px shapes scenes: trains in seconds on a CPU.
TINY_MODEL = [
    "model.encoder.dim=32", "model.encoder.depth=1", "model.encoder.num_heads=2",
    "model.encoder.patch_size=8",
    "model.decoder.dim=32", "model.decoder.depth=1", "model.decoder.num_heads=2",
]  # fmt: skip
TINY_DATA = ["data.image_size=32", "data.num_train=64", "data.num_val=20", "data.num_workers=0"]


@pytest.fixture(scope="session", autouse=True)
def _hermetic_env(tmp_path_factory: pytest.TempPathFactory):
    """W&B offline and silent, its caches and the default data directory in a temporary folder.

    Set in ``os.environ`` so that in-process runs and the command-line apps started as
    subprocesses (which inherit it) see the same settings; restored after the session.
    """
    home = tmp_path_factory.mktemp("env")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(var, str(home / var.lower()))
        mp.setenv("MMTX_DATA_DIR", str(home / "data"))  # where paths.data_dir points unless overridden
        mp.delenv("WANDB_API_KEY", raising=False)
        mp.delenv("HYDRA_FULL_ERROR", raising=False)  # error messages as users see them
        yield


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for generated data sets: the tiny shapes scenes are drawn once per session."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def tiny(data_dir: Path) -> list[str]:
    """Overrides for a tiny, fast ``mmtx-train`` run whose data lives under ``data_dir``."""
    # fp32 and two epochs, as the tests' reference numbers were made, whatever the CPU's bf16 and
    # the CPU preset's time budget
    return [
        *TINY_MODEL,
        *TINY_DATA,
        f"paths.data_dir={data_dir}",
        "data.batch_size=32",  # several steps an epoch on the tiny data, whatever batch a task's recipe has
        "trainer.enable_progress_bar=false",
        "trainer.precision=32-true",
        "trainer.max_epochs=2",
    ]


class CLI:
    """Runs the installed console scripts (``mmtx-train`` ...) as a user would, in a subprocess."""

    @staticmethod
    def script(name: str) -> str:
        """The console script ``name`` of the running interpreter's environment."""
        sibling = Path(sys.executable).with_name(name)
        found = str(sibling) if sibling.is_file() else shutil.which(name)
        if found is None:
            pytest.fail(f"console script {name} is not installed (pip install -e .)")
        return found

    @staticmethod
    def describe(result: subprocess.CompletedProcess) -> str:
        """The command and the end of its output, for assertion messages."""
        return (
            f"$ {' '.join(map(str, result.args))}\nexit code {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
        )

    def run(self, name: str, *args: object, cwd: Path, check: bool = True, timeout: float = 300):
        """Run ``name args`` in ``cwd``; with ``check``, fail (showing the output) unless it exits 0."""
        return self.run_many((name, *args), cwd=cwd, check=check, timeout=timeout)[0]

    def run_many(self, *commands: tuple, cwd: Path, check: bool = True, timeout: float = 300):
        """Run several ``(name, *args)`` commands at once (mostly start-up and Java time); results in order."""
        # each its own rendezvous port below the ephemeral range (a data-parallel run listens on
        # one): Lightning's own choice is an ephemeral port, which another test's connections can
        # take before the run listens on it, and two runs started at once could pick the same one
        ports = free_ports(len(commands)) if "MASTER_PORT" not in os.environ else []
        procs = [
            subprocess.Popen(
                [self.script(name), *map(str, args)],
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **({"MASTER_PORT": str(ports[i])} if ports else {})},
                start_new_session=True,  # a hang is killed with the processes it started
            )
            for i, (name, *args) in enumerate(commands)
        ]
        results = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:  # a hang fails as one, never as an exit code a test expects
                for other in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(other.pid, signal.SIGKILL)
                out, err = proc.communicate()
                hung = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
                pytest.fail(f"timed out after {timeout:.0f} s (killed)\n{self.describe(hung)}")
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        if check:
            for result in results:
                assert result.returncode == 0, self.describe(result)
        return results


def free_ports(n: int) -> list[int]:
    """``n`` different TCP ports free on this machine now, below the ephemeral range: a port the
    system hands out for connections (what binding port 0 returns, and Lightning's own choice)
    can be taken by another run's connections in the seconds before the run listens on it."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.is_file() else 32768
    ports: list[int] = []
    for port in random.Random().sample(range(20000, low), k=min(200, low - 20000)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free ports between 20000 and {low}")


@pytest.fixture(scope="session")
def cli() -> CLI:
    return CLI()


@pytest.fixture()
def repo_on_path(monkeypatch):
    """Subprocesses can import ``tests.helpers`` (for the test-only fault callbacks)."""
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))


# Every mmtx-train run costs seconds of Java for the official metrics (validation, baseline): the
# command-line tests share one trained captioner. Imports inside: this file stays free of torch.


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny: list[str]) -> Run:
    """One tiny captioner trained in-process through the compose API (CSV logs), shared by the tests."""
    from tests.helpers import TRAIN, Run, train_in_process

    out = tmp_path_factory.mktemp("trained")
    metrics = train_in_process([*tiny, *TRAIN, "logger=csv", "trainer.max_epochs=1", f"paths.output_dir={out}"])
    return Run(out, metrics)


@pytest.fixture(scope="session")
def val_records(trained: Run):
    """The shapes val split the shared run was validated on (from the checkpoint's data config)."""
    from mmtx.checkpoint import DATA_KEY, read_checkpoint
    from mmtx.data.captions import read_coco_captions

    root = Path(read_checkpoint(trained.last)[DATA_KEY]["root"])
    return read_coco_captions(root / "captions_val.json", root / "val")
