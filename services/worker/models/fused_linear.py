"""One GEMM for several projections of the same input, keeping their Hugging Face names.

`fuse_linears(parent, names)` concatenates the weights (and biases) of the nn.Linear children
`names` of `parent` into one matrix registered as the non-persistent buffer `parent.fused_<first>`
and rebinds each child's parameter to its row slice of it: no memory is duplicated, state_dict
keeps the checkpoint names, and `project(parent, x, names)` returns every output from one
F.linear. Call it once the weights are loaded on their final device (moving the module afterwards
copies parameters and buffer separately: still correct, at twice the memory).
"""

from __future__ import annotations

import torch
from torch import nn


def fuse_linears(parent: nn.Module, names: tuple[str, ...]) -> None:
    linears = [getattr(parent, n) for n in names]
    weight = torch.cat([m.weight.detach() for m in linears], dim=0)  # [sum(out), in]
    has_bias = linears[0].bias is not None
    bias = torch.cat([m.bias.detach() for m in linears], dim=0) if has_bias else None
    offset = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(weight[offset:offset + n], requires_grad=False)
        if has_bias:
            m.bias = nn.Parameter(bias[offset:offset + n], requires_grad=False)
        offset += n
    parent.register_buffer(f"fused_{names[0]}", weight, persistent=False)
    parent.register_buffer(f"fused_{names[0]}_bias", bias, persistent=False)


def project(parent: nn.Module, x: torch.Tensor, names: tuple[str, ...],
            quantized=None) -> tuple[torch.Tensor, ...]:
    """The outputs of the Linear children `names` on x [..., in], fused when `fuse_linears` ran
    (quantized: the fused matrix in a block format, for layers.linear)."""
    weight = getattr(parent, f"fused_{names[0]}", None)
    if weight is None:
        return tuple(getattr(parent, n)(x) for n in names)
    from services.worker.models.layers import linear

    out = linear(x, weight, getattr(parent, f"fused_{names[0]}_bias"), quantized)  # [..., sum(out)]
    return tuple(out.split([getattr(parent, n).weight.shape[0] for n in names], dim=-1))
