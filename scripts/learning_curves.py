"""Time-to-quality: train each task for a wall-clock budget through ``mmtx-train``, as a user would.

Every run is one ``mmtx-train`` process (the CLI's code path, nothing bypassed) with a time
budget (``trainer.max_time``: the LR schedule is annealed to it), CSV logging and a validation
every ``--val-every`` steps; each validation logs the official metrics with ``val/minutes``, the
training time so far. The script collects those into curves of quality against minutes and writes

- ``OUT/curves.json``: for every task, variant (an ablation: extra overrides) and seed, the curve
  and the final metrics; and per task/variant the mean and range over seeds of the final metrics;
- ``OUT/curves.png``: the curves, one panel per task, one line per variant and seed.

Tasks: ``caption`` (default captioner; CIDEr, BLEU-4 and, on shapes, caption correctness),
``pretrain`` (``experiment=pretrain_shapes``; alignment accuracy, R@1 both ways), ``vqa``
(``experiment=vqa_shapes`` from scratch) and ``vqa_from_pretrain`` (the same, ``init_from=`` the
``pretrain`` run of the same seed and variant, at ``task.lr=5e-4 data.batch_size=64``: a variant's overrides apply to
the whole chain, so an architecture change is pretrained and fine-tuned alike; an override written
``TASK:key=value`` applies to that task's runs only, e.g. a pretraining objective's weight). Runs already
finished in ``OUT/runs`` are reused, so an interrupted sweep continues where it stopped; every
variant ever run stays in the output.

    python scripts/learning_curves.py --tasks caption --minutes 8 --seeds 2 --out curves
    python scripts/learning_curves.py --tasks caption --variant p16="model.encoder.patch_size=16" --out curves
    python scripts/learning_curves.py --tasks pretrain,vqa,vqa_from_pretrain --seeds 3 --out curves
    python scripts/learning_curves.py --tasks pretrain,vqa_from_pretrain --variant nompm="pretrain:task.objectives.mpm=0"

Measure with nothing else running: runs are timed, and two torch processes on a few cores slow
each other down several-fold. Needs ``pip install -e '.[curves]'`` (matplotlib) for the PNG.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

TASKS = {  # task -> (mmtx-train arguments, metrics to report, the metric that is plotted)
    "caption": (
        [],
        ["CIDEr", "BLEU-4", "correctness", "relation_accuracy", "relations_stated"],
        "correctness",
    ),  # CIDEr saturates early on shapes
    "pretrain": (
        ["experiment=pretrain_shapes"],
        ["itm_accuracy", "i2t_R@1", "t2i_R@1", "i2t_R@5", "t2i_R@5"],
        "itm_accuracy",
    ),
    "vqa": (["experiment=vqa_shapes"], ["accuracy", "yes/no", "number", "other"], "accuracy"),
    # fine-tuning below the scratch rate and batch, as conf/experiment/vqa_shapes.yaml advises (docs/learning.md)
    "vqa_from_pretrain": (
        ["experiment=vqa_shapes", "task.lr=5e-4", "data.batch_size=64"],
        ["accuracy", "yes/no", "number", "other"],
        "accuracy",
    ),
}


def tasks(text: str) -> list[str]:
    names = [t for t in text.split(",") if t]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    return names


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tasks", type=tasks, default=["caption"], help=f"comma-separated, of {','.join(TASKS)}")
    p.add_argument("--minutes", type=float, default=8.0, help="each run's training budget (trainer.max_time)")
    p.add_argument("--seeds", type=int, default=2, help="runs per task and variant, seeds 0..N-1")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='NAME="k=v k=v"',
        help="an ablation: a name and the overrides it adds to every task's run (repeatable; "
        "TASK:key=value for one task's runs only); 'base' (no overrides) always runs",
    )
    p.add_argument("--only-variants", action="store_true", help="run the --variant ablations without 'base'")
    p.add_argument("--num-train", type=int, default=3000, help="shapes training images")
    p.add_argument("--num-val", type=int, default=300, help="shapes validation images")
    p.add_argument("--val-every", type=int, default=250, help="validate every N optimizer steps")
    p.add_argument("--out", type=Path, default=Path("learning_curves"))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    return p.parse_args()


def for_task(overrides: list[str], task: str) -> list[str]:
    """A variant's overrides for one task's runs: ``TASK:key=value`` only for TASK, the rest for all."""
    picked = []
    for override in overrides:
        prefix, sep, rest = override.partition(":")
        if sep and prefix in TASKS:
            if prefix == task:
                picked.append(rest)
        else:
            picked.append(override)
    return picked


def run_dir(out: Path, task: str, variant: str, seed: int) -> Path:
    return out / "runs" / f"{task}-{variant}-seed{seed}"


def train(args: argparse.Namespace, task: str, variant: str, overrides: list[str], seed: int) -> Path:
    """One ``mmtx-train`` run (skipped if it already finished); returns its directory."""
    directory = run_dir(args.out, task, variant, seed)
    if (directory / "metrics.json").exists():
        print(f"[{task} {variant} seed {seed}] reusing {directory}", flush=True)
        return directory
    seconds = int(round(args.minutes * 60))
    command = [
        "mmtx-train",
        *TASKS[task][0],
        f"seed={seed}",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        f"trainer.max_time=00:00:{seconds // 60:02d}:{seconds % 60:02d}",
        f"trainer.val_check_interval={args.val_every}",
        "trainer.check_val_every_n_epoch=null",
        f"data.num_train={args.num_train}",
        f"data.num_val={args.num_val}",
        f"hydra.run.dir={directory}",
        *args.set,
        *overrides,
    ]
    if task == "vqa_from_pretrain":
        pretrained = run_dir(args.out, "pretrain", variant, seed) / "checkpoints" / "last.ckpt"
        if not pretrained.exists():
            sys.exit(f"vqa_from_pretrain needs {pretrained}: run --tasks pretrain (variant {variant}) first")
        command.append(f"init_from={pretrained}")
    print(f"[{task} {variant} seed {seed}] {shlex.join(command)}", flush=True)
    start = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.with_suffix(".log"), "w") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        sys.exit(f"[{task} {variant} seed {seed}] mmtx-train failed ({code}); see {directory.with_suffix('.log')}")
    print(f"[{task} {variant} seed {seed}] done in {(time.monotonic() - start) / 60:.1f} min", flush=True)
    return directory


def curve(directory: Path, keys: list[str]) -> list[dict[str, float]]:
    """The run's validations: ``{"minutes": m, "step": s, key: value, ...}`` in order."""
    points = []
    for path in sorted(directory.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("val/minutes"):
                    point = {"minutes": float(row["val/minutes"]), "step": int(row["step"])}
                    point |= {k: float(row[f"val/{k}"]) for k in keys if row.get(f"val/{k}")}
                    points.append(point)
    return points


def summary(finals: list[dict[str, float]], keys: list[str]) -> dict[str, dict[str, float]]:
    """Mean, min and max over seeds of each final metric."""
    out = {}
    for k in keys:
        values = [f[k] for f in finals if k in f]
        if values:
            out[k] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        key = TASKS[task][2]
        for variant, runs in results["tasks"][task].items():
            for seed, run in runs["seeds"].items():
                xs = [p["minutes"] for p in run["curve"] if key in p]
                ys = [p[key] for p in run["curve"] if key in p]
                ax.plot(xs, ys, marker="o", label=f"{variant} s{seed}")
        ax.set_title(task)
        ax.set_xlabel("training minutes")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"mmtx time-to-quality ({results['cpu']}, {results['threads']} threads)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    args = parse_args()
    variants = {} if args.only_variants else {"base": []}
    for spec in args.variant:
        name, _, overrides = spec.partition("=")
        variants[name] = shlex.split(overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "curves.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"tasks": {}}
    results |= {
        "cpu": cpu_name(),
        "threads": os.cpu_count(),
        "minutes": args.minutes,
        "num_train": args.num_train,
        "num_val": args.num_val,
    }
    order = sorted(args.tasks, key=list(TASKS).index)  # pretraining before the fine-tuning that needs it
    for task in order:
        keys = TASKS[task][1]
        for variant, overrides in variants.items():
            overrides = for_task(overrides, task)
            entry = results["tasks"].setdefault(task, {}).setdefault(variant, {"overrides": overrides, "seeds": {}})
            for seed in range(args.seeds):
                directory = train(args, task, variant, overrides, seed)
                final = json.loads((directory / "metrics.json").read_text())
                entry["seeds"][str(seed)] = {
                    "final": {k: final["metrics"][k] for k in keys if k in final["metrics"]},
                    "steps": final["steps"],
                    "baseline": final["baseline"],
                    "curve": curve(directory, keys),
                }
                entry["summary"] = summary([r["final"] for r in entry["seeds"].values()], keys)
                results_path.write_text(json.dumps(results, indent=1))
            print(
                f"{task} {variant}: "
                + ", ".join(
                    f"{k} {s['mean']:.3f} [{s['min']:.3f}, {s['max']:.3f}]" for k, s in entry["summary"].items()
                )
            )
    try:
        plot(results, args.out / "curves.png")
        print(f"wrote {results_path} and {args.out / 'curves.png'}")
    except ImportError:
        print(f"wrote {results_path} (no PNG: pip install matplotlib)")


if __name__ == "__main__":
    main()
