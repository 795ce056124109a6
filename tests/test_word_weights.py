"""`task.word_weights`: the captioning loss weighs the named words' tokens, and only the training loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtx.config_error import ArgumentError
from mmtx.data.tokenizer import Tokenizer
from mmtx.tasks.caption import token_weights
from tests.helpers import compose_train

CAPTIONS = ["a red circle above a blue square", "a green triangle left of a circle", "a small yellow circle"]
TINY = [
    "data.image_size=32", "data.max_length=16", "model.encoder.dim=32", "model.encoder.depth=1",
    "model.encoder.num_heads=2", "model.decoder.dim=32", "model.decoder.depth=1", "model.decoder.num_heads=2",
]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train(CAPTIONS * 5, vocab_size=120)


def caption_task(tokenizer: Tokenizer, word_weights: dict[str, float] | None):
    cfg = compose_train(TINY)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    torch.manual_seed(0)
    return instantiate(cfg.task, model=model, tokenizer=tokenizer.to_str(), word_weights=word_weights,
                       _recursive_=False, _convert_="all")  # fmt: skip


def test_the_named_words_tokens_weigh_the_training_loss_and_count_in_its_mean(tokenizer: Tokenizer) -> None:
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ids, _ = tokenizer.encode_batch(CAPTIONS, max_length=16)
    batch = {"images": images, "input_ids": ids}
    targets = ids[:, 1:]
    real = targets != tokenizer.pad_id
    circle = tokenizer.encode("circle", add_special=False)
    circles = int((targets == circle[0]).sum())
    assert len(circle) == 1 and circles == 3  # one token, in every caption

    plain, weighted = caption_task(tokenizer, None), caption_task(tokenizer, {"circle": 3.0})
    weighted.load_state_dict(plain.state_dict())
    for task in (plain, weighted):
        task.on_fit_start()  # where the words are spelt
    assert plain.token_weights is None and "token_weights" not in weighted.state_dict()  # from the config
    with torch.no_grad():
        logits = plain.model(images, ids[:, :-1])
        ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view_as(targets)
        weight = torch.where(targets == circle[0], 3.0, 1.0) * real
        for task, w in ((plain, real.float()), (weighted, weight)):
            total = task.training_step(batch, 0)
            assert torch.allclose(total, (ce * w).sum(), rtol=1e-5)  # the weighted sum ...
            assert task._step_sums[1] == w.sum()  # ... over the weights: the step's mean is the weighted mean
        assert weighted._step_sums[1] == real.sum() + 2 * circles  # each circle counts three times


def test_weights_are_refused_naming_the_key_and_the_word(tokenizer: Tokenizer) -> None:
    weights = token_weights(tokenizer, {"circle": 2, "square": 0.5})
    assert weights.shape == (tokenizer.vocab_size,) and sorted(weights.unique().tolist()) == [0.5, 1.0, 2.0]
    assert token_weights(tokenizer, {}) is None and token_weights(tokenizer, None) is None
    bpe = Tokenizer.train(CAPTIONS * 5, vocab_size=300, kind="bpe")  # a word inside a caption is "Ġword"
    (inside,) = bpe.encode("a circle", add_special=False)[1:]
    assert token_weights(bpe, {"circle": 2})[inside] == 2 and bpe.backend.id_to_token(inside) == "Ġcircle"
    for bad, said in (
        ({"circle": 0}, "word_weights: 'circle' takes a positive finite number, got 0"),
        ({"circle": -1.5}, "word_weights: 'circle' takes a positive finite number, got -1.5"),
        ({"circle": float("inf")}, "word_weights: 'circle' takes a positive finite number, got inf"),
        ({"circle": True}, "word_weights: 'circle' takes a positive finite number, got True"),
        ({"circle": "3"}, "word_weights: 'circle' takes a positive finite number, got '3'"),
        ({"zebra": 2}, "word_weights: 'zebra' is not one token of the run's vocabulary, which spells it ['[UNK]']"),
        (
            {"circles": 2},
            "word_weights: 'circles' is not one token of the run's vocabulary, which spells it ['circle', '##s']",
        ),
    ):
        with pytest.raises(ArgumentError) as error:
            token_weights(tokenizer, bad)
        assert str(error.value) == said


def test_a_word_the_runs_vocabulary_cannot_spell_is_refused_when_the_fit_starts(tokenizer: Tokenizer) -> None:
    task = caption_task(tokenizer, {"circle": 3.0, "zebra": 3.0})  # the start-up check has no vocabulary yet
    with pytest.raises(ArgumentError, match="word_weights: 'zebra' is not one token of the run's vocabulary"):
        task.on_fit_start()


def test_a_word_weighs_the_same_capitalised_but_not_as_a_piece_of_another() -> None:
    cased = ["circle above a square", "Circle left of a square", "a Circle", "the Circle", "a bluecircle"] * 5
    bpe = Tokenizer.train(CAPTIONS * 5 + cased, vocab_size=300, kind="bpe", lowercase=False)
    spellings = ["Ġcircle", "ĠCircle", "circle"]  # inside a caption, capitalised, opening one or inside a word
    ids = [bpe.backend.token_to_id(token) for token in spellings]
    assert None not in ids and len(set(ids)) == 3  # each one token of this vocabulary
    assert bpe.backend.id_to_token(bpe.encode("a bluecircle", add_special=False)[-1]) == "circle"  # a piece
    weights = token_weights(bpe, {"circle": 2})
    assert weights[ids].tolist() == [2.0, 2.0, 1.0] and int((weights != 1).sum()) == 2


def test_the_validation_loss_stays_unweighted(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    ids, _ = tokenizer.encode_batch(CAPTIONS, max_length=16)
    batch = {"images": images, "input_ids": ids, "image_ids": torch.arange(3), "references": [[c] for c in CAPTIONS]}
    plain, weighted = caption_task(tokenizer, None), caption_task(tokenizer, {"circle": 3.0, "red": 5.0})
    weighted.load_state_dict(plain.state_dict())
    losses = []
    for task in (plain, weighted):
        task.on_fit_start()
        task.samples, task.val_outputs = [], []
        logged = {}
        monkeypatch.setattr(task, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
        with torch.no_grad():
            task.validation_step(batch, 0)
        losses.append(logged["val/loss"])
    targets = ids[:, 1:]
    with torch.no_grad():
        logits = plain.model(images, ids[:, :-1])
    mean = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=tokenizer.pad_id)
    assert weighted.token_weights is not None
    assert torch.allclose(losses[0], mean, rtol=1e-5) and torch.allclose(losses[1], mean, rtol=1e-5)
