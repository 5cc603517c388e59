"""Triton kernels of the gated delta rule on lane-indexed recurrent state, and the prefill path.

`gdn_recurrent` is the per-token recurrence of kernels/gdn_ref.py (`gated_delta_rule_ref`) for
short chunks: decode (T = 1), verification of drafts (T = K+1) and the replay that commits a
verification (no output). One program owns one (row, value head, d_v block): it loads its block of
S from `state[src[b]]` (zeros where reset[b]), runs the T tokens in registers, and stores S into
`state[dst[b]]` (src == dst updates in place). Rows with skip[b] != 0 read and write nothing.

`gdn_chunk` is long prefill: fla-core's chunked kernel (`fla.ops.gated_delta_rule`, the `gpu`
extra) when it is importable, otherwise the torch chunked form (`chunk_gated_delta_rule_ref`).

On CPU use kernels/gdn_ref.py, or this module under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is first imported; the tests run it in a child process, as for kernels/sampling.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn_ref import chunk_gated_delta_rule_ref


@triton.jit
def _gdn_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, s_ptr, src_ptr, dst_ptr, reset_ptr,
                          skip_ptr, T, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr,
                          DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, STORE_O: tl.constexpr,
                          HAS_SKIP: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // HV
    h = pid % HV
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
    load = tl.where(tl.load(reset_ptr + b) != 0, 0, active)
    block = ok[:, None] * DV + ov[None, :]  # [BK, BV] offsets inside one head's [DK, DV]
    # (flags enter masks as vector-vs-scalar comparisons: Triton 3.x's interpreter rejects a scalar
    # bool broadcast into a tensor mask)
    m_load = mk[:, None] & (ov[None, :] < DV * load)
    m_store = mk[:, None] & (ov[None, :] < DV * active)
    s = tl.load(s_ptr + (src * HV + h) * DK * DV + block, mask=m_load, other=0.0)  # [BK, BV] f32
    for t in range(T * active):
        row = b * T + t
        kt = tl.load(k_ptr + (row * HK + hk) * DK + ok, mask=mk, other=0.0).to(tl.float32)  # [BK]
        vt = tl.load(v_ptr + (row * HV + h) * DV + ov, mask=mv, other=0.0).to(tl.float32)  # [BV]
        gt = tl.load(g_ptr + row * HV + h).to(tl.float32)
        bt = tl.load(beta_ptr + row * HV + h).to(tl.float32)
        s = s * tl.exp(gt)
        d = (vt - tl.sum(s * kt[:, None], 0)) * bt  # [BV]
        s = s + kt[:, None] * d[None, :]
        if STORE_O:
            qt = tl.load(q_ptr + (row * HK + hk) * DK + ok, mask=mk, other=0.0).to(tl.float32)  # [BK]
            ot = tl.sum(s * qt[:, None], 0)  # [BV]
            tl.store(o_ptr + (row * HV + h) * DV + ov, ot.to(o_ptr.dtype.element_ty), mask=mv)
    tl.store(s_ptr + (dst * HV + h) * DK * DV + block, s, mask=m_store)


def gdn_recurrent(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                  reset: torch.Tensor, skip: torch.Tensor | None = None, *, block_v: int = 32
                  ) -> torch.Tensor | None:
    """The recurrence over T tokens per row on indexed state, in place (CUDA or the interpreter).

    q, k: [B, T, Hk, dk] L2-normalised (q also scaled), or q None for a replay without output;
    v: [B, T, Hv, dv]; g, beta: [B, T, Hv] float32 (g = beta = 0 on padding tokens);
    state: [N, Hv, dk, dv] float32, contiguous; src, dst: [B] int64 rows of state to read / write;
    reset: [B] int32 (non-zero: start from a zero state); skip: [B] int32 or None (non-zero: the
    row does nothing). Returns o: [B, T, Hv, dv] in v's dtype, or None when q is None.
    No host synchronisation."""
    B, T, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    assert state.is_contiguous() and state.dtype == torch.float32 and state.shape[1:] == (hv, dk, dv)
    assert g.dtype == torch.float32 and beta.dtype == torch.float32 and hv % hk == 0
    k, v, g, beta = (x.contiguous() for x in (k, v, g, beta))
    out = None if q is None else torch.empty_like(v)  # [B, T, Hv, dv]
    bv = min(block_v, triton.next_power_of_2(dv))
    _gdn_recurrent_kernel[(B * hv, triton.cdiv(dv, bv))](
        k if q is None else q.contiguous(), k, v, g, beta, v if out is None else out, state, src, dst, reset,
        reset if skip is None else skip, T, HV=hv, HK=hk, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=bv,
        STORE_O=q is not None, HAS_SKIP=skip is not None)
    return out


def _fla_chunk():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def gdn_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over a long chunk from dense initial states (prefill).

    q, k: [B, T, Hk, dk] normalised as for `gdn_recurrent`; v: [B, T, Hv, dv]; g, beta: [B, T, Hv]
    float32; initial: [B, Hv, dk, dv] float32. Returns (o: [B, T, Hv, dv] in v's dtype, final
    state [B, Hv, dk, dv] float32). fla-core's kernel on CUDA when installed, else the torch
    chunked form."""
    fla = _fla_chunk() if v.is_cuda else None
    if fla is None:
        return chunk_gated_delta_rule_ref(q, k, v, g, beta, initial)
    o, final = fla(q.to(v.dtype), k.to(v.dtype), v, g, beta.to(v.dtype), scale=1.0, initial_state=initial,
                   output_final_state=True)
    return o.to(v.dtype), final.float()
