"""Official VQA accuracy: each normalisation rule, leave-one-out scoring worked out by hand, the
official conditional normalisation, rounding, soft targets and the answer vocabulary, and a
cross-check against an independent transcription of vqaEval.py's formulas."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmtx.metrics.vqa import (
    build_answer_vocab,
    normalize_answer,
    question_accuracy,
    reference_answers,
    soft_scores,
    vqa_accuracy,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # number words become digits, whole words only; "none" counts as zero
        ("two", "2"),
        ("Two", "2"),
        ("none", "0"),
        ("zero", "0"),
        ("ten", "10"),
        ("eleven", "eleven"),
        ("one dog", "1 dog"),
        ("someone", "someone"),
        # articles are dropped as whole words
        ("the cat", "cat"),
        ("a dog", "dog"),
        ("an apple", "apple"),
        ("a", ""),
        ("theater", "theater"),
        # punctuation next to a space is removed, elsewhere it becomes a space
        ("yes!", "yes"),
        ("why?", "why"),
        ("red, white", "red white"),
        ("red,white", "red white"),
        ("t-shirt", "t shirt"),
        ("black / white", "black white"),
        ("black/white", "black white"),
        ("(red)", "red"),
        # ...judged on the text as given: " (" occurs, ") " and " )" do not, so ")" becomes a space
        ("red (dark)", "red dark"),
        # apostrophes, colons and other symbols are kept
        ("don't", "don't"),
        ("10:30", "10:30"),
        ("#1", "#1"),
        ("50%", "50%"),
        # a digit-comma-digit anywhere glues every punctuation mark, not just that comma
        ("1,000", "1000"),
        ("1,000 dogs, cats", "1000 dogs cats"),
        ("red-white 1,5", "redwhite 15"),
        # periods go unless a digit follows them
        ("3.5", "3.5"),
        (".5", ".5"),
        ("5.", "5"),
        ("yes.", "yes"),
        ("U.S.A.", "usa"),
        ("mr. smith", "mr smith"),
        ("v1.2.3", "v1.2.3"),
        # missing apostrophes are restored after lowercasing; the table's capitalised keys never match
        ("dont", "don't"),
        ("Dont", "don't"),
        ("isnt", "isn't"),
        ("youre", "you're"),
        ("cant", "can't"),
        ("twas", "'twas"),
        ("somebody'd", "somebodyd"),
        ("Im", "im"),
        # whitespace: tabs and newlines, outer and repeated spaces
        ("  yes\n", "yes"),
        ("red\tball", "red ball"),
        ("two  dogs", "2 dogs"),
        ("The Two Dogs!", "2 dogs"),
    ],
)
def test_normalize_answer_follows_each_official_rule(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_at_most_32_periods_are_removed_like_the_official_call() -> None:
    # vqaEval.py passes re.UNICODE (= 32) as re.sub's count
    assert normalize_answer("." * 40 + "x") == "." * 8 + "x"


def test_accuracy_is_averaged_over_leave_one_out_subsets() -> None:
    eight_three_two_two = ["3"] * 8 + ["2"] * 2
    # "2": the 8 subsets without a "3" hold both "2"s -> 2/3; the 2 without a "2" hold one -> 1/3
    #      (8 * 2/3 + 2 * 1/3) / 10 = 0.6
    assert question_accuracy("2", eight_three_two_two) == pytest.approx(0.6)
    # "3": every subset holds at least 7 "3"s -> 1
    assert question_accuracy("3", eight_three_two_two) == 1.0
    assert question_accuracy("4", eight_three_two_two) == 0.0
    # three matches: (7 subsets * 1 + 3 subsets * 2/3) / 10 = 0.9; one: (9 * 1/3 + 1 * 0) / 10 = 0.3
    assert question_accuracy("2", ["2"] * 3 + ["5"] * 7) == pytest.approx(0.9)
    assert question_accuracy("2", ["2"] + ["5"] * 9) == pytest.approx(0.3)
    # four matches leave at least 3 in every subset
    assert question_accuracy("2", ["2"] * 4 + ["5"] * 6) == 1.0
    # fewer than ten answers: averaged over as many subsets as there are answers, (2 * 1/3 + 0) / 3
    assert question_accuracy("a cat", ["cat", "dog", "dog"]) == pytest.approx(2 / 9)


def test_answers_are_normalised_only_when_annotators_disagree() -> None:
    unanimous = ["2"] * 10
    assert question_accuracy("2", unanimous) == 1.0
    assert question_accuracy(" 2\n", unanimous) == 1.0  # tabs, newlines and outer spaces always go
    assert question_accuracy("two", unanimous) == 0.0  # but nothing else: the official rule
    assert question_accuracy("2.", unanimous) == 0.0

    words_and_digits = ["two"] * 5 + ["2"] * 5  # differ -> all normalised to "2"
    assert reference_answers(words_and_digits) == ["2"] * 10
    assert question_accuracy("TWO!", words_and_digits) == 1.0
    assert question_accuracy("Yes", ["yes"] * 9 + ["Yes"]) == 1.0  # "Yes" != "yes": normalised
    assert reference_answers(["Yes "] * 10) == ["Yes"] * 10


@dataclass(frozen=True)
class _Annotation:
    answers: tuple[str, ...]
    answer_type: str | None


def test_vqa_accuracy_reports_percent_overall_and_per_answer_type() -> None:
    annotations: dict[int, Any] = {
        1: _Annotation(("yes",) * 10, "yes/no"),  # a record-like object
        2: {
            "answers": [{"answer": a, "answer_id": k} for k, a in enumerate(["3"] * 8 + ["2"] * 2)],
            "answer_type": "number",
        },  # an official annotation dict
        3: {"answers": ["red"] * 10, "answer_type": "other"},  # answers as plain strings
        4: _Annotation(("no",) * 6 + ("yes",) * 4, "yes/no"),
    }
    predictions = {1: "yes", 2: "2", 3: "blue", 4: "yes"}
    # per question: 1.0, 0.6, 0.0, 1.0 (four "yes" leave at least 3 in every subset)
    assert vqa_accuracy(predictions, annotations) == {
        "accuracy": 65.0,
        "yes/no": 100.0,
        "number": 60.0,
        "other": 0.0,
    }
    # an answer type without questions is left out, as in the official perAnswerType
    only_yes_no = {1: annotations[1], 4: annotations[4]}
    assert vqa_accuracy({1: "no", 4: "no"}, only_yes_no) == {"accuracy": 50.0, "yes/no": 50.0}
    # non-standard types come after the official ones; a missing type counts only overall
    mixed = {1: {"answers": ["x"] * 4, "answer_type": "ocr"}, 2: {"answers": ["y"] * 4}}
    assert vqa_accuracy({1: "x", 2: "z"}, mixed) == {"accuracy": 50.0, "ocr": 100.0}


def test_vqa_accuracy_rounds_like_python_2() -> None:
    # one right answer in 32 questions is exactly 3.125 %: Python 2.7's round (the official
    # script's) gives 3.13; Python 3's round would give 3.12
    annotations = {i: {"answers": ["yes"] * 10, "answer_type": "yes/no"} for i in range(32)}
    predictions = {i: "yes" if i == 0 else "no" for i in range(32)}
    assert vqa_accuracy(predictions, annotations)["accuracy"] == 3.13
    assert vqa_accuracy(predictions, annotations, ndigits=None)["accuracy"] == 3.125
    annotations[32] = {"answers": ["no"] * 10, "answer_type": "yes/no"}
    predictions[32] = "no"
    assert vqa_accuracy(predictions, annotations)["accuracy"] == 6.06  # 200 / 33 = 6.0606...


def test_vqa_accuracy_rejects_mismatched_or_malformed_input() -> None:
    annotations = {1: {"answers": ["yes"] * 10}, 2: {"answers": ["no"] * 10}}
    with pytest.raises(ValueError, match=r"1 question\(s\) without a prediction \(e.g. ids 2\)"):
        vqa_accuracy({1: "yes"}, annotations)
    with pytest.raises(ValueError, match=r"not annotated \(e.g. ids 7\)"):
        vqa_accuracy({1: "yes", 2: "no", 7: "no"}, annotations)
    with pytest.raises(ValueError, match="no annotations"):
        vqa_accuracy({}, {})
    with pytest.raises(TypeError, match="question 2"):
        vqa_accuracy({1: "yes", 2: None}, annotations)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="question 5: expected a list of answers"):
        vqa_accuracy({5: "yes"}, {5: {"answers": []}})
    with pytest.raises(ValueError, match="question 5: missing key 'answers'"):
        vqa_accuracy({5: "yes"}, {5: {"multiple_choice_answer": "yes"}})
    with pytest.raises(ValueError, match="question 5: expected answer strings"):
        vqa_accuracy({5: "yes"}, {5: {"answers": [{"answer_id": 1}]}})


def test_soft_scores_are_the_accuracy_of_each_answer() -> None:
    answers = ["3"] * 6 + ["three", "2", "Two", "4"]  # normalised: 7 x "3", 2 x "2", 1 x "4"
    assert soft_scores(answers) == pytest.approx({"3": 1.0, "2": 0.6, "4": 0.3})
    assert list(soft_scores(answers)) == ["3", "2", "4"]  # order of first appearance
    assert soft_scores(["Yes"] * 10) == {"Yes": 1.0}  # unanimous: kept as typed, like the evaluation
    for answer, score in soft_scores(answers).items():
        assert question_accuracy(answer, answers) == score


def test_answer_vocab_orders_by_count_then_alphabetically() -> None:
    questions = [
        ["yes"] * 10,
        ["no"] * 6 + ["yes"] * 4,
        ["two"] * 5 + ["2"] * 3 + ["3"] * 2,  # normalised: 8 x "2", 2 x "3"
        ["red"] * 8 + ["blue"] * 2,
        ["Blue"] * 10,  # unanimous, so kept as typed: a class of its own
    ]
    # counts: yes 14, Blue 10, 2 8, red 8, no 6, 3 2, blue 2
    assert build_answer_vocab(questions, size=10) == ["yes", "Blue", "2", "red", "no", "3", "blue"]
    assert build_answer_vocab(questions, size=3) == ["yes", "Blue", "2"]
    assert build_answer_vocab(questions, size=10, min_count=8) == ["yes", "Blue", "2", "red"]
    assert build_answer_vocab(iter(questions), size=2) == ["yes", "Blue"]  # any iterable, read once
    for bad in ({"size": 0}, {"size": 2, "min_count": 0}, {"size": True}):
        with pytest.raises(ValueError, match="size|min_count"):
            build_answer_vocab(questions, **bad)


# ---- cross-check against vqaEval.py's formulas, transcribed independently ------------------
# Transcribed from the official script (GT-Vision-Lab/VQA master): the same punctuation list and
# regexes (including the no-op "(?!<=\d)" and re.UNICODE passed as the count), the number map,
# the articles, and of the contraction table the two entries the generated answers can contain.
_OFFICIAL_PUNCT = [
    ";",
    r"/",
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
]
_OFFICIAL_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_OFFICIAL_COMMA = re.compile(r"(\d)(\,)(\d)")
_OFFICIAL_NUMBERS = {
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
_OFFICIAL_CONTRACTIONS = {"dont": "don't", "isnt": "isn't"}


def _official_punctuation(text: str) -> str:
    out = text
    for p in _OFFICIAL_PUNCT:
        if (p + " " in text or " " + p in text) or _OFFICIAL_COMMA.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _OFFICIAL_PERIOD.sub("", out, count=re.UNICODE)


def _official_digit_article(text: str) -> str:
    words = [_OFFICIAL_NUMBERS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in ("a", "an", "the")]
    return " ".join(_OFFICIAL_CONTRACTIONS.get(w, w) for w in words)


def _official_question_accuracy(prediction: str, answers: list[str]) -> float:
    gts = [{"answer": a, "answer_id": k + 1} for k, a in enumerate(answers)]
    for d in gts:
        d["answer"] = str(d["answer"]).replace("\n", " ").replace("\t", " ").strip()
    res = prediction.replace("\n", " ").replace("\t", " ").strip()
    if len({d["answer"] for d in gts}) > 1:
        for d in gts:
            d["answer"] = _official_digit_article(_official_punctuation(str(d["answer"])))
        res = _official_digit_article(_official_punctuation(res))
    accs = []
    for held_out in gts:
        others = [d for d in gts if d != held_out]
        accs.append(min(1, float(len([d for d in others if d["answer"] == res])) / 3))
    return float(sum(accs)) / len(accs)


_TOKENS = [
    "yes",
    "Yes",
    "no",
    "2",
    "two",
    "Two",
    "1,000",
    "1000",
    "3.5",
    "the",
    "a",
    "dog",
    "dogs",
    "dont",
    "don't",
    "isnt",
    ",",
    ".",
    "!",
    "-",
    "(",
    ")",
    "/",
    ":",
    " ",
    "\n",
    "\t",
]
_ANSWER_TEXT = st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=4).map("".join)


@st.composite
def _question(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A prediction and 1-10 answers drawn from a few strings, so that they often match."""
    pool = draw(st.lists(_ANSWER_TEXT, min_size=1, max_size=3))
    answers = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=10))
    prediction = draw(st.one_of(st.sampled_from(pool), _ANSWER_TEXT))
    return prediction, answers


@settings(derandomize=True, max_examples=400, deadline=None)
@given(_question())
def test_matches_the_official_formulas_exactly(question: tuple[str, list[str]]) -> None:
    prediction, answers = question
    expected = _official_question_accuracy(prediction, answers)
    assert question_accuracy(prediction, answers) == expected  # the same float, not just close
    annotations = {7: {"answers": answers, "answer_type": "other"}}
    assert vqa_accuracy({7: prediction}, annotations, ndigits=None)["accuracy"] == 100 * expected
    for answer, score in soft_scores(answers).items():
        assert score == _official_question_accuracy(answer, answers)
