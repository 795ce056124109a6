"""Does a captioner know where the shapes are? A teacher-forced relation probe on grid scenes.

Greedy captions say little about what a captioner has learnt of relations: decoding favours the
phrase that begins most captions, whatever the image. This probe asks the model instead. For each
caption of a freshly drawn grid scene (`mmtx.data.synthetic.grid`) that states a relation, it
scores the caption and its twin with the side flipped ("left of" <-> "right of", "above" <->
"below", ...), both teacher-forced on the image; a captioner that knows where the shapes are
gives the true caption the higher likelihood. Chance is 50 %. Prints ONE JSON line per
checkpoint: the share of pairs won, overall, by axis, by the true caption's direction word and
by the word before it ("to the left of", "is left of", "a box left of"), and how many pairs
were scored::

    python scripts/relation_probe.py RUN/checkpoints/last.ckpt [--scenes 300]

The direction words are not equally common ("over" is said more often than "under"), so a
captioner blind to the image already wins most pairs of the commoner word and loses most of the
other's. `own_scene` takes that prior away: the share of pairs whose true caption gains more over
its twin on its own image than on another scene's, where the words' prior is the same. Ties count
half, so a captioner that does not look at the image scores exactly 50 % there.

The scenes come from the probe's own seeds (never part of a training set), squashed to the
checkpoint's image size as the data module squashes a grid image.
"""

from __future__ import annotations

import argparse
import json
import random
import re

import torch
import torch.nn.functional as F
from torch import Tensor

from mmtx.checkpoint import load_task
from mmtx.data.synthetic.grid import draw_grid_scene
from mmtx.data.transforms import build_transforms

# Each direction word and its opposite; the generators' phrases differ only in these words.
FLIPS = {
    "left": "right", "right": "left", "above": "below", "below": "above",
    "over": "under", "under": "over", "beneath": "above",
}  # fmt: skip
HORIZONTAL = {"left", "right"}
_DIRECTION = re.compile(r"\b(" + "|".join(FLIPS) + r")\b")


def flipped(caption: str) -> str | None:
    """`caption` with its one direction word turned to the opposite side; None when it states no
    relation or more than one."""
    words = _DIRECTION.findall(caption)
    if len(words) != 1:
        return None
    return _DIRECTION.sub(lambda m: FLIPS[m.group(1)], caption)


@torch.no_grad()
def log_likelihoods(task, images: Tensor, captions: list[str]) -> Tensor:
    """Summed log-probability (B,) of each caption [BOS] ... [EOS] given its image (B, 3, S, S)."""
    tokenizer, model = task.tokenizer, task.model
    ids, _ = tokenizer.encode_batch(captions, model.decoder.max_length)
    logits = model(images, ids[:, :-1]).float()  # (B, T - 1, vocab)
    targets = ids[:, 1:]
    logp = F.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    return (logp * (targets != tokenizer.pad_id)).sum(1)


def relation_pairs(scenes: int, image_size: int) -> list[tuple[Tensor, str, str, bool]]:
    """(image, true caption, flipped twin, horizontal?) for every distinct caption stating one
    relation, over `scenes` grid scenes drawn from the probe's own seeds."""
    transform = build_transforms(image_size, train=False)
    pairs = []
    for index in range(scenes):
        image, captions, _ = draw_grid_scene(random.Random(f"mmtx-relation-probe/{index}"))
        pixels = transform(image)
        for caption in dict.fromkeys(captions):  # each distinct caption once
            twin = flipped(caption)
            if twin is not None:
                pairs.append((pixels, caption, twin, bool(HORIZONTAL & set(caption.split()))))
    return pairs


def probe(task, pairs: list[tuple[Tensor, str, str, bool]], likelihood=log_likelihoods, batch: int = 100) -> dict:
    """The share of `pairs` whose true caption `likelihood` scores above its twin, overall, by
    axis, by the true caption's direction word and by the word before it (`by_lead`); and the
    same pairs judged against another scene (`own_scene`, see the module's docstring)."""
    if not pairs:
        raise ValueError("no caption stating a relation to probe: draw more scenes")
    others = [_another_scene(pairs, i) for i in range(len(pairs))]
    own: list[float] = []  # log-likelihood of the true caption minus its twin's, on its image
    elsewhere: list[float] = []  # the same, on another scene's image
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        true, twin = [p[1] for p in chunk], [p[2] for p in chunk]
        for margins, images in ((own, [p[0] for p in chunk]), (elsewhere, others[start : start + batch])):
            images = torch.stack(images)
            margins += (likelihood(task, images, true) - likelihood(task, images, twin)).tolist()

    def share(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    def by_axis(won: list[float]) -> dict[str, float | None]:
        return {"overall": share(won), "horizontal": share([w for w, p in zip(won, pairs) if p[3]]),
                "vertical": share([w for w, p in zip(won, pairs) if not p[3]])}  # fmt: skip

    won = [float(m > 0) for m in own]
    # ties count half: a scorer blind to the image scores exactly chance
    gained = [1.0 if m > e else 0.5 if m == e else 0.0 for m, e in zip(own, elsewhere)]
    words: dict[str, list[float]] = {}
    leads: dict[str, tuple[list[float], list[float]]] = {}
    for w, g, (_, caption, _, horizontal) in zip(won, gained, pairs):
        word, lead = _word_and_lead(caption)
        words.setdefault(word, []).append(w)
        group = leads.setdefault(f"{'horizontal' if horizontal else 'vertical'} after {lead}", ([], []))
        group[0].append(w)
        group[1].append(g)
    axes = by_axis(won)
    return {"pairs": len(won), "true_preferred": axes["overall"], "horizontal": axes["horizontal"],
            "vertical": axes["vertical"], "chance": 0.5,
            "by_word": {w: share(ws) for w, ws in sorted(words.items())},
            "own_scene": by_axis(gained),
            "by_lead": {k: {"pairs": len(w), "true_preferred": share(w), "own_scene": share(g)}
                        for k, (w, g) in sorted(leads.items())}}  # fmt: skip


def _word_and_lead(caption: str) -> tuple[str, str]:
    """The direction word and what comes just before it: "'the'" ("to the left of"), "'is'",
    "'sits'", or "a noun" ("a red box above ...")."""
    match = _DIRECTION.search(caption)
    before = caption[: match.start()].split()[-1:]
    return match.group(1), repr(before[0]) if before and before[0] in ("the", "is", "sits") else "a noun"


def _another_scene(pairs: list[tuple[Tensor, str, str, bool]], i: int) -> Tensor:
    """The image of the first pair after pair `i` (cyclically) drawn from another scene."""
    for step in range(1, len(pairs)):
        image = pairs[(i + step) % len(pairs)][0]
        if image is not pairs[i][0]:
            return image
    raise ValueError("the probe's pairs come from one scene: draw more scenes")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ckpt", nargs="+", help="captioner checkpoints (.ckpt)")
    p.add_argument("--scenes", type=int, default=300, help="grid scenes to draw")
    args = p.parse_args()
    if args.scenes < 1:
        p.error(f"--scenes must be at least 1, got {args.scenes}")
    for ckpt in args.ckpt:
        task = load_task(ckpt).eval()
        pairs = relation_pairs(args.scenes, task.model.encoder.image_size)
        print(json.dumps({"ckpt": ckpt, **probe(task, pairs)}), flush=True)


if __name__ == "__main__":
    main()
