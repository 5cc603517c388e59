"""Triton RMSNorm kernels: plain, fused residual add, and the zero-centred (1 + w) convention.

`kernels.norms_ref` is the plain-torch reference and states the rounding steps both follow. One
program normalises BLOCK_R rows of D elements held in registers (D up to 32768); the rows are any
`[..., R2, D]` tensor whose leading dimensions merge into one stride, so a per-head q_norm/k_norm
runs on the q or k view of a fused q|k|v projection output without a copy, and `out=x` normalises
in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_util import to_dtype

_MAX_D = 32768


@triton.jit
def _rms_norm_kernel(x_ptr, x_s0, x_s1, r_ptr, r_s0, r_s1, h_ptr, h_s0, h_s1, w_ptr,
                     y_ptr, y_s0, y_s1, R, INNER, D, eps,
                     HAS_RESIDUAL: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    outer = (rows // INNER).to(tl.int64)
    inner = (rows % INNER).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    ok = (rows < R)[:, None] & (cols < D)[None, :]  # [BLOCK_R, BLOCK_D]
    x = tl.load(x_ptr + (outer * x_s0 + inner * x_s1)[:, None] + cols[None, :], mask=ok, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + (outer * r_s0 + inner * r_s1)[:, None] + cols[None, :], mask=ok,
                    other=0.0)
        x = to_dtype(x.to(tl.float32) + r.to(tl.float32), dtype)  # h = x + residual, rounded once
        tl.store(h_ptr + (outer * h_s0 + inner * h_s1)[:, None] + cols[None, :], x, mask=ok)
    x32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=1) / D + eps)  # [BLOCK_R]
    normed = x32 * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0)[None, :]
    if ZERO_CENTERED:
        y = normed * (1.0 + w.to(tl.float32))
    else:
        w = to_dtype(w.to(tl.float32), dtype).to(tl.float32)
        y = to_dtype(normed, dtype).to(tl.float32) * w  # the product of two dtype values
    y_rows = y_ptr + (outer * y_s0 + inner * y_s1)[:, None]
    tl.store(y_rows + cols[None, :], to_dtype(y, dtype), mask=ok)


def _as_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """[..., R2, D] -> a [R1, R2, D] view (no copy) with a unit last stride, else ValueError."""
    if t.dim() == 0 or t.stride(-1) != 1:
        raise ValueError(f"{name}: expected a unit stride on the last dimension, got strides "
                         f"{t.stride()}")
    if t.dim() == 1:
        return t.view(1, 1, -1)
    try:
        return t.view(-1, t.shape[-2], t.shape[-1])
    except RuntimeError as e:
        raise ValueError(f"{name}: the leading dimensions {tuple(t.shape[:-2])} must merge into "
                         f"one stride: {e}") from e


def _launch(x, weight, eps, zero_centered, residual, out, residual_out, invariant=False):
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x: expected float32 / float16 / bfloat16, got {x.dtype}")
    d = x.shape[-1]
    if weight.shape != (d,) or weight.device != x.device:
        raise ValueError(f"weight: expected [{d}] on {x.device}, got {tuple(weight.shape)} on "
                         f"{weight.device}")
    if not 1 <= d <= _MAX_D:
        raise ValueError(f"x: last dimension must be in 1..{_MAX_D}, got {d}")
    for name, t in (("residual", residual), ("out", out), ("residual_out", residual_out)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected {x.dtype} {tuple(x.shape)} on {x.device}, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    out = torch.empty_like(x) if out is None else out
    xr, yr = _as_rows(x, "x"), _as_rows(out, "out")  # [R1, R2, D]
    rr = hr = xr
    if residual is not None:
        residual_out = torch.empty_like(x) if residual_out is None else residual_out
        rr, hr = _as_rows(residual, "residual"), _as_rows(residual_out, "residual_out")
    rows, inner = xr.shape[0] * xr.shape[1], xr.shape[1]
    if rows == 0:
        return out, residual_out
    block_d = triton.next_power_of_2(d)
    # `invariant`: the row block from D alone, so a row's reduction over D is laid out alike in a
    # decode step's few rows and a verify forward's many
    block_r = max(1, min(16, 2048 // block_d, 16 if invariant else triton.next_power_of_2(rows)))
    _rms_norm_kernel[(triton.cdiv(rows, block_r),)](
        xr, xr.stride(0), xr.stride(1), rr, rr.stride(0), rr.stride(1), hr, hr.stride(0),
        hr.stride(1), weight, yr, yr.stride(0), yr.stride(1), rows, inner, d, float(eps),
        HAS_RESIDUAL=residual is not None, ZERO_CENTERED=zero_centered,
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4 if block_r * block_d <= 4096 else 8)
    return out, residual_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, zero_centered: bool = False,
             out: torch.Tensor | None = None, invariant: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension, as `kernels.norms_ref.rms_norm_ref`.

    x: [..., D] float32 / float16 / bfloat16, unit last stride, leading dims mergeable into one
        stride except the one before D (a head view [B, T, H, D] of a fused projection works);
    weight: [D] (any float dtype; cast as the reference does); eps: added to mean(x^2);
    zero_centered: the Qwen3.5 convention (x / rms * (1 + w)), default False (w * x / rms);
    out: where to write (x's shape and dtype; may be x itself), default a new tensor.
    invariant: the launch does not depend on the number of rows (models/layers.py WIDTH_INVARIANT).
    Returns out. Raises ValueError for a dtype, shape, device or stride it cannot take."""
    return _launch(x, weight, eps, zero_centered, None, out, None, invariant)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 zero_centered: bool = False, out: torch.Tensor | None = None,
                 residual_out: torch.Tensor | None = None,
                 invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual (rounded to x's dtype) and rms_norm(h) in one pass: returns (y, h).

    residual: x's shape and dtype. residual_out: where h goes (may be residual or x itself: each
    element is read before it is written), default a new tensor. Other arguments as `rms_norm`."""
    return _launch(x, weight, eps, zero_centered, residual, out, residual_out, invariant)
