"""Generation: cached == uncached, beam(1) == greedy, beam search finds likelier captions, sampling."""

import pytest
import torch

from mmtx.generation import GenerationConfig, filter_logits, generate
from tests.helpers import tiny_captioner

BOS, EOS, PAD = 1, 2, 0


def run(model, images, **cfg):
    gen = torch.Generator().manual_seed(0) if cfg.get("do_sample") else None
    return generate(
        model.decoder,
        model.encode(images),
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        config=GenerationConfig(**cfg),
        generator=gen,
    )


def log_prob(model, images, tokens):
    """Sum of log-probabilities of each generated caption (up to and including EOS)."""
    seq = torch.cat([torch.full((len(tokens), 1), BOS), tokens], dim=1)
    logp = model(images, seq[:, :-1]).log_softmax(-1).gather(2, seq[:, 1:, None]).squeeze(2)
    real = torch.cumsum(tokens == EOS, dim=1) - (tokens == EOS).long() == 0  # up to the first EOS
    return (logp * real).sum(1)


@pytest.fixture(params=["learned", "sinusoidal", "rope"])
def model(request):
    return tiny_captioner(request.param)


@pytest.fixture
def images():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"num_beams": 3},
        {"num_beams": 4, "length_penalty": 0.6, "early_stopping": False},
        {"do_sample": True, "top_k": 10, "top_p": 0.9, "temperature": 0.8},
    ],
)
def test_cached_equals_uncached(model, images, settings):
    cached = run(model, images, max_new_tokens=12, **settings)
    uncached = run(model, images, max_new_tokens=12, use_cache=False, **settings)
    assert torch.equal(cached, uncached)
    assert len(set(map(tuple, cached.tolist()))) > 1  # not a degenerate model


def test_greedy_output_is_varied_and_ends_in_padding(model, images):
    out = run(model, images, max_new_tokens=20)
    assert out.shape[0] == 4
    for row in out.tolist():
        if EOS in row:
            assert all(t == PAD for t in row[row.index(EOS) + 1 :])
        assert BOS not in row and PAD not in row[: row.index(EOS) if EOS in row else len(row)]


def test_beam_of_one_is_greedy(model, images):
    assert torch.equal(run(model, images, max_new_tokens=16), run(model, images, max_new_tokens=16, num_beams=1))
    # the beam-search code path itself with K=1 (generate dispatches K=1 to greedy)
    from mmtx.generation import _beam_search, _Stepper

    step = _Stepper(model.decoder, model.encode(images), None, True, 17, [PAD, BOS])
    beam1 = _beam_search(step, 4, GenerationConfig(max_new_tokens=16, num_beams=1), BOS, EOS, PAD, images.device)
    greedy = run(model, images, max_new_tokens=16)
    assert torch.equal(beam1, greedy[:, : beam1.shape[1]])


def test_beam_search_finds_likelier_captions(model, images):
    greedy = run(model, images, max_new_tokens=16)
    beam = run(model, images, max_new_tokens=16, num_beams=5, length_penalty=0.0)
    with torch.no_grad():
        assert (log_prob(model, images, beam) >= log_prob(model, images, greedy) - 1e-4).all()


def test_min_new_tokens_forbids_early_eos(model, images):
    out = run(model, images, max_new_tokens=10, min_new_tokens=10)
    assert out.shape == (4, 10) and not (out == EOS).any()
    beams = run(model, images, max_new_tokens=10, min_new_tokens=10, num_beams=3)
    assert beams.shape == (4, 10) and not (beams == EOS).any()


def test_sampling_is_reproducible_and_varies_with_seed(model, images):
    a = run(model, images, max_new_tokens=12, do_sample=True)
    b = run(model, images, max_new_tokens=12, do_sample=True)
    assert torch.equal(a, b)
    other = generate(
        model.decoder,
        model.encode(images),
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        config=GenerationConfig(max_new_tokens=12, do_sample=True),
        generator=torch.Generator().manual_seed(123),
    )
    assert not torch.equal(a, other)


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert torch.isfinite(filter_logits(logits, top_k=2)).tolist() == [[True, True, False, False, False]]
    # nucleus 0.8: 0.5 + 0.2 = 0.7 < 0.8, so the third token is needed; the rest go
    assert torch.isfinite(filter_logits(logits, top_p=0.8)).tolist() == [[True, True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.5)).tolist() == [[True, False, False, False, False]]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="top_p=1.5"):
        GenerationConfig(top_p=1.5)
    with pytest.raises(ValueError, match="not both"):
        GenerationConfig(num_beams=2, do_sample=True)
    with pytest.raises(ValueError, match="max_new_tokens=40"):
        run(tiny_captioner(), torch.randn(1, 3, 32, 32), max_new_tokens=40)


def test_an_eos_that_is_also_the_bos_ends_captions() -> None:
    """GPT-2 uses <|endoftext|> as both: it must stay allowed (only as EOS), or captions never end."""
    model = tiny_captioner()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = generate(
            model.decoder, model.encode(images), bos_id=5, eos_id=5, pad_id=0, config=GenerationConfig(max_new_tokens=6)
        )
    assert out.tolist() == [[5], [5]]  # both images' most likely first token is the EOS


class _ScriptedStepper:
    """Log-probabilities that make row r emit ``script[r][t]`` at step t."""

    def __init__(self, script: list[list[int]], vocab: int = 8) -> None:
        self.script, self.vocab = script, vocab

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1] - 1
        logits = torch.zeros(len(self.script), self.vocab)
        for r, row in enumerate(self.script):
            logits[r, row[t]] = 10.0
        return logits.log_softmax(-1)


def test_greedy_keeps_an_eos_that_is_also_the_padding() -> None:
    """With pad == eos (GPT-2), the output ends at the last row's EOS, which stays; rows that
    ended earlier are padded; nothing after the last EOS is kept."""
    from mmtx.generation import _greedy_or_sample

    E = 2
    script = [[4, E, 5, 5, 5, 5, 5], [3, 4, 5, E, 6, 6, 6]]
    out = _greedy_or_sample(
        _ScriptedStepper(script), 2, GenerationConfig(max_new_tokens=7), BOS, E, E, torch.device("cpu"), None
    )
    assert out.tolist() == [[4, E, E, E], [3, 4, 5, E]]
    # a row that never ends keeps every step
    script[1] = [3, 4, 5, 6, 6, 6, 6]
    out = _greedy_or_sample(
        _ScriptedStepper(script), 2, GenerationConfig(max_new_tokens=7), BOS, E, E, torch.device("cpu"), None
    )
    assert out.tolist() == [[4, E, E, E, E, E, E], [3, 4, 5, 6, 6, 6, 6]]
