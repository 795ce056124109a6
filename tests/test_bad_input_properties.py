"""Property tests: on any JSON, text or bytes, the annotation readers and the tokenizer either load
or raise their own error (AnnotationError / TokenizerError), never anything else.

Documents are drawn as valid files of each format, as such files with a few values replaced by
anything (ids of any size, text with lone surrogates and NUL bytes, file names that climb out of
the root, values of the wrong JSON type) or keys removed, and as arbitrary JSON and bytes.
Whatever loads must be what the training code can use: 64-bit ids, non-empty UTF-8 captions and
questions, image paths inside the image root. Derandomised: the same examples on every run.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmtx.data.annotations import AnnotationError
from mmtx.data.captions import CaptionRecord, read_coco_captions, read_karpathy
from mmtx.data.tokenizer import Tokenizer, TokenizerError
from mmtx.data.vqa import VqaRecord, read_vqa

SETTINGS = settings(
    derandomize=True, database=None, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
INT64 = (-(2**63), 2**63 - 1)

# --- strategies -------------------------------------------------------------------------------

# text as a file can carry it: any code point, lone surrogates included (JSON "\ud800" escapes)
any_text = st.text(st.characters(codec=None, categories=None), max_size=12)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | any_text
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3), max_leaves=8
)


nasty = st.sampled_from([
    None, True, -1, 2**63, -(2**63) - 1, 1.5, "", " ", "x\ud800y", "\udce9", "a\x00b", "a " * 200,
    "../x.jpg", "a/../../x.jpg", "/etc/passwd", "C:\\x.jpg", ".", [], {},
])  # fmt: skip
bad_values = nasty | json_values


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document (the first items of long lists)."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:4]):
            found += _paths(value, (*prefix, i))
    return found


def _mutate(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with 1-3 values replaced by ``bad_values`` or removed."""
    document = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(document)))
        if not path:
            return draw(bad_values)
        node = document
        for key in path[:-1]:
            node = node[key]
        if draw(st.booleans()) and isinstance(node, dict):
            node.pop(path[-1])
        elif isinstance(node, list) and draw(st.booleans()):
            node.append(node[path[-1]])  # a duplicate entry
        else:
            node[path[-1]] = draw(bad_values)
    return document


def near(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Valid documents, valid documents broken in a few places, and any JSON at all."""
    return st.one_of(valid, st.composite(lambda draw: _mutate(draw, draw(valid)))(), json_values)


words = st.sampled_from(["a red circle", "  two  cats ", "caf\u00e9 au lait", "is it raining?"])
unique_ids = st.lists(st.integers(0, 10**6), min_size=1, max_size=5, unique=True)


@st.composite
def valid_coco(draw: st.DrawFn) -> dict[str, Any]:
    image_ids = draw(unique_ids)
    images = [{"id": i, "file_name": f"sub/{i}.jpg"} for i in image_ids]
    annotations = [
        {"id": k, "image_id": draw(st.sampled_from(image_ids)), "caption": draw(words)}
        for k in range(draw(st.integers(0, 6)))
    ]
    return {"info": {}, "images": images, "annotations": annotations}


@st.composite
def valid_karpathy(draw: st.DrawFn) -> dict[str, Any]:
    images = [
        {"cocoid": i, "imgid": k, "filepath": "val2014", "filename": f"{i}.jpg",
         "split": draw(st.sampled_from(["train", "val", "restval"])),
         "sentences": [{"raw": draw(words), "tokens": ["a", "b"]} for _ in range(draw(st.integers(0, 3)))]}
        for k, i in enumerate(draw(unique_ids))
    ]  # fmt: skip
    return {"dataset": "coco", "images": images}


@st.composite
def valid_vqa(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A questions file and its annotations file, about images 1-3 (which exist)."""
    question_ids = draw(unique_ids)
    images = {q: draw(st.integers(1, 3)) for q in question_ids}
    questions = [{"question_id": q, "image_id": images[q], "question": draw(words)} for q in question_ids]
    annotations = [
        {"question_id": q, "image_id": images[q], "answer_type": "other", "question_type": "what",
         "answers": [{"answer": draw(words), "answer_id": k} for k in range(draw(st.integers(1, 3)))]}
        for q in question_ids
    ]  # fmt: skip
    return ({"data_subtype": "val2014", "questions": questions}, {"annotations": annotations})


coco_documents = near(valid_coco())
karpathy_documents = near(valid_karpathy())
vqa_valid = valid_vqa()
question_documents = near(vqa_valid.map(lambda pair: pair[0]))
annotation_documents = near(vqa_valid.map(lambda pair: pair[1]))


@st.composite
def vqa_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    """A consistent questions/annotations pair, then maybe broken in either file."""
    questions, annotations = draw(vqa_valid)
    if draw(st.booleans()):
        questions = _mutate(draw, questions)
    if draw(st.booleans()):
        annotations = _mutate(draw, annotations)
    return questions, annotations


files = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda v: json.dumps(v).encode(), json_values),
    st.just(b"\xef\xbb\xbf{}"), st.just(b'{"images": [{"id": 1, "file_name": "\xe9.jpg"}]}'),
    st.just(b"[" * 5000), st.just(b'{"images": [{"id": 1' + b"1" * 5000 + b'}]}'),
)  # fmt: skip


def _json_file(folder: Path, name: str, document: Any) -> Path:
    path = folder / name
    path.write_text(json.dumps(document), encoding="utf-8")  # ensure_ascii: surrogates as \u escapes
    return path


def _loads_or_annotation_error(read: Callable[[], list]) -> list | None:
    """``read()``'s records, or None when it raised AnnotationError; anything else fails the test."""
    try:
        return read()
    except AnnotationError as err:
        assert str(err).strip()
        return None


def _usable_text(text: str) -> bool:
    return isinstance(text, str) and text == " ".join(text.split()) and text != "" and text.encode("utf-8") != b""


def _check_captions(records: list[CaptionRecord], root: Path) -> None:
    assert [r.image_id for r in records] == sorted({r.image_id for r in records})  # sorted, unique
    for record in records:
        assert type(record.image_id) is int and INT64[0] <= record.image_id <= INT64[1]
        assert record.path.is_relative_to(root) and ".." not in record.path.relative_to(root).parts
        assert "\0" not in str(record.path)
        assert all(_usable_text(c) for c in record.captions), record.captions


def _check_questions(records: list[VqaRecord], root: Path) -> None:
    assert [r.question_id for r in records] == sorted({r.question_id for r in records})
    for record in records:
        assert INT64[0] <= record.question_id <= INT64[1] and record.path.parent == root
        assert _usable_text(record.question) and all(isinstance(a, str) for a in record.answers)
        for answer in record.answers:
            answer.encode("utf-8")


# --- caption readers --------------------------------------------------------------------------


@SETTINGS
@given(document=coco_documents, skipping=st.booleans())
def test_coco_reader_loads_or_raises_annotation_error(document: Any, skipping: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _json_file(folder, "captions.json", document)
        skipped: list[str] | None = [] if skipping else None
        records = _loads_or_annotation_error(lambda: read_coco_captions(path, folder / "images", skipped))
        if records is not None:
            _check_captions(records, folder / "images")
        if skipping and records is not None:  # what was left out is said, each naming the file
            assert all(str(path) in line for line in skipped)


@SETTINGS
@given(document=karpathy_documents, split=st.sampled_from(["train", "val"]), skipping=st.booleans())
def test_karpathy_reader_loads_or_raises_annotation_error(document: Any, split: str, skipping: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _json_file(folder, "dataset.json", document)
        records = _loads_or_annotation_error(lambda: read_karpathy(path, folder, split, [] if skipping else None))
        if records is not None:
            _check_captions(records, folder)


@SETTINGS
@given(content=files, reader=st.sampled_from(["coco", "karpathy", "vqa"]))
def test_readers_on_arbitrary_bytes(content: bytes, reader: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "file.json"
        path.write_bytes(content)
        read = {
            "coco": lambda: read_coco_captions(path, folder, []),
            "karpathy": lambda: read_karpathy(path, folder, "train", []),
            "vqa": lambda: read_vqa(path, None, folder, []),
        }[reader]
        _loads_or_annotation_error(read)


# --- VQA reader -------------------------------------------------------------------------------


@SETTINGS
@given(files=vqa_pairs() | st.tuples(question_documents, annotation_documents | st.none()), skipping=st.booleans())
def test_vqa_reader_loads_or_raises_annotation_error(files: tuple[Any, Any], skipping: bool) -> None:
    questions, annotations = files
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        images = folder / "images"
        images.mkdir()
        for name in ("COCO_val2014_000000000001.jpg", "2.png", "000000000003.jpg", "3.jpg"):  # 3: twice
            (images / name).write_bytes(b"x")
        q = _json_file(folder, "q.json", questions)
        a = None if annotations is None else _json_file(folder, "a.json", annotations)
        records = _loads_or_annotation_error(lambda: read_vqa(q, a, images, [] if skipping else None))
        if records is not None:
            _check_questions(records, images)
            if a is not None:
                assert all(r.answers for r in records)  # a question without answers never loads


# --- tokenizer --------------------------------------------------------------------------------


def _fixed_tokenizer() -> Tokenizer:
    """A small BERT-style tokenizer from a fixed vocabulary (training could order ties differently)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    words = ["a", "red", "circle", "left", "of", "blue", "square", "is", "there", "ball", "?", "##s"]
    vocab = {
        token: i for i, token in enumerate(["[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "[CLS]", "[SEP]", *words])
    }
    backend = Backend(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return Tokenizer(backend)


_TOKENIZER = _fixed_tokenizer()
_TOKENIZER_JSON = json.loads(_TOKENIZER.to_str())
tokenizer_documents = near(st.just(_TOKENIZER_JSON))


@SETTINGS
@given(document=tokenizer_documents)
def test_tokenizer_from_json_loads_or_raises_tokenizer_error(document: Any) -> None:
    try:
        tokenizer = Tokenizer.from_str(json.dumps(document))
    except TokenizerError as err:
        assert str(err).startswith("<tokenizer JSON string>")
        return
    ids = tokenizer.encode("a red circle")  # whatever loads has the special roles and encodes
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert all(0 <= i < tokenizer.vocab_size for i in ids)


@SETTINGS
@given(
    content=files | st.builds(lambda s: s.encode("utf-8", "surrogatepass"), any_text),
    suffix=st.sampled_from([".json", ".txt"]),
)
def test_tokenizer_file_loads_or_raises_tokenizer_error(content: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"tokenizer{suffix}"
        path.write_bytes(content)
        try:
            Tokenizer.from_file(path)
        except TokenizerError as err:
            assert str(path) in str(err)


@SETTINGS
@given(texts=st.lists(any_text | st.sampled_from(["[EOS]", "\x00", "\ud800", "a" * 500]), min_size=1, max_size=4))
def test_tokenizer_encodes_any_text_or_raises_tokenizer_error(texts: list[str]) -> None:
    for text in texts:
        try:
            ids = _TOKENIZER.encode(text)
        except TokenizerError as err:
            assert "not valid Unicode" in str(err)
            continue
        assert ids[0] == _TOKENIZER.bos_id and ids[-1] == _TOKENIZER.eos_id
    try:
        ids, mask = _TOKENIZER.encode_batch(texts, max_length=8)
    except TokenizerError as err:
        assert "not valid Unicode" in str(err)
        return
    assert ids.shape == mask.shape and ids.shape[0] == len(texts) and ids.shape[1] <= 8


def test_the_strategies_reach_the_good_and_the_bad_paths() -> None:
    """The property tests are only as good as their examples: both outcomes must be drawn often."""
    outcomes = {"loaded": 0, "refused": 0}

    @settings(derandomize=True, max_examples=150, deadline=None, database=None)
    @given(document=coco_documents)
    def count(document: Any) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = _json_file(Path(tmp), "c.json", document)
            records = _loads_or_annotation_error(lambda: read_coco_captions(path, Path(tmp)))
            outcomes["loaded" if records else "refused"] += 1

    count()
    assert outcomes["loaded"] >= 30 and outcomes["refused"] >= 30, outcomes
