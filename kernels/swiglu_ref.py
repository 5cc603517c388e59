"""Plain-torch reference of the SwiGLU kernel (`kernels.swiglu`).

On the output of a fused gate|up projection (the gate_proj rows first, then up_proj's),
y = silu(gate) * up with silu(g) = g * sigmoid(g): computed in float32, silu rounded to the
tensor's dtype, then the product rounded again (what `F.silu(gate) * up` does in bf16/fp16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [..., 2I] -> [..., I] in gate_up's dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
