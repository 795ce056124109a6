"""Mirroring training images left to right with captions that stay true.

A plain horizontal flip makes "the ball left of the box" false, which is why mmtx flips none
of your own data by default (only the shapes scenes' captioning runs mirror: their captions name
sides with "left" and "right" alone). Swapping the words that name a side as the image is
mirrored keeps every caption true and shows the model each scene with its sides exchanged, as
referring-expression models train (MDETR, TransVG: flip the image, swap "left" and "right" in
the text). Only the words listed swap: a caption that names a side another way ("on the
east") is mirrored false.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mmtx.config_error import ArgumentError


class Mirror:
    """Mirrors an image with probability one half (drawn from torch's CPU generator, which the
    loader seeds per example) and swaps each listed pair of words in its texts.

    Args:
        words: pairs of words, each replaced by the other in a mirrored image's texts, e.g.
            ``[["left", "right"]]``. Whole words only, in any case ("Left" becomes "Right").
    """

    def __init__(self, words: Sequence[Sequence[str]]) -> None:
        swap: dict[str, str] = {}
        for pair in words:
            if isinstance(pair, str) or len(pair) != 2 or not all(isinstance(w, str) and w.isalpha() for w in pair):
                raise ArgumentError("{mirror_words} must be pairs of words, e.g. [[left, right]]", mirror_words=words)
            a, b = (w.lower() for w in pair)
            if a == b or a in swap or b in swap:
                raise ArgumentError("{mirror_words} names a word twice", mirror_words=words)
            swap[a], swap[b] = b, a
        if not swap:
            raise ArgumentError("{mirror_words} is empty; null mirrors nothing", mirror_words=words)
        self.swap = swap
        self.pattern = re.compile(r"\b(" + "|".join(swap) + r")\b", re.IGNORECASE)

    def words(self, text: str) -> str:
        """``text`` as it reads of the mirrored image: each listed word swapped, its case kept."""
        return self.pattern.sub(lambda m: _same_case(self.swap[m[0].lower()], m[0]), text)

    def __call__(self, image: Tensor, texts: list[str]) -> tuple[Tensor, list[str]]:
        """(image, texts) as they are, or mirrored: the image (C, H, W) flipped along its width."""
        if torch.rand(1).tolist()[0] < 0.5:  # drawn as a Python number, as the shifts are
            return image, texts
        return image.flip(-1), [self.words(t) for t in texts]


def _same_case(word: str, like: str) -> str:
    """``word`` in the case of ``like``: upper, capitalised or lower."""
    return word.upper() if like.isupper() and len(like) > 1 else word.capitalize() if like[0].isupper() else word


def build_mirror(words: Any) -> Mirror | None:
    """A `Mirror` of ``words``; None (a config's ``null``) for none."""
    return None if words is None else Mirror(words)
