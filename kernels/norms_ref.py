"""Plain-torch references of the RMSNorm kernels (`kernels.norms`), the same rounding steps.

Two weight conventions, as the checkpoints define them:

- Llama / Qwen3 (`zero_centered=False`): y = w * (x / rms(x)).to(dtype): the normalised value is
  rounded to the input dtype first, then multiplied by the weight in that dtype;
- Qwen3.5 / Qwen3-Next / Gemma (`zero_centered=True`): y = (x / rms(x) * (1 + w)).to(dtype): the
  whole product in float32, rounded once. The checkpoint stores w around zero.

rms(x) = sqrt(mean(x^2) + eps), the statistics in float32. The residual variant first forms
h = x + residual in the input dtype (one rounding, as the models' `x = x + f(x)` does) and
normalises h.
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 zero_centered: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension. x: [..., D]; weight: [D]; returns x's shape and dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., D] float32
    if zero_centered:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight.to(x.dtype) * normed.to(x.dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                     zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with h = x + residual in x's dtype. x, residual: [..., D]."""
    h = x + residual
    return rms_norm_ref(h, weight, eps, zero_centered=zero_centered), h
