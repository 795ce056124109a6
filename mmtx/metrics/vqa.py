"""The official VQA accuracy, answer normalisation, soft training targets and the answer vocabulary.

Matches GT-Vision-Lab/VQA ``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` (master), the
script behind published VQA v1/v2 numbers, rule for rule:

* Every answer, predicted or ground truth, first has its newlines and tabs replaced by spaces
  and is stripped.
* Only when a question's ground-truth answers are *not* all identical are they, and the
  prediction, normalised (`normalize_answer`). When all annotators typed the same string the
  prediction must equal it exactly: ten "yes" answers give "Yes" or "yes!" zero (by the
  authors' account, so that text read off the image is compared verbatim).
* A prediction scores min(1, matches / 3) against each leave-one-out subset of the answers,
  averaged over the subsets (``10 choose 9`` for the usual ten answers).
* Accuracies are means over questions in percent, rounded to 2 decimals as Python 2.7's
  ``round`` does (exact ties away from zero; Python 3 ports of the script round them to even).

`soft_scores` gives each answer of a question exactly the accuracy predicting it would get,
which is the soft target ViLBERT/BUTD-style classifiers train on; `build_answer_vocab`
chooses their answer classes from the same strings.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Protocol

__all__ = [
    "ANSWER_TYPES",
    "VqaAnnotation",
    "build_answer_vocab",
    "normalize_answer",
    "question_accuracy",
    "reference_answers",
    "soft_scores",
    "vqa_accuracy",
]

ANSWER_TYPES = ("yes/no", "number", "other")  # the official answer types, in the order papers report them

# The official rules as data. Number words become digits ("none" counts as zero).
_NUMBER_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_ARTICLES = frozenset({"a", "an", "the"})
# Contractions typed without their apostrophe, entry for entry as in the official table. Its
# quirks are kept: capitalised keys ("Im") never match because words are lowercased first, and
# "somebody'd" maps to "somebodyd".
_CONTRACTIONS = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "Id've": "I'd've",
    "I'dve": "I'd've",
    "Im": "I'm",
    "Ive": "I've",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}
# Removed (next to a space, or anywhere when the text has a digit-comma-digit such as
# "1,000") or else replaced by a space. Apostrophes, colons and periods are not in the list.
_PUNCTUATION = (
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
)
# The official patterns are Python 2 byte-string patterns, so \d means [0-9] there.
_DIGIT_COMMA_DIGIT = re.compile(r"[0-9],[0-9]")
# A period is removed unless a digit follows it ("3.5" stays). The official pattern also starts
# with "(?!<=\d)", a negative lookahead (not a lookbehind) that always holds before a period.
_PERIOD = re.compile(r"\.(?![0-9])")
# The official call passes re.UNICODE (32) where `re.sub` takes its count, so at most 32
# periods are removed from one answer.
_PERIODS_REMOVED = 32
_ROUNDING_DIGITS = 2  # the official default, ``VQAEval(n=2)``


class VqaAnnotation(Protocol):
    """What `vqa_accuracy` needs of a question's annotation (e.g. `mmtx.data.vqa.VqaRecord`)."""

    @property
    def answers(self) -> Sequence[str]: ...

    @property
    def answer_type(self) -> str | None: ...


def normalize_answer(answer: str) -> str:
    """The official answer processing: whitespace, punctuation, case, number words, articles,
    contractions. ``"Two dogs!"`` -> ``"2 dogs"``, ``"1,000"`` -> ``"1000"``, ``"dont"`` -> ``"don't"``.

    `vqa_accuracy` applies it only to questions whose answers disagree (see the module docs).
    """
    return _normalize_cleaned(_clean(answer))


def reference_answers(answers: Sequence[str]) -> list[str]:
    """A question's ground-truth answers as the official evaluation compares them: cleaned of
    tabs, newlines and outer spaces, and normalised unless they are all the same string."""
    return _references(answers)[0]


def question_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """The official accuracy of `prediction` on one question, in [0, 1] (not in percent)."""
    references, normalized = _references(answers)
    return _leave_one_out(_prepare(prediction, normalized), references)


def soft_scores(answers: Sequence[str]) -> dict[str, float]:
    """{answer: the official accuracy of predicting it} for each distinct answer of a question.

    Keys are the `reference_answers` strings, in order of first appearance, so
    ``soft_scores(answers)[a] == question_accuracy(a, answers)`` for every key ``a``; any
    prediction that matches no key scores 0.
    """
    references = reference_answers(answers)
    return {answer: _leave_one_out(answer, references) for answer in dict.fromkeys(references)}


def vqa_accuracy(
    predictions: Mapping[int, str],
    annotations: Mapping[int, VqaAnnotation | Mapping[str, Any]],
    ndigits: int | None = _ROUNDING_DIGITS,
) -> dict[str, float]:
    """The official VQA accuracy of one predicted answer per question id, in percent.

    `annotations` maps every question id of `predictions` (and no other, as the official
    script requires) to an object with ``answers`` and ``answer_type`` (a `VqaRecord`) or to
    an official annotation dict (``answers`` as ``[{"answer": ...}]`` or as strings).

    Returns ``accuracy`` over all questions, then one key per answer type that has questions
    (the official ``ANSWER_TYPES`` first, others sorted; a type without questions is left
    out, as the official script does, rather than reported as NaN). Values are rounded to
    `ndigits` decimals like the official script; ``None`` keeps them unrounded.
    """
    _check_same_questions(predictions, annotations)
    overall: list[float] = []
    by_type: dict[str, list[float]] = {}
    for question_id, annotation in annotations.items():  # the annotation order, as officially
        prediction = predictions[question_id]
        if not isinstance(prediction, str):
            raise TypeError(f"prediction for question {question_id}: expected a string, got {prediction!r}")
        answers, answer_type = _unpack(annotation, question_id)
        accuracy = question_accuracy(prediction, answers)
        overall.append(accuracy)
        if answer_type is not None:
            by_type.setdefault(answer_type, []).append(accuracy)

    order = [t for t in ANSWER_TYPES if t in by_type] + sorted(set(by_type) - set(ANSWER_TYPES))
    result = {"accuracy": _percent(overall, ndigits)}
    result.update((answer_type, _percent(by_type[answer_type], ndigits)) for answer_type in order)
    return result


def build_answer_vocab(answer_lists: Iterable[Sequence[str]], size: int, min_count: int = 1) -> list[str]:
    """The `size` most frequent answers over all questions, as `reference_answers` spells them
    (normalised unless a question's answers are all the same string, so each class is a string
    the official evaluation accepts). Answers seen fewer than `min_count` times are left out;
    ties are broken alphabetically, so the vocabulary depends only on the answers.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be a positive int, got {min_count!r}")
    counts = Counter(answer for answers in answer_lists for answer in reference_answers(answers))
    ranked = sorted((answer for answer, n in counts.items() if n >= min_count), key=lambda a: (-counts[a], a))
    return ranked[:size]


def _clean(answer: str) -> str:
    return answer.replace("\n", " ").replace("\t", " ").strip()


@functools.lru_cache(maxsize=1 << 16)  # answers repeat ("yes", "2", ...): each distinct one is normalised once
def _normalize_cleaned(text: str) -> str:
    return _process_digits_articles(_process_punctuation(text))


def _process_punctuation(text: str) -> str:
    """Remove or space out `_PUNCTUATION` and drop periods that do not precede a digit.

    Whether a mark is removed or becomes a space depends on the text as given, not as edited
    by earlier marks: "red (dark)" -> "red dark " since " (" occurs but neither ") " nor " )".
    """
    glue_all = _DIGIT_COMMA_DIGIT.search(text) is not None
    out = text
    for mark in _PUNCTUATION:
        glued = glue_all or f"{mark} " in text or f" {mark}" in text
        out = out.replace(mark, "" if glued else " ")
    return _PERIOD.sub("", out, count=_PERIODS_REMOVED)


def _process_digits_articles(text: str) -> str:
    """Lowercase, split on whitespace, number words to digits, drop articles, fix contractions."""
    words = (_NUMBER_WORDS.get(word, word) for word in text.lower().split())
    return " ".join(_CONTRACTIONS.get(word, word) for word in words if word not in _ARTICLES)


def _references(answers: Sequence[str]) -> tuple[list[str], bool]:
    """(the answers as compared, whether they were normalised)."""
    if isinstance(answers, str) or not answers:
        raise ValueError(f"expected a non-empty sequence of answer strings, got {answers!r}")
    if not all(isinstance(answer, str) for answer in answers):
        raise TypeError(f"answers must be strings, got {list(answers)!r}")
    cleaned = [_clean(answer) for answer in answers]
    if len(set(cleaned)) == 1:
        return cleaned, False
    return [_normalize_cleaned(answer) for answer in cleaned], True


def _prepare(prediction: str, normalized: bool) -> str:
    cleaned = _clean(prediction)
    return _normalize_cleaned(cleaned) if normalized else cleaned


def _leave_one_out(prediction: str, references: Sequence[str]) -> float:
    """Mean over i of min(1, (matches among the references other than i) / 3).

    Same operations in the same order as the official loop, so the floats are identical.
    """
    matches = sum(reference == prediction for reference in references)
    scores = (min(1.0, (matches - (reference == prediction)) / 3) for reference in references)
    return sum(scores) / len(references)


def _percent(accuracies: Sequence[float], ndigits: int | None) -> float:
    value = 100 * sum(accuracies) / len(accuracies)
    if ndigits is None:
        return value
    # Python 2.7's round(): the exact binary value, ties away from zero.
    return float(Decimal(value).quantize(Decimal(1).scaleb(-ndigits), rounding=ROUND_HALF_UP))


def _unpack(annotation: VqaAnnotation | Mapping[str, Any], question_id: int) -> tuple[list[str], str | None]:
    """(answer strings, answer type) of a record or of an official annotation dict."""
    if isinstance(annotation, Mapping):
        if "answers" not in annotation:
            raise ValueError(f"annotation of question {question_id}: missing key 'answers'")
        raw, answer_type = annotation["answers"], annotation.get("answer_type")
    else:
        raw, answer_type = annotation.answers, annotation.answer_type
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or not raw:
        raise ValueError(f"annotation of question {question_id}: expected a list of answers, got {raw!r}")
    answers = [entry.get("answer") if isinstance(entry, Mapping) else entry for entry in raw]
    if not all(isinstance(answer, str) for answer in answers):
        raise ValueError(f"annotation of question {question_id}: expected answer strings, got {raw!r}")
    if answer_type is not None and not isinstance(answer_type, str):
        raise ValueError(f"annotation of question {question_id}: answer_type must be a string, got {answer_type!r}")
    return answers, answer_type


def _check_same_questions(predictions: Mapping[int, str], annotations: Mapping[int, Any]) -> None:
    if not annotations:
        raise ValueError("no annotations to evaluate against")
    missing = [qid for qid in annotations if qid not in predictions]
    extra = [qid for qid in predictions if qid not in annotations]
    problems = []
    if missing:
        problems.append(f"{len(missing)} question(s) without a prediction (e.g. ids {_some(missing)})")
    if extra:
        problems.append(f"{len(extra)} prediction(s) for questions not annotated (e.g. ids {_some(extra)})")
    if problems:
        raise ValueError("predictions and annotations must cover the same questions: " + "; ".join(problems))


def _some(ids: Sequence[int], limit: int = 5) -> str:
    return ", ".join(str(i) for i in sorted(ids)[:limit])
