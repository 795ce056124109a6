"""Official VQA accuracy per question family of the shapes VQA data (what a model has and has not learnt).

The answer types (yes/no, number, other) of the official evaluation mix families a model learns
at very different speeds: "how many large shapes are there?" and "is there a large shape?" ask
the same thing. This script groups the questions of a predictions file (``mmtx-eval``'s
``predictions=``, the official results format) by the templates of
`mmtx.data.synthetic.shapes_vqa` and scores each group with the official accuracy:

    mmtx-eval ckpt=RUN/checkpoints/last.ckpt split=train predictions=train_predictions.json
    python scripts/vqa_families.py DATA_ROOT train_predictions.json --split train [more.json ...]

``DATA_ROOT`` is the shapes VQA directory (``questions_{split}.json``, ``annotations_{split}.json``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from mmtx.data.synthetic.scenes import COLORS, KINDS, SIZES
from mmtx.data.vqa.files import read_vqa
from mmtx.metrics.vqa import vqa_accuracy

_KIND = "|".join(KINDS)
_SIZE = "|".join(SIZES)
_COLOR = "|".join(COLORS)
FAMILIES = {  # family -> the question templates of mmtx.data.synthetic.shapes_vqa, first match wins
    "count all": r"how many shapes are there\?",
    "count size": rf"how many ({_SIZE}) shapes are there\?",
    "count color": rf"how many ({_COLOR}) shapes are there\?",
    "count kind": r"how many \w+ are there\?",
    "exists kind": rf"is there a ({_KIND})\?",
    "exists size": rf"is there a ({_SIZE}) shape\?",
    "exists color": rf"is there a ({_COLOR}) shape\?",
    "exists colored kind": rf"is there a ({_COLOR}) ({_KIND})\?",
    "relation": r"is the .+ the .+\?",
    "color of kind": rf"what color is the (({_SIZE}) )?({_KIND})\?",
    "color of size": rf"what color is the ({_SIZE}) shape\?",
    "kind of color": r"what shape is the \w+ object\?",
    "size of shape": r"what size is the .+\?",
    "what is where": r"what is .+\?",
}


def family(question: str) -> str:
    return next((name for name, pattern in FAMILIES.items() if re.fullmatch(pattern, question)), "unknown")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="the shapes VQA directory")
    p.add_argument("predictions", type=Path, nargs="+", help="official results files ([{question_id, answer}])")
    p.add_argument("--split", default="val")
    p.add_argument("--json", type=Path, help="also write {predictions file: {family: [n, accuracy]}} here")
    args = p.parse_args()
    root = args.root
    records = {
        r.question_id: r
        for r in read_vqa(
            root / f"questions_{args.split}.json", root / f"annotations_{args.split}.json", root / args.split
        )
    }
    table = {}
    for path in args.predictions:
        groups: dict[str, dict[int, str]] = defaultdict(dict)
        for row in json.loads(path.read_text()):
            groups[family(records[row["question_id"]].question)][row["question_id"]] = row["answer"]
        table[str(path)] = {
            name: [len(group), vqa_accuracy(group, {qid: records[qid] for qid in group}, ndigits=1)["accuracy"]]
            for name, group in groups.items()
        }
    names = [name for name in [*FAMILIES, "unknown"] if any(name in t for t in table.values())]
    print(f"{'family':22s}" + "".join(f"{Path(k).name[:24]:>26s}" for k in table))
    for name in names:
        cells = [t.get(name) for t in table.values()]
        print(f"{name:22s}" + "".join(f"{f'{c[1]:.1f} (n={c[0]})' if c else '-':>26s}" for c in cells))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
