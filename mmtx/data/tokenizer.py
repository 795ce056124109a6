"""Caption tokenizer: a thin wrapper over Hugging Face ``tokenizers``.

The wrapper pins down what the rest of mmtx relies on: seven special tokens
with fixed roles, ``[BOS] ... [EOS]`` framing by a post-processor of ours
(a file's own is replaced, so foreign files behave the same as ours), padded and
truncated batches as tensors (the library's padding and truncation), and decoding
that stops at the first ``[EOS]``. Special ids only ever come from that framing
and padding: a literal ``"[SEP]"`` inside a caption is tokenised as ordinary text.

Special-token roles of a loaded file are resolved by name from ``_ROLE_CANDIDATES`` below,
first match wins (a BERT vocabulary's ``[CLS]``/``[SEP]`` are BOS/EOS, as in Hugging Face's
``VisionEncoderDecoder``). A role with no candidate in the vocabulary gets its canonical token
appended as a new special token, so every role's id (``pad_id``, ``bos_id``, ...) is valid and
counted by ``vocab_size``. The candidate order keeps this stable: reloading a saved tokenizer
resolves every role to the same id even though appended tokens (say ``[CLS]``) are then in the file.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import tokenizers
import torch
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from mmtx.config_error import ArgumentError

__all__ = ["SPECIAL_TOKENS", "Tokenizer", "TokenizerError", "spellings"]

PAD, BOS, EOS, UNK, MASK, CLS, SEP = SPECIAL_TOKENS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "[CLS]", "[SEP]")

# Role -> token names that may fill it in a foreign vocabulary, in priority order.
_ROLE_CANDIDATES: dict[str, tuple[str, ...]] = {
    PAD: (PAD, "<pad>"),
    BOS: (BOS, "<s>", "<bos>", "<|endoftext|>", CLS),
    EOS: (EOS, "</s>", "<eos>", "<|endoftext|>", SEP),
    UNK: (UNK, "<unk>"),
    MASK: (MASK, "<mask>"),
    CLS: (CLS, "<s>", "<cls>"),
    SEP: (SEP, "</s>", "<sep>"),
}

# Byte-level BPE needs every byte in its alphabet, on top of the special tokens.
_BYTE_ALPHABET_SIZE = 256

IdsLike = Sequence[int] | torch.Tensor


class TokenizerError(ValueError):
    """A tokenizer file or string is missing, malformed or unusable."""


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with fixed special-token roles and tensor batching.

    Build one with :meth:`train`, :meth:`from_file` or :meth:`from_str`. The constructor takes
    any backend and adapts it in place as the module docstring describes (``to_str`` and saved
    files then carry our post-processor). Instances pickle, for DataLoader workers.
    """

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        # Batches get their own truncation and padding (`encode_batch`); a file's would fight that.
        backend.no_truncation()
        backend.no_padding()
        # Text is always text: a caption containing "[EOS]" must not end the sequence.
        backend.encode_special_tokens = True
        vocab = backend.get_vocab(with_added_tokens=True)
        ids: dict[str, int] = {}
        for role, candidates in _ROLE_CANDIDATES.items():
            token = next((c for c in candidates if c in vocab), role)
            # Registers the token as special (skipped on decode, never split);
            # appends it to the vocabulary only when it is missing.
            backend.add_special_tokens([token])
            token_id = backend.token_to_id(token)
            assert token_id is not None, token
            ids[role] = token_id
        bos, eos = backend.id_to_token(ids[BOS]), backend.id_to_token(ids[EOS])
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", special_tokens=list({bos: ids[BOS], eos: ids[EOS]}.items())
        )
        self._backend = backend
        self._ids = ids
        self.pad_id, self.bos_id, self.eos_id, self.unk_id, self.mask_id, self.cls_id, self.sep_id = (
            ids[role] for role in SPECIAL_TOKENS
        )
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._batch_backends: dict[int, tokenizers.Tokenizer] = {}  # by max_length

    # ------------------------------------------------------------------ building

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        kind: Literal["wordpiece", "bpe"] = "wordpiece",
        min_frequency: int = 1,
        lowercase: bool = True,
    ) -> Tokenizer:
        """Learn a vocabulary from ``texts``; special tokens get ids 0..6, in order.

        ``wordpiece`` is BERT-style (BERT normaliser and pre-tokenizer, ``##``
        continuation pieces); like BERT it decodes "isn't" as "isn ' t". ``bpe`` is GPT-2-style byte-level BPE: NFC
        normalisation (plus lowercasing when asked) and no unknown tokens, so
        ``decode(encode(x)) == normalize(x)`` exactly.
        """
        continuing: list[str] = []
        if kind == "wordpiece":
            backend = tokenizers.Tokenizer(models.WordPiece(unk_token=UNK))
            backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
            backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            backend.decoder = decoders.WordPiece()
            # The trainer gives each continuing character ("##e") its id in hash-map order, and
            # ties between equally frequent merges go by id, so two runs (or two processes) could
            # learn different vocabularies from the same text. Listed after the special tokens,
            # they get fixed ids in sorted order, and the whole vocabulary is learned the same
            # every time; they are ordinary tokens again below.
            texts = list(texts)
            characters = {c for text in texts for c in backend.normalizer.normalize_str(text) if not c.isspace()}
            continuing = [f"##{c}" for c in sorted(characters)]
            trainer: trainers.Trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=[*SPECIAL_TOKENS, *continuing],
                show_progress=False,
            )
        elif kind == "bpe":
            minimum = len(SPECIAL_TOKENS) + _BYTE_ALPHABET_SIZE
            if vocab_size < minimum:
                raise ArgumentError(
                    f"{{vocab_size}} is below {minimum}, the smallest byte-level BPE vocabulary "
                    f"({len(SPECIAL_TOKENS)} special tokens + {_BYTE_ALPHABET_SIZE} bytes)",
                    vocab_size=vocab_size,
                )
            backend = tokenizers.Tokenizer(models.BPE())
            backend.normalizer = (
                normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]) if lowercase else normalizers.NFC()
            )
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=list(SPECIAL_TOKENS),
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            )
        else:
            raise ArgumentError("{kind!r} is not one of wordpiece, bpe", kind=kind)
        backend.train_from_iterator(texts, trainer=trainer)
        if continuing:  # the continuing characters were special only to fix their ids
            saved = json.loads(backend.to_str())
            ordinary = set(continuing)
            saved["added_tokens"] = [t for t in saved["added_tokens"] if t["content"] not in ordinary]
            backend = tokenizers.Tokenizer.from_str(json.dumps(saved))
        return cls(backend)

    def with_words(self, texts: Iterable[str], min_frequency: int = 1) -> Tokenizer:
        """This tokenizer plus, appended as tokens of their own, the words of ``texts`` (seen at
        least ``min_frequency`` times) that it can only spell in pieces or as ``[UNK]``; every
        existing id keeps its meaning.

        For fine-tuning on text the vocabulary was not learnt from (a VQA task's questions after
        pretraining on captions), as Hugging Face's ``add_tokens`` + ``resize_token_embeddings``:
        `mmtx.checkpoint.init_from` grows the checkpoint's embeddings by the new rows, each the
        mean of its pieces' (`spellings`). A WordPiece vocabulary only; a byte-level BPE one is
        returned as it is (its pieces are bytes: the new words' boundaries would be lost).
        """
        if not isinstance(self._backend.model, models.WordPiece):
            return self
        normalizer, pre_tokenizer = self._backend.normalizer, self._backend.pre_tokenizer
        counts: Counter[str] = Counter()
        for text in texts:
            text = normalizer.normalize_str(text) if normalizer else text
            counts.update([w for w, _ in pre_tokenizer.pre_tokenize_str(text)] if pre_tokenizer else text.split())
        vocab = self._backend.get_vocab(with_added_tokens=True)
        words = sorted(w for w, n in counts.items() if n >= min_frequency and w not in vocab)
        if not words:
            return self
        backend = tokenizers.Tokenizer.from_str(self._backend.to_str())
        # single_word: "how" is a token, the "how" inside "show" is not; punctuation stands alone anyway
        backend.add_tokens([tokenizers.AddedToken(w, single_word=w.isalnum(), normalized=True) for w in words])
        return Tokenizer(backend)

    @classmethod
    def from_file(cls, path: str | Path, *, lowercase: bool | None = None) -> Tokenizer:
        """Load a ``tokenizer.json``, a BERT ``vocab.txt``, or GPT-2's ``vocab.json`` with the
        ``merges.txt`` beside it (chosen by the file name: ``vocab.json``, else ``*.txt``, else JSON).

        A directory means its ``tokenizer.json``, else its ``vocab.txt``, else its
        ``vocab.json`` + ``merges.txt`` (the files of a Hugging Face model directory).
        ``lowercase`` applies only to ``vocab.txt`` (uncased vs cased BERT); by default it is
        the ``do_lower_case`` of a ``tokenizer_config.json`` beside it, else True. The other
        formats carry their own normalisation.
        """
        path = Path(path)
        if path.is_dir():
            for name in ("tokenizer.json", "vocab.txt", "vocab.json"):
                if (path / name).is_file():
                    path = path / name
                    break
            else:
                raise TokenizerError(
                    f"{path}: directory has no tokenizer.json or vocab.txt (nor GPT-2's vocab.json + merges.txt)"
                )
        if not path.is_file():
            raise TokenizerError(f"{path}: tokenizer file not found")
        if path.name == "vocab.json":
            return cls._from_bpe_files(path, path.with_name("merges.txt"))
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TokenizerError(f"{path}: cannot read tokenizer file ({err})") from err
        if path.suffix == ".txt":
            if lowercase is None:
                lowercase = _do_lower_case(path.with_name("tokenizer_config.json"))
            return cls._from_vocab_txt(text, path, lowercase=lowercase)
        return cls._from_json(text, source=str(path))

    @classmethod
    def from_str(cls, text: str) -> Tokenizer:
        """Rebuild a tokenizer from :meth:`to_str` output (or any ``tokenizer.json`` text)."""
        return cls._from_json(text, source="<tokenizer JSON string>")

    @classmethod
    def _from_json(cls, text: str, source: str) -> Tokenizer:
        try:
            json.loads(text)  # A clearer message than the library's for non-JSON input.
        except (ValueError, RecursionError) as err:  # also: nested too deeply, a 5000-digit number
            raise TokenizerError(f"{source}: not valid JSON ({err})") from err
        try:
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as err:  # The library raises plain Exception.
            raise TokenizerError(f"{source}: not a valid tokenizer.json ({err})") from err
        tokenizer = cls(backend)
        _check_usable(tokenizer, source)
        return tokenizer

    @classmethod
    def _from_vocab_txt(cls, text: str, path: Path, lowercase: bool) -> Tokenizer:
        """Build BERT's WordPiece tokenizer from a one-token-per-line vocabulary.

        Read here, not by ``WordPiece.from_file``: that keeps the last of two equal tokens
        without a word and cannot name the line of an empty one, and either would shift ids.
        """
        # Split on "\n" only, like BERT: vocabularies hold tokens such as "\x85".
        lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
        vocab: dict[str, int] = {}
        for line_no, token in enumerate(lines, 1):
            if not token:
                raise TokenizerError(f"{path}:{line_no}: empty token in vocab.txt")
            if token in vocab:
                raise TokenizerError(f"{path}:{line_no}: duplicate token {token!r} in vocab.txt")
            vocab[token] = line_no - 1
        if UNK not in vocab:
            raise TokenizerError(f"{path}: vocab.txt has no {UNK} token")
        backend = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK))
        backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        return cls(backend)

    @classmethod
    def _from_bpe_files(cls, vocab_path: Path, merges_path: Path) -> Tokenizer:
        """GPT-2's byte-level BPE from its ``vocab.json`` and ``merges.txt``."""
        if not merges_path.is_file():
            raise TokenizerError(f"{vocab_path}: no merges.txt beside it (GPT-2's BPE needs both files)")
        try:
            model = models.BPE.from_file(str(vocab_path), str(merges_path))
        except Exception as err:  # The library raises plain Exception.
            raise TokenizerError(f"{vocab_path}, {merges_path}: not a valid BPE vocabulary ({err})") from err
        backend = tokenizers.Tokenizer(model)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        return cls(backend)

    # ------------------------------------------------------------------ saving

    def to_str(self) -> str:
        """Serialise to ``tokenizer.json`` text, e.g. to store inside a checkpoint."""
        return self._backend.to_str()

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json``; a path not ending in ``.json`` is a directory to write it in.

        Returns the file written.
        """
        path = Path(path)
        if path.suffix != ".json":
            path = path / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_str(), encoding="utf-8")
        return path

    # ------------------------------------------------------------------ properties

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids, special and added tokens included (the embedding size)."""
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the seven role tokens (fewer if a file maps two roles to one token)."""
        return frozenset(self._ids.values())

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # Rebuild through __init__: the backend's own pickle state is its JSON,
        # which drops settings made here (encode_special_tokens).
        return Tokenizer.from_str, (self.to_str(),)

    def __repr__(self) -> str:
        model = type(self._backend.model).__name__
        return f"Tokenizer({model}, vocab_size={self.vocab_size})"

    # ------------------------------------------------------------------ encoding

    def normalize(self, text: str) -> str:
        """``text`` after the normaliser (what an exact round trip gives back)."""
        normalizer = self._backend.normalizer
        return text if normalizer is None else normalizer.normalize_str(text)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text``, framed as ``[BOS] ... [EOS]`` when ``add_special``."""
        with _naming_invalid_unicode([text]):
            return self._backend.encode(text, add_special_tokens=add_special).ids

    def encode_batch(self, texts: Sequence[str], max_length: int) -> tuple[torch.LongTensor, torch.BoolTensor]:
        """Padded ``[BOS] ... [EOS]`` ids (B, T) and a mask that is True on real tokens.

        T is the longest sequence in the batch, capped at ``max_length``; a
        truncated sequence still ends in ``[EOS]``.
        """
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 to hold [BOS] and [EOS], got {max_length}")
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a sequence of strings, got a single str")
        with _naming_invalid_unicode(texts):
            encodings = self._batch_backend(max_length).encode_batch_fast(list(texts))
        width = len(encodings[0].ids) if encodings else 0
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long).reshape(len(encodings), width)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.bool).reshape(len(encodings), width)
        return ids, mask  # type: ignore[return-value]

    def _batch_backend(self, max_length: int) -> tokenizers.Tokenizer:
        """A copy of the backend that truncates to ``max_length`` (the framing kept: the text is
        cut, then framed) and pads each batch to its longest sequence."""
        if max_length not in self._batch_backends:
            backend = tokenizers.Tokenizer.from_str(self._backend.to_str())
            backend.encode_special_tokens = True
            backend.enable_truncation(max_length)
            backend.enable_padding(pad_id=self.pad_id, pad_token=backend.id_to_token(self.pad_id))
            self._batch_backends[max_length] = backend
        return self._batch_backends[max_length]

    # ------------------------------------------------------------------ decoding

    def decode(self, ids: IdsLike, skip_special: bool = True) -> str:
        """Text of ``ids`` (a list or a 1-D tensor), stopping at the first ``[EOS]``.

        A leading ``[BOS]`` is not taken for that ``[EOS]``, so tokenizers
        whose BOS and EOS are one token (GPT-2) decode correctly.
        """
        ids = self._until_eos(ids, skip_special)
        return self._backend.decode(ids, skip_special_tokens=skip_special)

    def decode_batch(self, ids: Sequence[IdsLike] | torch.Tensor, skip_special: bool = True) -> list[str]:
        """:meth:`decode` for each row of a (B, T) tensor or a list of id sequences."""
        if isinstance(ids, torch.Tensor) and ids.dim() != 2:
            raise ValueError(f"decode_batch expects a 2-D tensor, got shape {tuple(ids.shape)}")
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        rows = [self._until_eos(row, skip_special) for row in ids]
        return self._backend.decode_batch(rows, skip_special_tokens=skip_special)

    def _until_eos(self, ids: IdsLike, skip_special: bool) -> list[int]:
        """``ids`` as a checked list, cut at the first EOS (kept only when not skipping)."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode expects a 1-D tensor, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = list(map(int, ids))
        if ids and (min(ids) < 0 or max(ids) >= self._vocab_size):
            bad = min(ids) if min(ids) < 0 else max(ids)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self._vocab_size})")
        start = 1 if ids[:1] == [self.bos_id] else 0
        try:
            end = ids.index(self.eos_id, start)
        except ValueError:
            return ids
        return ids[: end if skip_special else end + 1]


def _do_lower_case(config_path: Path) -> bool:
    """A Hugging Face ``tokenizer_config.json``'s ``do_lower_case`` (True if absent)."""
    if not config_path.is_file():
        return True
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TokenizerError(f"{config_path}: cannot read ({err})") from err
    return bool(config.get("do_lower_case", True)) if isinstance(config, dict) else True


@contextmanager
def _naming_invalid_unicode(texts: Sequence[str]) -> Iterator[None]:
    """Turn the library's TypeError for a text that cannot cross into it, one with a lone
    surrogate ("\ud800"), into a TokenizerError that names the text and the character."""
    try:
        yield
    except TypeError as err:
        for k, text in enumerate(texts):
            if not isinstance(text, str):
                break  # not a string at all: the library's TypeError says so
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as bad:
                raise TokenizerError(
                    f"text {k} is not valid Unicode: lone surrogate "
                    f"U+{ord(text[bad.start]):04X} at character {bad.start}"
                ) from err
        raise


_PROBE = "A red Circle, 3 \u00e9t\u00e9s \u2603 \u4e2d [UNK] ##x"  # unknown characters included


def _check_usable(tokenizer: Tokenizer, source: str) -> None:
    """Refuse a tokenizer.json that loads but cannot work: one whose model fails on text it
    does not know (say WordPiece without its unknown token), or whose ids run past the
    vocabulary (the embedding table would be indexed out of range)."""
    try:
        tokenizer.backend.encode(_PROBE, add_special_tokens=False)
    except Exception as err:  # The library raises plain Exception.
        raise TokenizerError(f"{source}: the tokenizer cannot encode text ({err})") from err
    top = max(tokenizer.backend.get_vocab(with_added_tokens=True).values())
    if top >= tokenizer.vocab_size:
        raise TokenizerError(
            f"{source}: token ids are not contiguous (id {top} in a vocabulary of {tokenizer.vocab_size})"
        )


def spellings(old: Tokenizer, new: Tokenizer) -> dict[int, list[int]]:
    """For each id of ``new`` beyond ``old``'s vocabulary, the ids ``old`` spells that token with;
    empty when ``new`` does not extend ``old`` (`Tokenizer.with_words`)."""
    old_vocab = old.backend.get_vocab(with_added_tokens=True)
    if new.vocab_size <= old.vocab_size or any(new.backend.token_to_id(t) != i for t, i in old_vocab.items()):
        return {}
    return {i: old.encode(new.backend.id_to_token(i), add_special=False) for i in range(old.vocab_size, new.vocab_size)}


def longer_than(tokenizer: Tokenizer, items: list[tuple[str, str]], max_length: int) -> list[tuple[str, int]]:
    """(what, length in tokens) of each (what, text) of `items` longer than `max_length` tokens
    once framed by [BOS] and [EOS]: the texts a collator will cut."""
    room = max_length - 2
    encodings = tokenizer.backend.encode_batch_fast([text for _, text in items], add_special_tokens=False)
    return [(what, len(e.ids) + 2) for (what, _), e in zip(items, encodings) if len(e.ids) > room]
