"""Triton kernels of the gated delta rule on lane-indexed recurrent state, and the prefill path.

`gdn_step` is a GDN layer's recurrence for short chunks, from the conv output and the raw gate
projections (the gates, the q/k L2 norms and the recurrence of kernels/gdn_ref.py's `gdn_step_ref`
in one kernel): decode (T = 1), verification of drafts (T = K+1) and the replay that commits a
verification (no output). One program owns one (row, value head, d_v block): it loads its block of
S from `state[src[b]]` (zeros where reset[b]), runs the T tokens in registers, and stores S into
`state[dst[b]]` (src == dst updates in place). Rows with skip[b] != 0 read and write nothing.

`gdn_chunk` is long prefill: fla-core's chunked kernel (`fla.ops.gated_delta_rule`, the `gpu`
extra) for bfloat16 / float16 values when it is importable and the caller allows it, otherwise
the torch chunked form (`chunk_gated_delta_rule_ref`). Float32 always takes the torch form: fla's
tl.dot calls leave the input precision at Triton's default, TF32 on tensor cores, so with float32
inputs its result is only TF32-accurate (about 1e-3 relative on the state; on an H200 that moved the
tiny Qwen3.5 test model's logits by 6e-3 of their scale; emulating TF32 in fla's dots under
Triton's interpreter reproduced it), while float32 here promises float32 results.

On CPU use kernels/gdn_ref.py, or this module under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is first imported; the tests run it in a child process, as for kernels/sampling.py).
"""

from __future__ import annotations

import functools
import warnings

import torch
import triton
import triton.language as tl

from kernels.gdn_ref import chunk_gated_delta_rule_ref


@triton.jit
def _gdn_step_kernel(
    y_ptr,
    a_ptr,
    b_ptr,
    yrow_ptr,
    alog_ptr,
    dtb_ptr,
    o_ptr,
    s_ptr,
    src_ptr,
    dst_ptr,
    reset_ptr,
    count_ptr,
    skip_ptr,
    T,
    C,
    scale,
    y_layer,
    ab_layer,
    s_layer,
    ab_stride,
    HV: tl.constexpr,
    HK: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    STORE_O: tl.constexpr,
    HAS_SKIP: tl.constexpr,
    HAS_YROW: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // HV
    h = pid % HV
    layer = tl.program_id(2)  # several layers at once: the replay of a commit
    yb = b
    if HAS_YROW:
        yb = tl.load(yrow_ptr + b)  # the row of y / a / b holding this row's tokens
    y_ptr += layer * y_layer
    a_ptr += layer * ab_layer
    b_ptr += layer * ab_layer
    s_ptr += layer * s_layer
    alog_ptr += layer * HV
    dtb_ptr += layer * HV
    hk = h // (HV // HK)
    ok = tl.arange(0, BK)
    ov = tl.program_id(1) * BV + tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    active = 1
    if HAS_SKIP:
        active = tl.where(tl.load(skip_ptr + b) != 0, 0, 1)
    src = tl.load(src_ptr + b)
    dst = tl.load(dst_ptr + b)
    n = tl.load(count_ptr + b)
    load = tl.where(tl.load(reset_ptr + b) != 0, 0, active)
    block = ok[:, None] * DV + ov[None, :]  # [BK, BV] offsets inside one head's [DK, DV]
    # (flags enter masks as vector-vs-scalar comparisons: Triton 3.x's interpreter rejects a scalar
    # bool broadcast into a tensor mask)
    m_load = mk[:, None] & (ov[None, :] < DV * load)
    m_store = mk[:, None] & (ov[None, :] < DV * active)
    s = tl.load(s_ptr + (src * HV + h) * DK * DV + block, mask=m_load, other=0.0)  # [BK, BV] f32
    neg_a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + h).to(tl.float32)
    for t in range(T * active):
        row = yb * T + t
        y = y_ptr + row * C  # [q (HK*DK) | k (HK*DK) | v (HV*DV)]
        kt = tl.load(y + HK * DK + hk * DK + ok, mask=mk, other=0.0).to(tl.float32)  # [BK]
        kt = kt * (1.0 / tl.sqrt(tl.sum(kt * kt, 0) + 1e-6))
        vt = tl.load(y + 2 * HK * DK + h * DV + ov, mask=mv, other=0.0).to(tl.float32)  # [BV]
        real = (n > t).to(tl.float32)  # padding tokens: g = beta = 0, the state is unchanged
        x = tl.load(a_ptr + row * ab_stride + h).to(tl.float32) + dt_bias
        softplus = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
        gt = neg_a * softplus * real
        bt = real / (1.0 + tl.exp(-tl.load(b_ptr + row * ab_stride + h).to(tl.float32)))
        s = s * tl.exp(gt)
        d = (vt - tl.sum(s * kt[:, None], 0)) * bt  # [BV]
        s = s + kt[:, None] * d[None, :]
        if STORE_O:
            qt = tl.load(y + hk * DK + ok, mask=mk, other=0.0).to(tl.float32)  # [BK]
            qt = qt * (scale / tl.sqrt(tl.sum(qt * qt, 0) + 1e-6))
            ot = tl.sum(s * qt[:, None], 0)  # [BV]
            tl.store(
                o_ptr + ((b * T + t) * HV + h) * DV + ov, ot.to(o_ptr.dtype.element_ty), mask=mv
            )
    tl.store(s_ptr + (dst * HV + h) * DK * DV + block, s, mask=m_store)


def gdn_step(
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    skip: torch.Tensor | None = None,
    *,
    num_k_heads: int,
    key_dim: int,
    want_out: bool = True,
    block_v: int = 32,
) -> torch.Tensor | None:
    """The GDN gates, q/k normalisation and recurrence over T tokens per row on indexed state, in
    place (CUDA or the interpreter): kernels/gdn_ref.py's `gdn_step_ref`.

    y: [B, T, C] the conv output [q | k | v] (C = 2 Hk dk + Hv dv); a, b: [B, T, Hv] the raw
    in_proj_a / in_proj_b outputs (column slices of a wider projection are read in place); A_log,
    dt_bias: [Hv]; state: [N, Hv, dk, dv] float32, contiguous; src, dst: [B] int64 rows of state to
    read / write; reset: [B] int32 (non-zero: start from zeros); counts: [B] int64 real tokens per
    row (later tokens leave the state unchanged); skip: [B] int32 or None (non-zero: the row does
    nothing). Returns o: [B, T, Hv, dv] in y's dtype, or None without want_out. No host
    synchronisation."""
    B, T, C = y.shape
    hv, hk, dk = a.shape[2], num_k_heads, key_dim
    dv = (C - 2 * hk * dk) // hv
    assert (
        state.is_contiguous() and state.dtype == torch.float32 and state.shape[1:] == (hv, dk, dv)
    )
    assert hv % hk == 0 and C == 2 * hk * dk + hv * dv
    y = y.contiguous()
    a, b = _rows(a), _rows(b)
    out = torch.empty(B, T, hv, dv, dtype=y.dtype, device=y.device) if want_out else None
    bv = min(block_v, triton.next_power_of_2(dv))
    _gdn_step_kernel[(B * hv, triton.cdiv(dv, bv), 1)](
        y,
        a,
        b,
        src,
        A_log,
        dt_bias,
        y if out is None else out,
        state,
        src,
        dst,
        reset,
        counts,
        reset if skip is None else skip,
        T,
        C,
        dk**-0.5,
        0,
        0,
        0,
        a.stride(1),
        HV=hv,
        HK=hk,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=bv,
        STORE_O=want_out,
        HAS_SKIP=skip is not None,
        HAS_YROW=False,
    )
    return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    # [B, T, H] with unit column stride and rows (b, t) at a common stride: used in place (a column
    # slice of a fused projection), else copied
    B, T, _ = x.shape
    if x.stride(2) == 1 and x.stride(0) == T * x.stride(1):
        return x
    return x.contiguous()


def gdn_replay(
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    rows: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    skip: torch.Tensor,
    *,
    num_k_heads: int,
    key_dim: int,
    block_v: int = 32,
) -> None:
    """`gdn_step` without output over all G layers in one launch, reading recorded inputs in place:
    kernels/gdn_ref.py's `gdn_replay_ref`.

    y: [G, R, W, C], a, b: [G, R, W, Hv] recorded per lane (contiguous); rows: [B] int64, the
    recorded row of each batch row; A_log, dt_bias: [G, Hv]; state: [G, N, Hv, dk, dv] float32
    contiguous; src, dst, reset, counts, skip: [B] as for `gdn_step`."""
    G, R, W, C = y.shape
    hv, hk, dk = a.shape[3], num_k_heads, key_dim
    dv = (C - 2 * hk * dk) // hv
    assert y.is_contiguous() and a.is_contiguous() and b.is_contiguous() and state.is_contiguous()
    assert state.shape[0] == G and state.shape[2:] == (hv, dk, dv) and A_log.shape == (G, hv)
    B = rows.shape[0]
    bv = min(block_v, triton.next_power_of_2(dv))
    _gdn_step_kernel[(B * hv, triton.cdiv(dv, bv), G)](
        y,
        a,
        b,
        rows,
        A_log,
        dt_bias,
        y,
        state,
        src,
        dst,
        reset,
        counts,
        skip,
        W,
        C,
        dk**-0.5,
        R * W * C,
        R * W * hv,
        state[0].numel(),
        hv,
        HV=hv,
        HK=hk,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=bv,
        STORE_O=False,
        HAS_SKIP=True,
        HAS_YROW=True,
    )


@functools.cache
def _fla_chunk():
    """fla-core's chunked kernel, or None when it is not installed."""
    try:
        with warnings.catch_warnings():  # a third-party import's own deprecation notices
            warnings.simplefilter("ignore")
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def gdn_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial: torch.Tensor,
    *,
    use_fla: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over a long chunk from dense initial states (prefill).

    q, k: [B, T, Hk, dk] normalised as for `gdn_recurrent`; v: [B, T, Hv, dv]; g, beta: [B, T, Hv]
    float32; initial: [B, Hv, dk, dv] float32. Returns (o: [B, T, Hv, dv] in v's dtype, final
    state [B, Hv, dk, dv] float32). fla-core's kernel on CUDA for 16-bit v when installed and
    `use_fla` (the worker's INFERNIX_FLA switch), else the torch chunked form (always for float32:
    fla's dots would run in TF32, module docstring)."""
    fla = _fla_chunk() if use_fla and v.is_cuda and v.dtype in (torch.bfloat16, torch.float16) \
        else None
    if fla is None:
        return chunk_gated_delta_rule_ref(q, k, v, g, beta, initial)
    o, final = fla(
        q.to(v.dtype),
        k.to(v.dtype),
        v,
        g,
        beta.to(v.dtype),
        scale=1.0,
        initial_state=initial,
        output_final_state=True,
    )
    return o.to(v.dtype), final.float()
