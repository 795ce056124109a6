"""mmtx.nn.Linear: nn.Linear's parameters and results, whichever product layout it picks."""

import pytest
import torch
import torch.nn.functional as F

from mmtx.nn.linear import Linear


@pytest.mark.parametrize("rows", [1, 2, 16, 64, 256, 257, 600])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_nn_linear_with_gradients(rows, bias):
    torch.manual_seed(0)
    layer = Linear(48, 40, bias=bias)
    x = torch.randn(rows, 1, 48, requires_grad=True)  # (B, T=1, dim): a decoding step's shape
    y = layer(x)
    expected = F.linear(x, layer.weight, layer.bias)
    assert y.shape == (rows, 1, 40) and y.is_contiguous()
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)

    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, layer.weight] + ([layer.bias] if bias else []), grad)
    want = torch.autograd.grad(expected, [x, layer.weight] + ([layer.bias] if bias else []), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_is_an_nn_linear_with_the_same_state_dict():
    torch.manual_seed(0)
    ours, theirs = Linear(8, 4), torch.nn.Linear(8, 4)
    theirs.load_state_dict(ours.state_dict())  # same keys and shapes: checkpoints and importers unchanged
    assert isinstance(ours, torch.nn.Linear)
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(ours(x), theirs(x))


def test_bf16_and_autocast_keep_the_plain_product():
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        assert y.dtype == torch.bfloat16  # autocast applies, as for nn.Linear
        assert torch.equal(y, F.linear(x, layer.weight, layer.bias))
    layer = layer.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    assert torch.equal(layer(xb), F.linear(xb, layer.weight, layer.bias))


def test_empty_input():
    layer = Linear(6, 3)
    assert layer(torch.randn(0, 6)).shape == (0, 3)
