"""Measure the ViLBERT thesis on shapes VQA: does two-stream pretraining help question answering?

Runs three jobs with ``mmtx-train`` — pretraining on shapes captions, then VQA from scratch and
VQA fine-tuned from the pretraining checkpoint, the same number of steps and the same tokenizer
— and prints the official VQA accuracy of both, overall and per answer type.

    python scripts/vilbert_transfer.py --out runs/transfer            # ~25 minutes on 2 CPU cores
    python scripts/vilbert_transfer.py --out runs/t --vqa-epochs 1 -- trainer=gpu

Arguments after ``--`` go to every ``mmtx-train`` call.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def mmtx_train(*overrides: str) -> float:
    """Run ``mmtx-train`` with ``overrides``; returns its wall time in seconds."""
    exe = Path(sys.executable).with_name("mmtx-train")
    command = [str(exe) if exe.is_file() else shutil.which("mmtx-train") or "mmtx-train", *overrides]
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/vilbert_transfer"), help="where the three runs go")
    parser.add_argument("--pretrain-epochs", type=int, default=2)
    parser.add_argument("--vqa-epochs", type=int, default=2)
    parser.add_argument("--logger", default="csv", help="logger for every run (wandb, csv, none)")
    parser.add_argument("extra", nargs="*", help="more overrides for every run (after --)")
    args = parser.parse_args()

    runs = {name: args.out / name for name in ("pretrain", "scratch", "finetuned")}
    common = [f"logger={args.logger}", *args.extra]
    times = {
        "pretrain": mmtx_train(
            "experiment=pretrain_shapes",
            f"trainer.max_epochs={args.pretrain_epochs}",
            f"hydra.run.dir={runs['pretrain']}",
            *common,
        )
    }
    tokenizer = runs["pretrain"] / "tokenizer.json"  # both VQA runs read questions the same way
    vqa = ["experiment=vqa_shapes", f"trainer.max_epochs={args.vqa_epochs}", *common]
    times["scratch"] = mmtx_train(*vqa, f"tokenizer.path={tokenizer}", f"hydra.run.dir={runs['scratch']}")
    times["finetuned"] = mmtx_train(
        *vqa, f"init_from={runs['pretrain'] / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={runs['finetuned']}"
    )

    summary = {name: json.loads((run / "metrics.json").read_text()) for name, run in runs.items()}
    print(
        "\npretraining (shapes captions):",
        ", ".join(f"{k} {v:.1f}" for k, v in summary["pretrain"]["metrics"].items()),
        "| chance:",
        ", ".join(f"{k} {v:.1f}" for k, v in summary["pretrain"]["baseline"].items() if k != "name"),
    )
    keys = list(summary["scratch"]["metrics"])
    print(f"\nshapes VQA after {summary['scratch']['steps']} steps (official accuracy, %)")
    print(f"{'':<24}" + "".join(f"{k:>10}" for k in keys))
    rows = {
        "from scratch": summary["scratch"]["metrics"],
        "from pretraining": summary["finetuned"]["metrics"],
        "answer prior (baseline)": summary["scratch"]["baseline"],
    }
    for name, metrics in rows.items():
        print(f"{name:<24}" + "".join(f"{metrics[k]:>10.2f}" for k in keys))
    print("\nwall time (s):", ", ".join(f"{k} {v:.0f}" for k, v in times.items()))


if __name__ == "__main__":
    main()
