"""The linear layer every mmtx block uses: ``nn.Linear`` with a faster layout for few-row products."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same result) that computes fp32 products of few rows on the
    CPU as ``(W @ x.T).T``.

    A decoding step feeds one token per sequence, so its products have as many rows as there are
    sequences: 1-4 when captioning one image (with beams), 16 for a batch of 16 images. For such
    shapes MKL's fp32 GEMM is faster with the weight as the left operand. Over the products of a
    decoder step at width 384 (QKV, the projections, the MLP, an 8192-word head), with the weights
    coming from memory as in a real step: 3.7x for 2 rows, 2.4x for 4, 1.08x for 16 and 32, 1.01-1.09x
    for 64, no gain from 96 rows on and a loss at 256 (0.91x). One row is computed as two (the row
    twice): MKL's matrix-vector product reads the weights at about half the speed of that
    two-row product, 2.2x slower. bf16 (oneDNN) gains nothing and keeps ``F.linear``
    (``scripts/bench_linear.py``; torch 2.14 on the project's 2-core AMD EPYC).
    """

    max_rows = 64  # the largest row count that takes the (W @ x.T).T path (class attribute: benchmarks toggle it)

    def forward(self, x: Tensor) -> Tensor:
        if (  # cheapest tests first: this runs for every product of every model
            x.dtype == torch.float32
            and x.device.type == "cpu"
            and 0 < (rows := x.numel() // max(x.shape[-1], 1)) <= self.max_rows
            and self.weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
        ):
            x2 = x.reshape(rows, x.shape[-1])
            if rows == 1:  # as two rows: MKL's matrix-vector product is the slower kernel here
                x2 = x2.repeat(2, 1)
            if self.bias is None:
                y = self.weight @ x2.t()  # (out_features, rows)
            else:
                y = torch.addmm(self.bias[:, None], self.weight, x2.t())
            return y[:, :rows].t().contiguous().view(*x.shape[:-1], self.out_features)
        return super().forward(x)
