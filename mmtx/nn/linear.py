"""The linear layer every mmtx block uses: ``nn.Linear`` with a faster layout for few-row products."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same result) that computes fp32 products of few rows on the
    CPU as ``(W @ x.T).T``.

    A decoding step feeds one token per sequence, so its products have as many rows as there are
    sequences (16 for greedy decoding of 16 images, 64 with 4 beams). For such shapes MKL's fp32
    GEMM is faster with the weight as the left operand: over the products of a decoder step at
    width 384 (QKV, projections, MLP, an 8192-word head), 1.22x for 16 rows, 1.25x for 64, 1.23x
    for 128, 1.11x for 256 and 1.03x for 512 (torch 2.14, the project's 2-core AMD EPYC). One row
    (a matrix-vector product) gains nothing, nor does bf16 (oneDNN), so both keep ``F.linear``.
    """

    max_rows = 256  # above this the two layouts run at the same speed

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if (
            1 < rows <= self.max_rows
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
        ):
            x2 = x.reshape(rows, x.shape[-1])
            if self.bias is None:
                y = self.weight @ x2.t()  # (out_features, rows)
            else:
                y = torch.addmm(self.bias[:, None], self.weight, x2.t())
            return y.t().contiguous().view(*x.shape[:-1], self.out_features)
        return super().forward(x)
