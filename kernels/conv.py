"""Triton depthwise causal conv1d + SiLU on lane-indexed conv windows (kernel width 4).

`causal_conv1d(x, windows, weight, src, dst, reset, counts)` is kernels/gdn_ref.py's
`causal_conv1d_ref` followed by `window_after` in one pass: one program owns one (row, channel
block), keeps the last three inputs in registers, writes silu(conv) for every token and stores the
window after the row's first counts[b] tokens into `windows[dst[b]]` (padding tokens past counts[b]
get outputs, as in the reference, but never enter the stored window). kernels/gdn_ref.py's
`causal_conv1d_indexed_ref` is the same operation in torch, for any width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv4_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    win_ptr,
    src_ptr,
    dst_ptr,
    reset_ptr,
    count_ptr,
    T,
    C,
    x_stride,
    BC: tl.constexpr,
):
    b = tl.program_id(0)
    oc = tl.program_id(1) * BC + tl.arange(0, BC)
    mc = oc < C
    src = tl.load(src_ptr + b)
    dst = tl.load(dst_ptr + b)
    keep = tl.where(tl.load(reset_ptr + b) != 0, 0, 1)
    n = tl.load(count_ptr + b)
    w0 = tl.load(w_ptr + oc * 4 + 0, mask=mc, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + oc * 4 + 1, mask=mc, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + oc * 4 + 2, mask=mc, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + oc * 4 + 3, mask=mc, other=0.0).to(tl.float32)
    win = win_ptr + (src * C + oc) * 3  # windows: [N, C, 3], oldest first
    m_keep = (
        oc < C * keep
    )  # (a vector-vs-scalar mask: the interpreter rejects scalar bools in masks)
    h0 = tl.load(win + 0, mask=m_keep, other=0.0).to(tl.float32)
    h1 = tl.load(win + 1, mask=m_keep, other=0.0).to(tl.float32)
    h2 = tl.load(win + 2, mask=m_keep, other=0.0).to(tl.float32)
    k0, k1, k2 = h0, h1, h2  # the window to keep: after the row's first n tokens
    for t in range(T):
        xt = tl.load(x_ptr + (b * T + t) * x_stride + oc, mask=mc, other=0.0).to(tl.float32)
        y = w0 * h0 + w1 * h1 + w2 * h2 + w3 * xt
        y = y / (1.0 + tl.exp(-y))
        tl.store(y_ptr + (b * T + t) * C + oc, y.to(y_ptr.dtype.element_ty), mask=mc)
        h0, h1, h2 = h1, h2, xt
        real = (oc * 0 + t) < n  # a vector condition (see m_keep)
        k0 = tl.where(real, h0, k0)
        k1 = tl.where(real, h1, k1)
        k2 = tl.where(real, h2, k2)
    out = win_ptr + (dst * C + oc) * 3
    tl.store(out + 0, k0.to(win_ptr.dtype.element_ty), mask=mc)
    tl.store(out + 1, k1.to(win_ptr.dtype.element_ty), mask=mc)
    tl.store(out + 2, k2.to(win_ptr.dtype.element_ty), mask=mc)


def causal_conv1d(
    x: torch.Tensor,
    windows: torch.Tensor,
    weight: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    *,
    block_c: int = 256,
) -> torch.Tensor:
    """silu(depthwise causal conv) of x continuing each row's window; updates windows in place.

    x: [B, T, C]; windows: [N, C, K-1] contiguous (the inputs before x, oldest first); weight:
    [C, K]; src, dst: [B] int64 rows of windows to read / write; reset: [B] int32 (non-zero: the
    row starts a sequence, its window reads as zeros); counts: [B] int64 real tokens per row.
    Returns y: [B, T, C] in x's dtype. No host synchronisation."""
    B, T, C = x.shape
    K = weight.shape[1]
    if K != 4:
        raise ValueError(
            f"weight: the Triton conv has 4 taps, got {K} (use causal_conv1d_indexed_ref)"
        )
    assert windows.shape[1:] == (C, K - 1) and windows.is_contiguous()
    if not (x.stride(2) == 1 and x.stride(0) == T * x.stride(1)):
        x = x.contiguous()  # (a column slice of a fused projection is read in place)
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    _conv4_kernel[(B, triton.cdiv(C, block_c))](
        x, y, weight.contiguous(), windows, src, dst, reset, counts, T, C, x.stride(1), BC=block_c
    )
    return y


@triton.jit
def _commit_windows_kernel(
    win_ptr,
    x_ptr,
    rows_ptr,
    src_ptr,
    dst_ptr,
    reset_ptr,
    count_ptr,
    skip_ptr,
    N,
    R,
    W,
    C,
    TAPS: tl.constexpr,
    BC: tl.constexpr,
):
    b = tl.program_id(0)
    layer = tl.program_id(1)
    oc = tl.program_id(2) * BC + tl.arange(0, BC)
    active = tl.where(tl.load(skip_ptr + b) != 0, 0, 1)
    mc = oc < C * active  # (vector-vs-scalar masks, as in _conv4_kernel)
    keep = tl.where(tl.load(reset_ptr + b) != 0, 0, 1)
    n = tl.load(count_ptr + b)
    src = tl.load(src_ptr + b)
    dst = tl.load(dst_ptr + b)
    row = tl.load(rows_ptr + b)
    before = win_ptr + ((layer * N + src) * C + oc) * TAPS  # windows: [G, N, C, TAPS]
    inputs = x_ptr + ((layer * R + row) * W) * C + oc  # recorded inputs: [G, R, W, C]
    out = win_ptr + ((layer * N + dst) * C + oc) * TAPS
    for j in tl.static_range(TAPS):  # src != dst: nothing written here is read again
        i = n + j  # column of the stream [window before | inputs] that becomes column j
        from_window = tl.load(
            before + i, mask=mc & (oc * 0 + i < TAPS) & (oc < C * keep), other=0.0
        )
        from_inputs = tl.load(inputs + (i - TAPS) * C, mask=mc & (oc * 0 + i >= TAPS), other=0.0)
        tl.store(out + j, tl.where(oc * 0 + i < TAPS, from_window, from_inputs), mask=mc)


def commit_windows(
    windows: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    skip: torch.Tensor,
    *,
    block_c: int = 256,
) -> None:
    """kernels/gdn_ref.py's `commit_windows_ref` in one launch: windows [G, N, C, K-1] and recorded
    inputs x [G, R, W, C], both contiguous; rows, src, dst, reset, counts, skip: [B], with
    src[b] != dst[b] (the committed and the pending slot)."""
    G, N, C, taps = windows.shape
    R, W = x.shape[1], x.shape[2]
    assert windows.is_contiguous() and x.is_contiguous() and x.shape[3] == C
    B = rows.shape[0]
    _commit_windows_kernel[(B, G, triton.cdiv(C, block_c))](
        windows, x, rows, src, dst, reset, counts, skip, N, R, W, C, TAPS=taps, BC=block_c
    )
