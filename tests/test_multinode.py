"""Several nodes, on one machine (gloo, CPU): docs/many-gpus.md's torchrun command run as two one-process
"nodes", and scripts/slurm/train.sbatch run with a stand-in ``srun`` that starts its tasks with
SLURM's variables, as Lightning reads them on a cluster."""

from __future__ import annotations

import csv
import os
import random
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from mmtx.checkpoint import read_checkpoint
from tests.conftest import free_ports
from tests.helpers import logged
from tests.test_readme import DOCS, code_blocks, section

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
STEPS = 6
# as in tests/test_distributed.py: the same math on every launcher (dropout masks are drawn per
# process), no time budget in the LR schedule; no validation
# (most of a tiny run's time, and tests/test_distributed.py's subject)
SAME_RUN = [
    "logger=csv", "trainer.log_every_n_steps=1", f"trainer.max_steps={STEPS}", "trainer.limit_val_batches=0",
    "trainer.max_time=null", "data.batch_size=8", "data.crop_scale=[0.5,1.0]", "model.decoder.dropout=0",
]  # fmt: skip
STOPPED_AT = 3  # a notice to one process at the end of step 2: both finish step 3, then save


def notice_at_step_2(name: str) -> list[str]:
    """Overrides by which the second process sends itself signal ``name`` at the end of step 2."""
    return ["+callbacks.fault._target_=tests.helpers.SignalAtStep", "+callbacks.fault.step=2",
            f"+callbacks.fault.signal={name}", "+callbacks.fault.rank=1"]  # fmt: skip


LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
                 "MASTER_PORT")  # fmt: skip


@pytest.fixture()
def launcher_free_env(monkeypatch):
    """No rank or address variables from whatever started pytest (a SLURM job, torchrun); the
    repository importable by the subprocesses (for the test-only callbacks)."""
    for var in list(os.environ):
        if var.startswith(("SLURM_", "TORCHELASTIC_")) or var in LAUNCHER_VARS:
            monkeypatch.delenv(var)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def free_port(low: int = 20000, high: int = 60000) -> int:
    """A TCP port nothing listens on now, between ``low`` and ``high``."""
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


def readme_torchrun(cli, node_rank: int, port: int, run_dir: Path) -> list[str]:
    """docs/many-gpus.md's torchrun command, for node ``node_rank`` of 2 nodes of one process on 127.0.0.1."""
    text = section("Many GPUs, many nodes, and runs that survive faults", DOCS / "many-gpus.md")
    (block,) = [b for b in code_blocks(text, "bash") if "torchrun" in b]
    words = block.replace("\\\n", " ").replace("$(which mmtx-train)", cli.script("mmtx-train")).split()
    fill = {
        "--nnodes=N": "--nnodes=2", "--nproc-per-node=8": "--nproc-per-node=1",
        "--node-rank=R": f"--node-rank={node_rank}", "--rdzv-endpoint=HOST:29500": f"--rdzv-endpoint=127.0.0.1:{port}",
        "trainer.devices=8": "trainer.devices=1", "trainer.num_nodes=N": "trainer.num_nodes=2",
        "hydra.run.dir=RUN": f"hydra.run.dir={run_dir}",
    }  # fmt: skip
    assert set(fill) <= set(words), f"docs/many-gpus.md's torchrun command changed: {block}"
    return [fill.get(w, w) for w in words]


def csv_losses(run_dir: Path, version: int) -> list[tuple[int, float]]:
    """(step, train/loss) of one CSVLogger version of a run (a resumed run writes the next version)."""
    with (run_dir / "csv" / f"version_{version}" / "metrics.csv").open() as f:
        return logged(list(csv.DictReader(f)), "train/loss")


def members(*results: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """Lightning's ``MEMBER: i/n`` line of each process, sorted."""
    return sorted(m for r in results for m in re.findall(r"MEMBER: (\d+)/(\d+)", r.stdout + r.stderr))


@pytest.fixture()
def torchrun_runs(cli, tiny: list[str], tmp_path: Path, launcher_free_env) -> dict:
    """One machine with 2 processes (Lightning's own launcher); then 2 torchrun nodes of one
    process, stopped by SIGTERM after step 3 and resumed from last.ckpt, again on 2 nodes."""
    common = [*tiny, *SAME_RUN]
    # first, alone: it draws the data set the nodes then read
    cli.run("mmtx-train", *common, "trainer=ddp_cpu", "trainer.devices=2", f"hydra.run.dir={tmp_path / 'one'}",
            cwd=tmp_path)  # fmt: skip
    run = tmp_path / "nodes"

    def nodes(*extra: str) -> list[subprocess.CompletedProcess]:
        port = free_ports(1)[0]
        commands = [(*readme_torchrun(cli, r, port, run), "trainer.accelerator=cpu", *common, *extra) for r in (0, 1)]
        return cli.run_many(*commands, cwd=tmp_path, check=False)  # both nodes at once

    stopped = nodes(*notice_at_step_2("SIGTERM"))
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    stopped_step = read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]
    resumed = nodes(f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    return {"one": tmp_path / "one", "nodes": run, "stopped": stopped, "saved": saved, "stopped_step": stopped_step,
            "resumed": resumed}  # fmt: skip


@pytest.mark.slow
def test_two_torchrun_nodes_stop_on_sigterm_resume_and_follow_one_machine(cli, torchrun_runs: dict) -> None:
    """docs/many-gpus.md's torchrun command on 2 nodes: SIGTERM to one node's process stops both after
    the step in flight with one last.ckpt; resumed on 2 nodes, the run trains the remaining steps
    only, and the losses and final weights are those of one machine with 2 processes."""
    stopped, resumed = torchrun_runs["stopped"], torchrun_runs["resumed"]
    assert members(*stopped) == members(*resumed) == [("1", "2"), ("2", "2")], members(*stopped)
    for node in stopped:
        # each node's process exits as a preempted one; torchrun itself exits 1 for any failed worker
        worker_status = re.findall(r"exitcode\s*:\s*(\d+)", node.stderr)
        assert node.returncode != 0 and set(worker_status) == {str(128 + signal.SIGTERM)}, cli.describe(node)
        assert f"stopped by SIGTERM at step {STOPPED_AT}; saved" in node.stderr, cli.describe(node)
    assert torchrun_runs["saved"] == ["last.ckpt"] and torchrun_runs["stopped_step"] == STOPPED_AT
    for node in resumed:
        assert node.returncode == 0, cli.describe(node)

    run, one = torchrun_runs["nodes"], torchrun_runs["one"]
    before, after = csv_losses(run, 0), csv_losses(run, 1)
    assert after[0][0] == STOPPED_AT and [s for s, _ in after] == list(range(STOPPED_AT, STEPS)), after
    # the stopped run's last step may be missing from its log (the stop comes before Lightning logs it)
    assert [s for s, _ in before] in (list(range(STOPPED_AT)), list(range(STOPPED_AT - 1))), before
    reference = dict(csv_losses(one, 0))
    assert sorted(reference) == list(range(STEPS))
    steps = [s for s, _ in before + after]
    losses = torch.tensor([[reference[s] for s in steps], [v for _, v in before + after]])
    assert torch.allclose(losses[0], losses[1], rtol=1e-4, atol=1e-5), losses

    # two writers of tokenizer.json (one per node) in one directory: one whole file, no leftovers
    assert (run / "tokenizer.json").read_text() == (one / "tokenizer.json").read_text()
    assert not list(run.glob(".tokenizer-*"))
    a, b = (read_checkpoint(d / "checkpoints" / "last.ckpt") for d in (one, run))
    assert a["global_step"] == b["global_step"] == STEPS
    for name, w in a["state_dict"].items():
        assert torch.allclose(w, b["state_dict"][name], rtol=1e-4, atol=1e-5), name


FAKE_SRUN = """#!/bin/bash
# Stand-in for srun inside a job: one process per task, with the variables srun gives each task;
# exits with the highest exit status, as srun does.
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$((i % SLURM_NTASKS_PER_NODE)) SLURM_NODEID=$((i / SLURM_NTASKS_PER_NODE)) "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid"; s=$?; ((s > status)) && status=$s
done
exit $status
"""


def sbatch(cli, submit_dir: Path, *args: str, job: dict[str, str]) -> subprocess.CompletedProcess:
    """``scripts/slurm/train.sbatch args`` as SLURM starts it: in the submit directory, with the
    job's variables ``job``, stand-ins for ``srun`` and ``scontrol`` (which appends its arguments
    to scontrol.txt) first on PATH, then the environment's mmtx-train."""
    tools = submit_dir / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "srun").write_text(FAKE_SRUN)
    (tools / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {submit_dir / "scontrol.txt"}\n')
    for tool in ("srun", "scontrol"):
        (tools / tool).chmod(0o755)
    path = os.pathsep.join([str(tools), str(Path(cli.script("mmtx-train")).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "SLURM_JOB_NAME": "mmtx", "SLURM_SUBMIT_DIR": str(submit_dir), **job}
    script = subprocess.Popen(["bash", str(SBATCH), *args], cwd=submit_dir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = script.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)  # the script and the tasks it started
        out, err = script.communicate()
        pytest.fail(f"train.sbatch timed out after 300 s (killed)\n{out[-4000:]}\n{err[-4000:]}")
    return subprocess.CompletedProcess(script.args, script.returncode, out, err)


def slurm_job(nodes: int, tasks_per_node: int, job_id: str) -> dict[str, str]:
    """The variables of a job of ``nodes`` x ``tasks_per_node`` tasks on this machine."""
    return {
        "SLURM_JOB_ID": job_id, "SLURM_NNODES": str(nodes), "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_NTASKS": str(nodes * tasks_per_node), "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NODELIST": "127.0.0.1",
    }  # fmt: skip


def test_the_sbatch_srun_line_is_an_mmtx_train_command_that_resumes(cli, tmp_path: Path, launcher_free_env) -> None:
    """The script's srun line, the SLURM variables filled in, is a valid mmtx-train command: DDP
    with one process per task on every node, one run directory, and ``ckpt_path`` to its last.ckpt
    when the job starts again."""
    last = tmp_path / "runs" / "mmtx-4321" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.touch()  # as a requeued job finds it (--cfg: only composed, never read)
    job = {**slurm_job(nodes=2, tasks_per_node=8, job_id="4321"), "SLURM_NTASKS": "1"}  # one task prints the config
    result = sbatch(cli, tmp_path, "--cfg", "all", job=job)
    assert result.returncode == 0, cli.describe(result)
    cfg = yaml.safe_load(result.stdout)
    assert cfg["trainer"]["strategy"] == "ddp" and cfg["trainer"]["accelerator"] == "gpu"
    assert (cfg["trainer"]["devices"], cfg["trainer"]["num_nodes"]) == (8, 2)
    assert cfg["hydra"]["run"]["dir"] == "runs/mmtx-4321"
    assert cfg["ckpt_path"] == "runs/mmtx-4321/checkpoints/last.ckpt"
    assert not (tmp_path / "scontrol.txt").exists()


@pytest.mark.slow
def test_the_sbatch_job_trains_on_two_nodes_saves_and_requeues(
    cli, tiny: list[str], tmp_path: Path, launcher_free_env
) -> None:
    """The script as SLURM runs it on 2 nodes of one task (srun's variables, Lightning's
    SLURMEnvironment): the run trains on 2 processes; SIGUSR1 (the time-limit notice) to one task
    stops both after the step in flight with one last.ckpt, and the job requeues itself."""
    # Lightning's port on SLURM: 15000 + the job id's last 4 digits
    job_id = f"7{free_port(15000, 24999) - 15000:04d}"
    result = sbatch(cli, tmp_path, "trainer.accelerator=cpu", *tiny, *SAME_RUN, *notice_at_step_2("SIGUSR1"),
                    job=slurm_job(nodes=2, tasks_per_node=1, job_id=job_id))  # fmt: skip
    assert result.returncode == 128 + signal.SIGUSR1, cli.describe(result)
    assert members(result) == [("1", "2"), ("2", "2")], cli.describe(result)
    assert result.stderr.count(f"stopped by SIGUSR1 at step {STOPPED_AT}; saved") == 2, cli.describe(result)
    checkpoints = tmp_path / "runs" / f"mmtx-{job_id}" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt"]
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == STOPPED_AT
    assert (tmp_path / "scontrol.txt").read_text() == f"requeue {job_id}\n"
