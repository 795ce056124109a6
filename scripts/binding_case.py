"""The smallest relation case: can a captioner learn "left of" when that is all there is to learn?

Every image shows two shapes of distinct colours in one row or one column of the grid scenes'
3x3 layout (`mmtx.data.synthetic.grid`), and every caption is "a A <relation> a B": A and B named
by size, colour and kind, A drawn at random from the two. With ``--words column`` the caption
says where A stands instead ("a A column1 of a B"): the same position of the same word, decided
by A's place alone rather than by A's place against B's. ``--words mixed`` draws either kind.
``--words axis`` says only whether the pair shares a row or a column ("a A row of a B"): a fact
about the pair that needs no telling which shape is which.
``--first-steps N`` trains on ``--first-words`` (column) captions for N steps before ``--words``.
With ``--outer`` the two shapes stand side by side in the outer columns, so that A's column
alone decides the relation too.

Four steps toward the grid scenes' own data: ``--third`` adds a third shape in a free cell,
named first ("a C and a A left of a B"); ``--phrased`` has the grid scenes' caption writer
(`describe_grid_scene`: its templates, synonyms and third-shape clauses, a random related pair
in either order) write five captions per training image, scored against their side-flipped
twins; ``--plain-share P`` makes that share of the training captions state no relation
("a A and a B"); ``--grid-captions`` trains on the grid generator's scenes and captions
themselves (one to three shapes) and scores the relation probe's pairs
(`scripts/relation_probe.py`).

How it trains: ``--batch-size`` and ``--lr`` (the captioner's recipe by default); ``--claim-weight W``
weighs the relation words W times in the loss; ``--mirrored`` puts each image beside its mirror
image, whose captions say right for left; ``--plain-from N`` brings the ``--plain-share``
captions in at step N; ``--relations-first N`` trains on the grid scenes' captions that state a
relation alone for the first N steps.

A captioner with the towers of ``conf/model/caption_small.yaml`` (``--pos-embed``,
``--encoder-depth``, ``--patch-size``, ``--attention`` and ``--decoder-depth`` change them;
``--token-shift K`` adds to each word's embedding those of the K words before it; ``--read-where``
has each decoder cross-attention head also return where it read, the decoder's ``read_where``)
trains in this process, with bf16 autocast where the CPU has native bf16, for ``--minutes`` (or
``--steps``). Every ``--every`` steps it prints ONE JSON line on 600 held-out images: for the
relation captions, the share whose true caption is more likely than its side-flipped twin (chance
50 %) and the probability of the true direction word; for the column captions, the probability of
the true column word (chance 1/3); for the axis captions, that of the true axis word (chance 1/2);
and where the decoder's last block looks when it predicts the claim word: its cross-attention's
share on the image token at A's centre and at B's, beside the share each token would get from
uniform attention::

    python scripts/binding_case.py --minutes 4 [--words relation] [--pos-embed learned]

The captions use few words, so a word vocabulary stands in for a learned tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from relation_probe import FLIPS, flipped, relation_pairs  # beside this script
from torch import Tensor

from mmtx.attention_maps import attention_weights
from mmtx.data.mirroring import Mirror
from mmtx.data.synthetic.grid import (
    ASPECTS,
    GRID,
    LONG_SIDES,
    GridScene,
    background,
    describe_grid_scene,
    draw_grid_scene,
    image_dims,
    place_shapes,
)
from mmtx.data.synthetic.scenes import COLORS, KINDS, SIZES, render
from mmtx.data.transforms import build_resize, normalize_images
from mmtx.hardware import cpu_has_native_bf16
from mmtx.models.captioner import ImageCaptioner
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.vit import VisionEncoder
from mmtx.tasks.optim import param_groups

DIRECTIONS = ("left", "right", "above", "below")
OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}
COLUMNS = tuple(f"column{k}" for k in range(GRID))
AXES = {"left": "row", "right": "row", "above": "column", "below": "column"}  # the pair's shared line
PAD, BOS, EOS = 0, 1, 2
VOCAB = ("<pad>", "<bos>", "<eos>", "a", "of", *DIRECTIONS, *COLUMNS, "row", "column", *COLORS, *KINDS, *SIZES)
WORD_ID = {w: k for k, w in enumerate(VOCAB)}
RELATION_SHARE = {"relation": 1.0, "column": 0.0, "mixed": 0.5}  # per --words: the share of relation captions
WORDS = (*RELATION_SHARE, "axis")  # --words: the axis captions claim nothing else
CLAIMS = ("relation", "column", "axis")  # what a caption's claim word says
DIM, HEADS = 128, 4  # conf/model/caption_small.yaml's width and heads, in both towers
DIRECTION_AT = 5  # [BOS] a size colour kind <direction word>: the word's index in the ids
THIRD_CLAUSE = 5  # "a size colour kind and": the words a third shape puts before the pair
CAPTIONS_PER_IMAGE = 5  # --phrased: as the grid data sets write them
MIRROR = Mirror([["left", "right"]])  # --mirrored: a caption of the mirror image, as data.mirror_words does


def two_shape_scene(rng: random.Random, outer: bool = False, third: bool = False) -> GridScene:
    """Two shapes of distinct colours in one row or one column, as the grid scenes draw them;
    `outer`: side by side in the two outer columns, so that A's column alone says its side;
    `third`: a third shape, of a third colour, in one of the other cells."""
    width, height = image_dims(rng.choice(LONG_SIDES), rng.choice(ASPECTS))
    line, (a, b) = rng.randrange(GRID), rng.sample((0, GRID - 1) if outer else range(GRID), 2)
    cells = [(line, a), (line, b)] if outer or rng.random() < 0.5 else [(a, line), (b, line)]
    if third:
        cells.append(rng.choice([(r, c) for r in range(GRID) for c in range(GRID) if (r, c) not in cells]))
    return place_shapes(rng, width, height, rng.sample(list(COLORS), len(cells)), cells)


@dataclass(frozen=True)
class Caption:
    """One caption of a two-shape scene and the twin that differs from it in its one claim word."""

    text: str
    twin: str
    claim: str  # one of CLAIMS
    at: int | None = DIRECTION_AT  # the claim word's index in the ids; None: it varies (--phrased)


def caption(scene: GridScene, first: int, claim: str) -> Caption:
    """ "a A left of a B" (`claim` "relation"), "a A column0 of a B" ("column") or "a A row of
    a B" ("axis"), A = shape `first` of the pair (shapes 0 and 1), with its twin: the opposite
    side, the next column or the other axis. A third shape is named first ("a C and ...")."""
    a, b = scene.shapes[first], scene.shapes[1 - first]
    third = "".join(f"a {c.size} {c.color} {c.kind} and " for c in scene.shapes[2:])
    at = DIRECTION_AT + THIRD_CLAUSE * len(scene.shapes[2:])

    def say(word: str) -> str:
        return f"{third}a {a.size} {a.color} {a.kind} {word} of a {b.size} {b.color} {b.kind}"

    side = scene.relation(first, 1 - first)
    if claim == "relation":
        return Caption(say(side), say(OPPOSITE[side]), claim, at)
    if claim == "axis":
        axis = AXES[side]
        return Caption(say(axis), say("column" if axis == "row" else "row"), claim, at)
    column = scene.cells[first][1]
    return Caption(say(COLUMNS[column]), say(COLUMNS[(column + 1) % GRID]), claim, at)


def plain_caption(scene: GridScene) -> str:
    """ "a A and a B": every shape named, no relation stated."""
    return " and ".join(f"a {s.size} {s.color} {s.kind}" for s in scene.shapes)


def phrased_captions(scene: GridScene, rng: random.Random) -> list[Caption]:
    """The grid scenes' captions of `scene` (`describe_grid_scene`), each with its side-flipped
    twin (`relation_probe.flipped`); those stating no single relation are left out."""
    pairs = [(text, flipped(text)) for text in describe_grid_scene(scene, rng, CAPTIONS_PER_IMAGE)]
    return [Caption(text, twin, "relation", None) for text, twin in pairs if twin is not None]


def states_relation(text: str) -> bool:
    """Whether a caption says where one shape stands against another (a word the probe flips)."""
    return not FLIPS.keys().isdisjoint(text.split())


def draw_claim(rng: random.Random, words: str) -> str:
    """What one caption claims under ``--words`` `words`: the axis, or a relation with
    probability ``RELATION_SHARE[words]`` (else A's column)."""
    return "axis" if words == "axis" else "relation" if rng.random() < RELATION_SHARE[words] else "column"


def words_at(step: int, first_steps: int, first_words: str, words: str) -> str:
    """The ``--words`` in force at training step `step`."""
    return first_words if step < first_steps else words


def centre_token(scene: GridScene, shape: int, grid: int) -> int:
    """The index, CLS first, of the image token holding shape `shape`'s centre, on a `grid` x
    `grid` patch layout (the image is squashed to a square)."""
    x, y = scene.shapes[shape].center
    return 1 + min(int(y * grid / scene.height), grid - 1) * grid + min(int(x * grid / scene.width), grid - 1)


def encode(texts: list[str], word_id: dict[str, int] = WORD_ID) -> Tensor:
    """[BOS] ids [EOS] of each caption, padded to the longest (B, T)."""
    rows = [[BOS, *(word_id[w] for w in t.split()), EOS] for t in texts]
    width = max(map(len, rows))
    return torch.tensor([row + [PAD] * (width - len(row)) for row in rows])


def vocabulary(texts: list[str]) -> dict[str, int]:
    """The word ids of `VOCAB` and then of every other word of `texts`, in order of appearance."""
    words = list(VOCAB) + [w for t in texts for w in t.split()]
    return {w: k for k, w in enumerate(dict.fromkeys(words))}


def draw(
    count: int, seed: int, image_size: int, outer: bool = False, third: bool = False
) -> tuple[Tensor, list[GridScene]]:
    """`count` scenes and their images, squashed to uint8 (count, 3, S, S) as the data module does."""
    rng, resize = random.Random(seed), build_resize(image_size)
    scenes = [two_shape_scene(rng, outer, third) for _ in range(count)]
    images = [resize(render(background(rng, s.width, s.height), s.shapes)) for s in scenes]
    return torch.stack(images), scenes


def draw_grid(count: int, seed: int, image_size: int) -> tuple[Tensor, list[list[str]]]:
    """`count` of the grid generator's own images (uint8, squashed) and their captions."""
    resize, images, captions = build_resize(image_size), [], []
    for index in range(count):
        image, texts, _ = draw_grid_scene(random.Random(f"binding-case-grid/{seed}/{index}"))
        images.append(resize(image))
        captions.append(texts)
    return torch.stack(images), captions


class ShiftedEmbedding(torch.nn.Module):
    """A token's embedding plus those of the `shift` tokens before it, each scaled per channel (a
    causal short convolution over the embeddings, as RWKV's token shift and canon layers do):
    the word a query needs can be a few tokens back."""

    def __init__(self, embed: torch.nn.Embedding, shift: int) -> None:
        super().__init__()
        self.embed = embed  # the same module: the LM head stays tied to its weight
        self.mix = torch.nn.Parameter(torch.full((shift, embed.embedding_dim), 0.5))

    num_embeddings = property(lambda self: self.embed.num_embeddings)
    padding_idx = property(lambda self: self.embed.padding_idx)

    def forward(self, ids: Tensor) -> Tensor:  # (B, T) -> (B, T, D)
        x = self.embed(ids)
        out = x
        for k, weight in enumerate(self.mix, start=1):
            out = out + weight * F.pad(x, (0, 0, k, 0))[:, : x.shape[1]]
        return out


def build_captioner(
    pos_embed: str,
    decoder_depth: int,
    image_size: int,
    token_shift: int = 0,
    encoder_depth: int = 2,
    patch_size: int = 8,
    attention: str = "full",
    read_where: bool = False,
    vocab_size: int = len(VOCAB),
    max_length: int = 16,
) -> ImageCaptioner:
    """conf/model/caption_small.yaml's towers over this script's vocabulary."""
    encoder = VisionEncoder(
        image_size,
        patch_size,
        dim=DIM,
        depth=encoder_depth,
        num_heads=HEADS,
        pos_embed=pos_embed,
        stem="conv",
        stem_norm="group",
        attention=attention,
    )
    decoder = CaptionDecoder(
        vocab_size,
        DIM,
        dim=DIM,
        depth=decoder_depth,
        num_heads=HEADS,
        max_length=max_length,
        pad_id=PAD,
        read_where=read_where,
    )
    if token_shift:
        decoder.body.token_embed = ShiftedEmbedding(decoder.body.token_embed, token_shift)
    return ImageCaptioner(encoder, decoder)


@torch.no_grad()
def evaluate(
    model: ImageCaptioner,
    pixels: Tensor,
    captions: list[Caption],
    autocast,
    centres: Tensor | None = None,
    word_id: dict[str, int] = WORD_ID,
) -> dict[str, float | None]:
    """The probe's figures on held-out normalised `pixels` and their `captions`; with `centres`
    (B, 2), the image tokens at A's and B's centres, also where the claim word was read from.
    The claim word's figures need its place in every caption (`Caption.at`)."""
    model.eval()

    def log_probs(texts: list[str]) -> Tensor:  # (B, T - 1) log-probability of each next word, 0 on padding
        ids = encode(texts, word_id)
        with autocast():
            logits = model(pixels, ids[:, :-1]).float()
        return F.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0] * (ids[:, 1:] != PAD)

    texts = [c.text for c in captions]
    at = None if any(c.at is None for c in captions) else torch.tensor([c.at for c in captions])
    passes: list[Tensor] = []  # the true captions' log-probabilities
    weights = None
    if centres is None or at is None:
        passes.append(log_probs(texts))
    else:  # the true captions' pass, its last cross-attention's weights recorded on the way
        blocks = [model.decoder.body.blocks[-1].cross_attn]
        weights = attention_weights(blocks, lambda: passes.append(log_probs(texts)))  # (B, 1, H, T, S)
    true, twin = passes[0], log_probs([c.twin for c in captions])
    won = true.sum(1) > twin.sum(1)
    claim = {k: torch.tensor([c.claim == k for c in captions]) for k in CLAIMS}
    word = torch.zeros(0) if at is None else true.gather(1, at[:, None] - 1)[:, 0].exp()  # the claim word's probability
    figures: dict[str, float | None] = {}
    if weights is not None:
        queries = weights[:, 0].float().mean(1)  # (B, T, S), heads averaged
        read = queries[torch.arange(len(captions)), at - 1]  # (B, S): the claim word's query
        figures = {
            "attention_on_a": mean(read.gather(1, centres[:, :1])),
            "attention_on_b": mean(read.gather(1, centres[:, 1:])),
            "attention_uniform": round(1 / read.shape[1], 3),
        }
    model.train()
    if at is None:
        return {"relation_true_preferred": mean(won[claim["relation"]]), **figures}
    return {
        "relation_true_preferred": mean(won[claim["relation"]]),
        "p_direction_word": mean(word[claim["relation"]]),
        "p_column_word": mean(word[claim["column"]]),
        "p_axis_word": mean(word[claim["axis"]]),
        **figures,
    }


def mean(x: Tensor) -> float | None:
    """The mean of `x` to three places, None for no value."""
    return round(x.float().mean().item(), 3) if x.numel() else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=4.0, help="training time")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps instead")
    p.add_argument("--words", choices=WORDS, default="relation")
    p.add_argument("--pos-embed", choices=("learned", "sinusoidal", "rope"), default="learned")
    p.add_argument("--decoder-depth", type=int, default=1)
    p.add_argument("--encoder-depth", type=int, default=2)
    p.add_argument("--patch-size", type=int, default=8, help="image tokens: (64 / this) squared")
    p.add_argument("--attention", choices=("full", "axial"), default="full", help="the image encoder's")
    p.add_argument("--first-steps", type=int, default=0, help="train on --first-words for this many steps first")
    p.add_argument("--first-words", choices=WORDS, default="column")
    p.add_argument("--outer", action="store_true", help="side by side in the outer columns only")
    p.add_argument("--token-shift", type=int, default=0, help="add the embeddings of this many tokens before")
    p.add_argument("--read-where", action="store_true", help="decoder heads also return where they read")
    p.add_argument("--third", action="store_true", help="a third shape in a free cell, named first")
    p.add_argument("--phrased", action="store_true", help="captions written as the grid scenes write them")
    p.add_argument("--plain-share", type=float, default=0.0, help="share of training captions stating no relation")
    p.add_argument("--plain-from", type=int, default=0, help="the --plain-share captions from this step on")
    p.add_argument(
        "--relations-first",
        type=int,
        default=0,
        help="--grid-captions: for this many steps, only captions stating a relation",
    )
    p.add_argument("--grid-captions", action="store_true", help="the grid generator's scenes and captions")
    p.add_argument("--claim-weight", type=float, default=1.0, help="loss weight of the relation words")
    p.add_argument(
        "--mirrored", action="store_true", help="half of each batch: the other half mirrored, left and right swapped"
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's rate after a 200-step warm-up")
    p.add_argument("--images", type=int, default=12000, help="training images")
    p.add_argument("--every", type=int, default=500, help="steps between evaluations")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if min(args.images, args.every, args.decoder_depth, args.batch_size, args.encoder_depth + 1) < 1:
        p.error("--images, --every, --batch-size and --decoder-depth must be at least 1, --encoder-depth at least 0")
    if args.lr <= 0:
        p.error("--lr must be positive")
    if 64 % args.patch_size:
        p.error("--patch-size must divide the 64-px images")
    if args.claim_weight <= 0:
        p.error("--claim-weight must be positive")
    if not 0 <= args.plain_share < 1:
        p.error("--plain-share must be in [0, 1)")
    if args.relations_first < 0 or (args.relations_first and not args.grid_captions):
        p.error("--relations-first must be at least 0, and needs --grid-captions")
    if args.plain_from < 0 or (args.plain_from and not args.plain_share):
        p.error("--plain-from must be at least 0, and needs --plain-share")
    if args.grid_captions and (
        args.third or args.outer or args.plain_share or args.words != "relation" or args.first_steps
    ):
        p.error(
            "--grid-captions draws the grid scenes and captions: no --third, --outer, --plain-share, --words "
            "or --first-steps"
        )
    if args.mirrored and (args.words != "relation" or args.first_steps or args.batch_size % 2):
        p.error("--mirrored swaps the relation words of an even batch: no --words or --first-steps")
    if args.phrased and (args.words != "relation" or args.first_steps):
        p.error("--phrased writes relation captions: no --words or --first-steps")

    torch.manual_seed(args.seed)
    image_size, batch_size, lr, warmup = 64, args.batch_size, args.lr, 200
    grid = image_size // args.patch_size
    pools: list[list[str]] | None = None  # per training image, the captions it is trained on (else drawn per step)
    val_centres: list[list[int]] | None = []
    if args.grid_captions:
        train_images, pools = draw_grid(args.images, 1000 + args.seed, image_size)
        train_scenes: list[GridScene] = []
        probe = relation_pairs(300, image_size)
        val_pixels = torch.stack([pixels for pixels, *_ in probe])
        val_captions = [Caption(text, twin, "relation", None) for _, text, twin, _ in probe]
        val_centres = None
    else:
        train_images, train_scenes = draw(args.images, 1000 + args.seed, image_size, args.outer, args.third)
        val_images, val_scenes = draw(600, 99, image_size, args.outer, args.third)
        val_pixels = normalize_images(val_images)
        val_rng = random.Random(5)
        val_captions = []
        for scene in val_scenes:
            first = val_rng.randrange(2)
            if args.phrased:
                val_captions.append(val_rng.choice(phrased_captions(scene, val_rng)))
            else:
                val_captions.append(caption(scene, first, draw_claim(val_rng, args.words)))
            val_centres.append([centre_token(scene, k, grid) for k in (first, 1 - first)])
        if args.phrased:
            caption_rng = random.Random(2000 + args.seed)
            pools = [[c.text for c in phrased_captions(scene, caption_rng)] for scene in train_scenes]
    texts_seen = [t for pool in pools or [] for t in pool] + [t for c in val_captions for t in (c.text, c.twin)]
    # the words beyond VOCAB: the grid's phrasing, and "and" (a third shape, plain captions)
    word_id = vocabulary(texts_seen + (["and"] if args.third or args.plain_share else []))
    longest = max(len(t.split()) for t in texts_seen)
    fixed_form = pools is None and not args.third  # the captions this script wrote before the steps to the grid

    model = build_captioner(
        args.pos_embed,
        args.decoder_depth,
        image_size,
        args.token_shift,
        args.encoder_depth,
        args.patch_size,
        args.attention,
        args.read_where,
        len(word_id),
        16 if fixed_form else max(16, longest + 4),
    )
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=lr, betas=(0.9, 0.98))
    word_weights = None  # the loss's weight of each next word: all 1
    if args.claim_weight != 1:
        word_weights = torch.ones(len(word_id))
        word_weights[[k for w, k in word_id.items() if w in FLIPS]] = args.claim_weight
    bf16 = cpu_has_native_bf16()
    autocast = (lambda: torch.autocast("cpu", torch.bfloat16)) if bf16 else contextlib.nullcontext
    rng, step, start = random.Random(args.seed), 0, time.perf_counter()
    # --relations-first: each image's captions that state a relation, and the images that have one
    relation_pools = [[t for t in pool if states_relation(t)] for pool in pools or []]
    related = [k for k, pool in enumerate(relation_pools) if pool]

    def report(**extra) -> None:
        centres = None if val_centres is None else torch.tensor(val_centres)
        figures = evaluate(model, val_pixels, val_captions, autocast, centres, word_id)
        print(json.dumps({"step": step, "seconds": round(time.perf_counter() - start), **extra, **figures}), flush=True)

    while (step < args.steps) if args.steps is not None else (time.perf_counter() - start < 60 * args.minutes):
        first = step < args.relations_first
        count = batch_size // 2 if args.mirrored else batch_size
        index = [rng.choice(related) if first else rng.randrange(args.images) for _ in range(count)]
        words = words_at(step, args.first_steps, args.first_words, args.words)
        texts = [
            rng.choice(relation_pools[k])
            if first
            else plain_caption(train_scenes[k])
            if args.plain_share and step >= args.plain_from and rng.random() < args.plain_share
            else rng.choice(pools[k])
            if pools is not None
            else caption(train_scenes[k], rng.randrange(2), draw_claim(rng, words)).text
            for k in index
        ]
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        images = train_images[index]
        if args.mirrored:  # each image beside its mirror image, whose captions say right for left
            images, texts = torch.cat([images, images.flip(-1)]), texts + [MIRROR.words(t) for t in texts]
        with autocast():
            loss = model.loss(normalize_images(images), encode(texts, word_id), PAD, weight=word_weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.every == 0:
            report(loss=round(loss.item(), 3))
    report(final=True, **vars(args), bf16=bf16)


if __name__ == "__main__":
    main()
