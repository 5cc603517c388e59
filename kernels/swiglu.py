"""Triton SwiGLU on a fused gate|up projection output (rule and rounding: `kernels.swiglu_ref`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_util import to_dtype


@triton.jit
def _swiglu_kernel(x_ptr, x_stride, y_ptr, y_stride, INTER, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INTER
    g = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    u = tl.load(x_ptr + row * x_stride + INTER + cols, mask=ok, other=0.0)
    g32 = g.to(tl.float32)
    silu = to_dtype(g32 / (1.0 + tl.exp(-g32)), g.dtype)
    y = to_dtype(silu.to(tl.float32) * u.to(tl.float32), g.dtype)
    tl.store(y_ptr + row * y_stride + cols, y, mask=ok)


def swiglu(gate_up: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up for gate_up: [..., 2I] (float32 / float16 / bfloat16, rows of unit column
    stride whose leading dims merge into one stride). out: [..., I] of the same dtype, default new.
    Raises ValueError for an odd last dimension, a dtype or a layout it cannot take."""
    if gate_up.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"gate_up: expected float32 / float16 / bfloat16, got {gate_up.dtype}")
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"gate_up: expected [..., 2I] with a unit last stride, got "
                         f"{tuple(gate_up.shape)} strides {gate_up.stride()}")
    inter = gate_up.shape[-1] // 2
    shape = gate_up.shape[:-1] + (inter,)
    if out is None:
        out = torch.empty(shape, dtype=gate_up.dtype, device=gate_up.device)
    elif out.shape != shape or out.dtype != gate_up.dtype or out.stride(-1) != 1:
        raise ValueError(f"out: expected {gate_up.dtype} {tuple(shape)}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    try:
        x, y = gate_up.view(-1, 2 * inter), out.view(-1, inter)
    except RuntimeError as e:
        raise ValueError(f"gate_up/out: leading dimensions must merge into one stride: {e}") from e
    rows = x.shape[0]
    if rows == 0 or inter == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    _swiglu_kernel[(rows, triton.cdiv(inter, block))](x, x.stride(0), y, y.stride(0), inter,
                                                      BLOCK=block, num_warps=4)
    return out
