"""Triton gated RMSNorm of the GDN output, per value head (one launch instead of ~10 torch ops):

    out[r] = ((o[r] / sqrt(mean(o[r]^2) + eps)) in o's dtype * weight) * silu(z[r])   in float32,
             returned in o's dtype

for rows r = (token, head) of o: [N, Hv, dv] and z read through a row stride (z may be a column
slice of a fused projection). services/worker/models/gdn.py's `GatedRMSNorm.forward` is the
torch reference; on CPU use it, or this module under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_rmsnorm_kernel(
    o_ptr,
    z_ptr,
    w_ptr,
    out_ptr,
    z_stride,
    eps,
    HV: tl.constexpr,
    DV: tl.constexpr,
    BD: tl.constexpr,
):
    r = tl.program_id(0)  # row = token * HV + head
    token = r // HV
    head = r % HV
    od = tl.arange(0, BD)
    md = od < DV
    o = tl.load(o_ptr + r * DV + od, mask=md, other=0.0).to(tl.float32)
    normed = o / tl.sqrt(tl.sum(o * o, 0) / DV + eps)
    normed = normed.to(o_ptr.dtype.element_ty).to(
        tl.float32
    )  # as the reference: back to o's dtype first
    w = tl.load(w_ptr + od, mask=md, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + token * z_stride + head * DV + od, mask=md, other=0.0).to(tl.float32)
    scaled = (w * normed).to(o_ptr.dtype.element_ty).to(tl.float32)
    out = scaled * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + r * DV + od, out.to(out_ptr.dtype.element_ty), mask=md)


def gated_rmsnorm(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """o: [N, Hv, dv] contiguous; z: [N, Hv * dv] with unit column stride (any row stride);
    weight: [dv]. Returns [N, Hv, dv] in o's dtype. No host synchronisation."""
    N, hv, dv = o.shape
    assert o.is_contiguous() and z.stride(-1) == 1 and z.shape == (N, hv * dv)
    out = torch.empty_like(o)
    if N:
        _gated_rmsnorm_kernel[(N * hv,)](o, z, weight, out, z.stride(0), eps, HV=hv, DV=dv,
                                         BD=triton.next_power_of_2(dv))
    return out
