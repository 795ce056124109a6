"""Tests for mmtx.data.tokenizer: training, framing, batching, decoding, loading and saving."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from torch import nn

from mmtx.checkpoint import init_from
from mmtx.commands.train import run_tokenizer
from mmtx.data.tokenizer import SPECIAL_TOKENS, Tokenizer, TokenizerError, spellings

CAPTIONS = [
    "A man riding a wave on top of a surfboard.",
    "Two dogs are playing with a frisbee in the park!",
    "A plate of food with broccoli, rice and chicken.",
    "A red double decker bus driving down the street.",
    "A woman holding an umbrella while walking in the rain.",
    "A cat sleeping on a laptop keyboard.",
    "Playing tennis on a sunny day.",
]


@pytest.fixture(scope="module")
def wordpiece() -> Tokenizer:
    return Tokenizer.train(CAPTIONS, vocab_size=200, kind="wordpiece")


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return Tokenizer.train(CAPTIONS, vocab_size=400, kind="bpe", lowercase=False)


# ---------------------------------------------------------------------- training


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_trained_special_tokens_take_ids_0_to_6(kind: str) -> None:
    tok = Tokenizer.train(CAPTIONS, vocab_size=400, kind=kind)  # type: ignore[arg-type]
    ids = [tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id]
    assert ids == list(range(7))
    assert [tok.backend.id_to_token(i) for i in ids] == list(SPECIAL_TOKENS)
    assert tok.special_ids == frozenset(range(7))
    assert tok.vocab_size == tok.backend.get_vocab_size(with_added_tokens=True)


def test_train_rejects_unknown_kind_and_too_small_bpe_vocab() -> None:
    with pytest.raises(ValueError, match="kind"):
        Tokenizer.train(CAPTIONS, kind="unigram")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size=100 is below 263"):
        Tokenizer.train(CAPTIONS, vocab_size=100, kind="bpe")


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_every_process_learns_the_same_vocabulary(kind: str) -> None:
    """Learned in three separate processes (each hashes differently), the vocabulary is the same:
    runs of one seed, and the processes of a distributed run, agree. The texts tie many merges
    (the pairs inside a word are equally frequent)."""
    script = f"""
import random, sys
from mmtx.data.tokenizer import Tokenizer
rng = random.Random(0)
words = "red blue green circle square triangle left right above below isn't café".split()
texts = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(300)]
sys.stdout.write(Tokenizer.train(texts, vocab_size={120 if kind == "wordpiece" else 300}, kind={kind!r}).to_str())
"""
    learned = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
               for _ in range(3)}  # fmt: skip
    assert len(learned) == 1


def test_min_frequency_drops_rare_merges() -> None:
    rare = Tokenizer.train(CAPTIONS, vocab_size=400, kind="bpe", min_frequency=1)
    common = Tokenizer.train(CAPTIONS, vocab_size=400, kind="bpe", min_frequency=3)
    assert common.vocab_size < rare.vocab_size
    assert len(common.encode("surfboard")) > len(rare.encode("surfboard"))


# ---------------------------------------------------------------------- new words for fine-tuning

QUESTIONS = ["How many dogs are there?", "What colour is the bus?", "Is the cat sleeping?", "what colour is it?"]


def test_with_words_adds_the_words_it_spelt_in_pieces_and_keeps_every_id(wordpiece: Tokenizer) -> None:
    grown = wordpiece.with_words(QUESTIONS, min_frequency=2)
    # seen twice and not whole tokens of the captions' vocabulary: "what", "colour", "is", "?"
    added = [grown.backend.id_to_token(i) for i in range(wordpiece.vocab_size, grown.vocab_size)]
    assert added == ["?", "colour", "is", "what"]
    assert grown.vocab_size == wordpiece.vocab_size + 4
    for token, i in wordpiece.backend.get_vocab(with_added_tokens=True).items():
        assert grown.backend.token_to_id(token) == i
    ids = grown.encode("What colour is the bus?", add_special=False)
    assert [grown.backend.id_to_token(i) for i in ids] == ["what", "colour", "is", "the", "bus", "?"]
    assert grown.decode(grown.encode("what colour is the bus?")) == "what colour is the bus?"
    # a new word inside a longer one is not cut out of it, and the vocabulary survives a save
    assert "what" not in [grown.backend.id_to_token(i) for i in grown.encode("somewhat", add_special=False)]
    assert Tokenizer.from_str(grown.to_str()).encode("what is it?") == grown.encode("what is it?")
    # the new tokens and how the old vocabulary spelt them
    spelt = spellings(wordpiece, grown)
    assert sorted(spelt) == list(range(wordpiece.vocab_size, grown.vocab_size))
    assert spelt[grown.backend.token_to_id("what")] == wordpiece.encode("what", add_special=False)
    assert spellings(wordpiece, wordpiece) == {} and spellings(grown, wordpiece) == {}


def test_with_words_leaves_a_complete_or_byte_level_vocabulary_as_it_is(wordpiece: Tokenizer, bpe: Tokenizer) -> None:
    assert wordpiece.with_words(CAPTIONS) is wordpiece  # every caption word is a token already
    assert bpe.with_words(QUESTIONS) is bpe


def test_init_from_reuses_the_checkpoints_tokenizer_unless_adding_words(wordpiece: Tokenizer) -> None:
    start = {"hyper_parameters": {"tokenizer": wordpiece.to_str()}}
    cfg = OmegaConf.create({"init_from": "x.ckpt", "tokenizer": {"path": None, "add_words": False, "min_frequency": 1}})
    assert run_tokenizer(cfg, None, start).to_str() == wordpiece.to_str()
    cfg.tokenizer.add_words = True
    learn = run_tokenizer(cfg, None, start)  # learns from the training text, as the data module calls it
    assert learn(QUESTIONS).vocab_size > wordpiece.vocab_size


def test_init_from_grows_the_vocabulary_rows_as_the_mean_of_the_pieces(wordpiece: Tokenizer) -> None:
    grown = wordpiece.with_words(QUESTIONS)
    torch.manual_seed(0)
    old = nn.ModuleDict(
        {
            "embed": nn.Embedding(wordpiece.vocab_size, 8),
            "head": nn.Linear(8, wordpiece.vocab_size),
            "other": nn.Linear(8, 8),
        }
    )
    new = nn.ModuleDict(
        {"embed": nn.Embedding(grown.vocab_size, 8), "head": nn.Linear(8, grown.vocab_size), "other": nn.Linear(8, 8)}
    )
    spelt = spellings(wordpiece, grown)
    loaded, skipped = init_from(new, {"state_dict": old.state_dict()}, "old.ckpt", new_tokens=spelt)
    assert skipped == [] and set(loaded) == set(new.state_dict())
    V = wordpiece.vocab_size
    for name in ("embed.weight", "head.weight", "head.bias"):
        torch.testing.assert_close(new.state_dict()[name][:V], old.state_dict()[name])
        for i, pieces in spelt.items():
            torch.testing.assert_close(new.state_dict()[name][i], old.state_dict()[name][pieces].mean(0))
    torch.testing.assert_close(new.other.weight, old.other.weight)


# ---------------------------------------------------------------------- round trips


def test_wordpiece_round_trip_lowercases_and_strips_accents(wordpiece: Tokenizer) -> None:
    for caption in CAPTIONS:
        assert wordpiece.decode(wordpiece.encode(caption)) == caption.lower()
    assert wordpiece.decode(wordpiece.encode("A CAFÉ   in the park.")) == "a cafe in the park."


def test_wordpiece_unknown_characters_become_unk(wordpiece: Tokenizer) -> None:
    ids = wordpiece.encode("a 😀 dog", add_special=False)
    assert wordpiece.unk_id in ids
    assert wordpiece.decode(ids) == "a dog"
    assert "[UNK]" in wordpiece.decode(ids, skip_special=False)


def test_bpe_round_trip_is_exact(bpe: Tokenizer) -> None:
    text = "  Zebras\tgrazing\n near a lake — café 😀, 日本!  "
    assert bpe.unk_id not in bpe.encode(text)
    assert bpe.decode(bpe.encode(text)) == text
    lower = Tokenizer.train(CAPTIONS, vocab_size=400, kind="bpe")
    assert lower.decode(lower.encode(text)) == text.lower()


def test_bpe_normalises_to_nfc(bpe: Tokenizer) -> None:
    decomposed = "cafe\u0301"
    assert bpe.normalize(decomposed) == "caf\u00e9"
    assert bpe.encode(decomposed) == bpe.encode("caf\u00e9")


# ---------------------------------------------------------------------- encoding


def test_encode_frames_with_bos_and_eos(wordpiece: Tokenizer) -> None:
    body = wordpiece.encode("a cat sleeping", add_special=False)
    assert len(body) == 3 and not set(body) & wordpiece.special_ids
    assert wordpiece.encode("a cat sleeping") == [wordpiece.bos_id, *body, wordpiece.eos_id]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_special_token_text_in_captions_is_ordinary_text(kind: str) -> None:
    texts = [*CAPTIONS, "[brackets]"]
    tok = Tokenizer.train(texts, vocab_size=400, kind=kind)  # type: ignore[arg-type]
    ids = tok.encode("a [EOS] b [PAD]", add_special=False)
    assert not set(ids) & tok.special_ids
    expected = "a [ eos ] b" if kind == "wordpiece" else "a [eos] b"
    assert tok.decode(tok.encode("a [EOS] b")) == expected


def test_encode_batch_pads_to_longest_and_masks(wordpiece: Tokenizer) -> None:
    texts = ["a cat", "a man riding a wave", ""]
    ids, mask = wordpiece.encode_batch(texts, max_length=64)
    expected = [wordpiece.encode(t) for t in texts]
    longest = max(map(len, expected))
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.shape == mask.shape == (3, longest)
    for row, row_mask, want in zip(ids, mask, expected):
        assert row[: len(want)].tolist() == want
        assert row[len(want) :].eq(wordpiece.pad_id).all()
        assert row_mask.tolist() == [True] * len(want) + [False] * (longest - len(want))


def test_encode_batch_truncation_keeps_eos_last(wordpiece: Tokenizer) -> None:
    long = "a man riding a wave on top of a surfboard"
    ids, mask = wordpiece.encode_batch([long, "a cat"], max_length=5)
    full = wordpiece.encode(long)
    assert ids.shape == (2, 5)
    assert ids[0].tolist() == [*full[:4], wordpiece.eos_id]
    assert mask[0].all()
    assert ids[1].tolist() == wordpiece.encode("a cat") + [wordpiece.pad_id]


def test_encode_batch_rejects_bad_arguments(wordpiece: Tokenizer) -> None:
    with pytest.raises(ValueError, match="max_length"):
        wordpiece.encode_batch(["a cat"], max_length=1)
    with pytest.raises(TypeError, match="single str"):
        wordpiece.encode_batch("a cat", max_length=8)


def test_encode_batch_of_nothing_is_empty(wordpiece: Tokenizer) -> None:
    ids, mask = wordpiece.encode_batch([], max_length=8)
    assert ids.shape == mask.shape == (0, 0)


# ---------------------------------------------------------------------- decoding


def test_decode_stops_at_first_eos_and_accepts_tensors(wordpiece: Tokenizer) -> None:
    ids = wordpiece.encode("a cat") + wordpiece.encode("a dog", add_special=False)
    assert wordpiece.decode(ids) == "a cat"
    assert wordpiece.decode(torch.tensor(ids)) == "a cat"
    assert wordpiece.decode(ids, skip_special=False) == "[BOS] a cat [EOS]"
    assert wordpiece.decode(wordpiece.encode("a cat", add_special=False)) == "a cat"


def test_decode_batch_inverts_encode_batch(wordpiece: Tokenizer) -> None:
    texts = ["a cat sleeping", "two dogs are playing in the park", ""]
    ids, _ = wordpiece.encode_batch(texts, max_length=32)
    assert wordpiece.decode_batch(ids) == texts
    assert wordpiece.decode_batch(ids.tolist()) == texts


def test_decode_rejects_bad_ids(wordpiece: Tokenizer) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        wordpiece.decode([wordpiece.vocab_size])
    with pytest.raises(ValueError, match="1-D"):
        wordpiece.decode(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="2-D"):
        wordpiece.decode_batch(torch.zeros(3, dtype=torch.long))


# ---------------------------------------------------------------------- saving and loading


@pytest.mark.parametrize("target", ["dir", "tok.json"])
def test_save_and_from_file_give_identical_ids(bpe: Tokenizer, tmp_path: Path, target: str) -> None:
    written = bpe.save(tmp_path / target)
    assert written.is_file()
    loaded = Tokenizer.from_file(tmp_path / target)
    assert loaded.vocab_size == bpe.vocab_size and loaded.special_ids == bpe.special_ids
    for caption in CAPTIONS:
        assert loaded.encode(caption) == bpe.encode(caption)


def test_to_str_from_str_and_pickle_round_trip(wordpiece: Tokenizer) -> None:
    for copy in (Tokenizer.from_str(wordpiece.to_str()), pickle.loads(pickle.dumps(wordpiece))):
        assert copy.to_str() == wordpiece.to_str()
        assert [copy.encode(c) for c in CAPTIONS] == [wordpiece.encode(c) for c in CAPTIONS]
        assert copy.encode("a [EOS] b") == wordpiece.encode("a [EOS] b")  # still plain text


BERT_VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_VOCAB += ["hello", "world", "play", "##ing", ",", "!"]


@pytest.fixture
def bert_vocab(tmp_path: Path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text("\r\n".join(BERT_VOCAB) + "\r\n", encoding="utf-8")  # Windows line ends
    return path


def test_bert_vocab_txt_uses_cls_and_sep_as_bos_and_eos(bert_vocab: Path) -> None:
    tok = Tokenizer.from_file(bert_vocab)
    index = {token: i for i, token in enumerate(BERT_VOCAB)}
    assert tok.vocab_size == len(BERT_VOCAB)  # every role found, nothing appended
    assert (tok.pad_id, tok.unk_id, tok.mask_id) == (0, index["[UNK]"], index["[MASK]"])
    assert tok.bos_id == tok.cls_id == index["[CLS]"]
    assert tok.eos_id == tok.sep_id == index["[SEP]"]
    expected = [index[t] for t in ("[CLS]", "hello", "world", "[SEP]")]
    assert tok.encode("Hello World") == expected
    assert tok.decode(expected, skip_special=False) == "[CLS] hello world [SEP]"
    reloaded = Tokenizer.from_str(tok.to_str())
    assert _role_ids(reloaded) == _role_ids(tok) and reloaded.encode("Hello World") == expected


def test_bert_vocab_txt_rejoins_wordpieces(bert_vocab: Path) -> None:
    tok = Tokenizer.from_file(bert_vocab.parent)  # a directory with only vocab.txt
    ids = tok.encode("Hello, playing world!")
    assert tok.backend.id_to_token(ids[3]) == "play" and tok.backend.id_to_token(ids[4]) == "##ing"
    assert tok.decode(ids) == "hello, playing world!"
    assert tok.encode("hello xyz", add_special=False)[-1] == tok.unk_id


def _role_ids(tok: Tokenizer) -> tuple[int, ...]:
    return (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id)


def _train_foreign(special: list[str]) -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CAPTIONS, trainer=trainer)
    return backend


def test_foreign_roberta_style_json_maps_roles_and_ignores_post_processor(tmp_path: Path) -> None:
    backend = _train_foreign(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    backend.enable_truncation(max_length=4)
    size = backend.get_vocab_size()
    backend.save(str(tmp_path / "tokenizer.json"))

    tok = Tokenizer.from_file(tmp_path)
    assert (tok.bos_id, tok.pad_id, tok.eos_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert (tok.cls_id, tok.sep_id) == (0, 2)
    assert tok.vocab_size == size
    ids = tok.encode("a man riding a wave on top of a surfboard")
    assert ids[0] == 0 and ids[-1] == 2 and len(ids) > 6  # framed once, not truncated
    assert 0 not in ids[1:-1] and 2 not in ids[1:-1]
    assert _role_ids(Tokenizer.from_str(tok.to_str())) == _role_ids(tok)


def test_foreign_gpt2_style_json_shares_bos_eos_and_appends_missing_roles(tmp_path: Path) -> None:
    backend = _train_foreign(["<|endoftext|>"])
    size = backend.get_vocab_size()
    path = tmp_path / "gpt2.json"
    path.write_text(backend.to_str(), encoding="utf-8")

    tok = Tokenizer.from_file(path)
    assert tok.bos_id == tok.eos_id == backend.token_to_id("<|endoftext|>")
    appended = [tok.pad_id, tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id]
    assert sorted(appended) == list(range(size, size + 5))
    assert tok.vocab_size == size + 5
    ids = tok.encode("a cat sleeping")
    assert tok.decode(ids + ids) == "a cat sleeping"  # the leading BOS is not mistaken for EOS
    reloaded = Tokenizer.from_str(tok.to_str())  # appended [CLS] must not take over BOS
    assert _role_ids(reloaded) == _role_ids(tok) and reloaded.vocab_size == tok.vocab_size


# ---------------------------------------------------------------------- errors


def test_missing_files_raise_tokenizer_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerError, match=str(missing)):
        Tokenizer.from_file(missing)
    with pytest.raises(TokenizerError, match="no tokenizer.json or vocab.txt"):
        Tokenizer.from_file(tmp_path)
    assert issubclass(TokenizerError, ValueError)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("tokenizer.json", "{not json", "not valid JSON"),
        ("tokenizer.json", '{"model": 3}', "not a valid tokenizer.json"),
        ("vocab.txt", "[PAD]\nhello\n", r"no \[UNK\]"),
        ("vocab.txt", "[UNK]\nhello\nhello\n", "3: duplicate token 'hello'"),
        ("vocab.txt", "[UNK]\n\nhello\n", "2: empty token"),
        ("vocab.txt", b"[UNK]\n\xff\n", "cannot read"),
    ],
)
def test_corrupt_files_raise_tokenizer_error_naming_the_path(
    tmp_path: Path, name: str, content: str | bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TokenizerError, match=message) as info:
        Tokenizer.from_file(path)
    assert str(path) in str(info.value)


def test_from_str_rejects_garbage() -> None:
    with pytest.raises(TokenizerError, match="JSON string"):
        Tokenizer.from_str("")


# ---------------------------------------------------------------------- properties


_WORDPIECE = Tokenizer.train(CAPTIONS, vocab_size=200, kind="wordpiece")
_BPE = Tokenizer.train(CAPTIONS, vocab_size=400, kind="bpe")


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.text())
def test_any_text_encodes_and_decodes(text: str) -> None:
    for tok in (_WORDPIECE, _BPE):
        ids = tok.encode(text)
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert isinstance(tok.decode(ids), str)
    assert _BPE.decode(_BPE.encode(text)) == _BPE.normalize(text)


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(st.lists(st.text(max_size=40), max_size=6), st.integers(min_value=2, max_value=12))
def test_encode_batch_agrees_with_encode(texts: list[str], max_length: int) -> None:
    ids, mask = _BPE.encode_batch(texts, max_length)
    assert ids.shape == mask.shape and ids.shape[0] == len(texts) and ids.shape[1] <= max_length
    for row, row_mask, text in zip(ids, mask, texts):
        full = _BPE.encode(text)
        kept = row[row_mask].tolist()
        assert kept == (full if len(full) <= max_length else [*full[: max_length - 1], _BPE.eos_id])
        assert row[~row_mask].eq(_BPE.pad_id).all()


def test_init_from_names_the_checkpoints_tensors_that_fit_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A learned position table the new model does not have, and a layer of another shape, are
    said in the log (they are left out, not silently dropped)."""
    old = nn.ModuleDict({"keep": nn.Linear(4, 4), "wide": nn.Linear(4, 6)})
    old.register_parameter("pos_table", nn.Parameter(torch.zeros(5, 4)))
    new = nn.ModuleDict({"keep": nn.Linear(4, 4), "wide": nn.Linear(4, 8)})
    caplog.set_level(logging.INFO, logger="mmtx")
    loaded, skipped = init_from(new, {"state_dict": old.state_dict()}, "old.ckpt")
    assert sorted(loaded) == ["keep.bias", "keep.weight"] and sorted(skipped) == ["wide.bias", "wide.weight"]
    said = [r.getMessage() for r in caplog.records if "fit no weight here" in r.getMessage()]
    assert said == ["init_from old.ckpt: 3 of its tensors fit no weight here (pos_table, wide.weight, wide.bias)"]
