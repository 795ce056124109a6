"""CIDEr-D as a training reward: each caption against its image's references, with the
document frequencies of a whole reference corpus (the training captions), as self-critical
training uses it (Rennie et al. 2017; ruotianluo/self-critical.pytorch's ``df: corpus``).

pycocoevalcap's ``CiderScorer`` computes the n-gram vectors, the clipped similarity and the
length penalty (CIDEr-D, sigma 6) unchanged. Two things differ from its ``compute_score``,
which takes the document frequencies from the captions it scores: they come from the corpus,
computed once; and the idf's ``log N`` is the corpus's number of images (its ``compute_cider``
takes ``N`` as the length of its reference list, which is padded to the corpus size here, in
chunks of at most that many captions; ``compute_cider`` pairs captions with references only as
far as the captions go). Text is
lowercased and split into words at anything that is not a letter or digit: the PTB tokenizer
the official metric uses is a Java process, too slow for every training step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pycocoevalcap.cider.cider_scorer import CiderScorer

_WORDS = re.compile(r"[a-z0-9]+")


class _Frequencies(dict):
    """Document frequencies that read 0 for an n-gram the corpus lacks, without storing it
    (pycocoevalcap's ``defaultdict`` would keep every n-gram of every scored caption)."""

    def __missing__(self, ngram: tuple[str, ...]) -> float:
        return 0.0


def words(text: str) -> str:
    """``text`` lowercased, as words separated by single spaces (punctuation dropped)."""
    return " ".join(_WORDS.findall(text.lower()))


class CorpusCider:
    """``CorpusCider(references)(captions, references_of_each)``: CIDEr-D (pycocoevalcap's scale,
    about 0-10) of each caption, idf from the corpus ``references`` (one list per image)."""

    def __init__(self, corpus: Sequence[Sequence[str]]) -> None:
        if not corpus:
            raise ValueError("a CIDEr reward needs reference captions (the training split has none)")
        scorer = CiderScorer()
        for refs in corpus:
            scorer.cook_append(None, [words(r) for r in refs])
        scorer.compute_doc_freq()
        self.document_frequency = _Frequencies(scorer.document_frequency)
        self.images = len(corpus)

    def __call__(self, captions: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
        if len(captions) != len(references):
            raise ValueError(f"{len(captions)} captions but {len(references)} reference lists")
        scores: list[float] = []
        for start in range(0, len(captions), self.images):  # the reference list padded to N: at most N at once
            scorer = CiderScorer()
            for caption, refs in zip(captions[start : start + self.images], references[start : start + self.images]):
                scorer.cook_append(words(caption), [words(r) for r in refs])
            scorer.document_frequency = self.document_frequency
            scorer.crefs.extend([[]] * (self.images - len(scorer.crefs)))  # log N: the corpus's
            scores += [float(score) for score in scorer.compute_cider()]
        return scores
