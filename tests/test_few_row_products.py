"""mmtx.few_row_products: the same products as F.linear, rerouted only where the layout pays."""

import pytest
import torch
import torch.nn.functional as F

from mmtx.few_row_products import MAX_ROWS, few_row_products, linear_few_rows, pays


@pytest.mark.parametrize("rows", [1, 2, 16, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_f_linear_with_gradients(rows, bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 40, bias=bias)
    x = torch.randn(rows, 1, 48, requires_grad=True)  # (B, T=1, dim): a decoding step's shape
    y = linear_few_rows(x, layer.weight, layer.bias)
    expected = F.linear(x, layer.weight, layer.bias)
    assert y.shape == (rows, 1, 40) and y.is_contiguous()
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)

    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, layer.weight] + ([layer.bias] if bias else []), grad)
    want = torch.autograd.grad(expected, [x, layer.weight] + ([layer.bias] if bias else []), grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_the_mode_reroutes_only_the_products_that_pay(monkeypatch):
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    rerouted = []
    real = linear_few_rows

    def spy(x, weight, bias=None):
        rerouted.append(x.shape)
        return real(x, weight, bias)

    monkeypatch.setattr("mmtx.few_row_products.linear_few_rows", spy)
    few, many = torch.randn(3, 16), torch.randn(MAX_ROWS + 1, 16)
    expected = F.linear(few, layer.weight, layer.bias)
    with few_row_products():
        torch.testing.assert_close(layer(few), expected)
        layer(many)  # past MAX_ROWS: plain
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(few).dtype == torch.bfloat16  # autocast applies, as without the mode
        layer.to(torch.bfloat16)(few.to(torch.bfloat16))  # bf16 weights: plain
        torch.testing.assert_close(torch.add(few, 1), few + 1)  # other calls pass through
    layer.float()(few)  # outside the mode: plain
    assert rerouted == [torch.Size([3, 16])]


def test_what_pays():
    w = torch.randn(8, 16)
    assert pays(torch.randn(1, 16), w) and pays(torch.randn(4, 1, 16), w)
    assert not pays(torch.randn(MAX_ROWS + 1, 16), w)
    assert not pays(torch.randn(0, 16), w)  # empty input: plain F.linear
    assert not pays(torch.randn(2, 16, dtype=torch.float64), w)


@pytest.mark.parametrize("capability", ["AVX512", "AVX2"])
def test_generation_reroutes_by_default_only_where_it_pays(monkeypatch, capability):
    """Default (None): the few-row layout on CPUs with AVX-512 kernels, where it was measured to
    pay, plain F.linear elsewhere; explicit true/false win; the tokens are the same every way."""
    from mmtx.generation import GenerationConfig, generate
    from tests.helpers import tiny_captioner

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    real, calls = linear_few_rows, []
    monkeypatch.setattr("mmtx.few_row_products.linear_few_rows", lambda *a: calls.append(1) or real(*a))
    model = tiny_captioner("learned")
    context = model.encode(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    tokens = {}
    for setting in (None, True, False):
        calls.clear()
        config = GenerationConfig(max_new_tokens=6, few_row_products=setting)
        tokens[setting] = generate(model.decoder, context, bos_id=1, eos_id=2, pad_id=0, config=config)
        rerouted = setting if setting is not None else capability == "AVX512"
        assert bool(calls) == rerouted, setting
    assert torch.equal(tokens[None], tokens[True]) and torch.equal(tokens[True], tokens[False])
