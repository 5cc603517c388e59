"""The Gated DeltaNet token mixer of Qwen3.5 (Hugging Face names: `linear_attn.in_proj_qkv`, ...).

Per layer, for x: [B, T, hidden] (as transformers' Qwen3.5 computes it):

    y = [q; k; v] = silu(causal_conv1d(in_proj_qkv(x)))   depthwise, K taps, continuing the
                                                          lane's window
    q, k      = l2norm(q) * dk^-1/2, l2norm(k)            float32, per key head
    beta      = sigmoid(in_proj_b(x)),  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
    o         = gated delta rule(q, k, v, g, beta) from the lane's recurrent state (float32)
    out       = out_proj(rmsnorm(o) * norm.weight * silu(in_proj_z(x)))   per value head

Right-padded tokens (t >= num_tokens[b]) get g = beta = 0, which leaves the recurrent state bit for
bit unchanged, and never enter the conv window. Dispatch: Triton kernels on CUDA (kernels/conv.py;
kernels/gdn.py's `gdn_step`, which computes the gates, norms and recurrence from y, a and b in one
kernel; fla-core's chunked kernel for long bf16 / fp16 prefill when installed), the torch references
of kernels/gdn_ref.py elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kernels import gdn_ref
from services.settings import switch
from services.worker.models.fused_linear import project
from services.worker.models.qwen35_config import Qwen35Config

if TYPE_CHECKING:
    from services.worker.models.qwen35_state import Qwen35State, StepIndex

GDN_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b")  # one GEMM once fused
# Forwards longer than this run the chunked form (prefill); shorter ones the per-token recurrence.
CHUNK_MIN_TOKENS = 32


def step(
    y,
    a,
    b,
    A_log,
    dt_bias,
    state,
    src,
    dst,
    reset,
    counts,
    skip=None,
    *,
    num_k_heads,
    key_dim,
    want_out=True,
):
    """`gdn_step` of kernels/gdn.py on CUDA, its torch reference elsewhere (same arguments)."""
    kw = {"num_k_heads": num_k_heads, "key_dim": key_dim, "want_out": want_out}
    if state.is_cuda:
        from kernels.gdn import gdn_step

        return gdn_step(y, a, b, A_log, dt_bias, state, src, dst, reset, counts, skip, **kw)
    return gdn_ref.gdn_step_ref(y, a, b, A_log, dt_bias, state, src, dst, reset, counts, skip, **kw)


def conv(x, windows, weight, src, dst, reset, counts):
    """`causal_conv1d` of kernels/conv.py on CUDA (4 taps), its torch reference elsewhere."""
    if x.is_cuda and weight.shape[1] == 4:
        from kernels.conv import causal_conv1d

        return causal_conv1d(x, windows, weight, src, dst, reset, counts)
    return gdn_ref.causal_conv1d_indexed_ref(x, windows, weight, src, dst, reset, counts)


def chunk(q, k, v, g, beta, initial):
    """`gdn_chunk` of kernels/gdn.py on CUDA, the torch chunked form elsewhere (same arguments)."""
    if v.is_cuda:
        from kernels.gdn import gdn_chunk

        return gdn_chunk(q, k, v, g, beta, initial, use_fla=switch("fla"))
    return gdn_ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, initial)


class GatedRMSNorm(nn.Module):
    """rmsnorm(o) * weight * silu(z) per value head: statistics in float32, weight applied in o's
    dtype (kernels/gdn_norm.py's Triton kernel on CUDA; this torch code is its reference)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # o: [B, T, Hv, dv]; z: [B, T, Hv * dv] (a column slice is fine) -> [B, T, Hv, dv]
        B, T, hv, dv = o.shape
        if o.is_cuda:
            from kernels.gdn_norm import gated_rmsnorm

            return gated_rmsnorm(o.reshape(B * T, hv, dv), z.reshape(B * T, hv * dv), self.weight,
                                 self.eps).view(B, T, hv, dv)
        x32 = F.rms_norm(o.float(), (dv,), eps=self.eps)
        out = (self.weight * x32.to(o.dtype)) * F.silu(z.reshape(B, T, hv, dv).float())
        return out.to(o.dtype)


class _Conv(nn.Module):
    """Holds the depthwise conv weight as checkpoints store it: `conv1d.weight` [C, 1, K]."""

    def __init__(self, channels: int, taps: int, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, taps, dtype=dtype, device=device))


class GatedDeltaNet(nn.Module):
    def __init__(self, config: Qwen35Config, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        c, kw = config, {"dtype": dtype, "device": device}
        self.hk, self.hv = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.in_proj_qkv = nn.Linear(c.hidden_size, 2 * key_dim + value_dim, bias=False, **kw)
        self.in_proj_z = nn.Linear(c.hidden_size, value_dim, bias=False, **kw)
        self.in_proj_b = nn.Linear(c.hidden_size, self.hv, bias=False, **kw)
        self.in_proj_a = nn.Linear(c.hidden_size, self.hv, bias=False, **kw)
        self.conv1d = _Conv(2 * key_dim + value_dim, c.linear_conv_kernel_dim, **kw)
        self.dt_bias = nn.Parameter(torch.ones(self.hv, **kw))
        self.A_log = nn.Parameter(torch.zeros(self.hv, **kw))
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps, **kw)
        self.out_proj = nn.Linear(value_dim, c.hidden_size, bias=False, **kw)

    def forward(
        self, x: torch.Tensor, state: "Qwen35State", layer: int, step_index: "StepIndex"
    ) -> torch.Tensor:
        # x: [B, T, hidden]; layer: this layer's GDN ordinal in state
        B, T, _ = x.shape
        ix = step_index
        mixed, z, a, b = project(
            self, x, GDN_PROJECTIONS
        )  # [B, T, C], [B, T, Hv*dv], [B, T, Hv] x 2
        y = conv(
            mixed, state.conv[layer], self.conv1d.weight[:, 0], ix.src, ix.dst, ix.reset, ix.counts
        )  # [B, T, C]
        if ix.record:  # what commit replays (see models/qwen35_state.py)
            state.record(layer, ix.lanes, mixed, y, a, b)
        ssm = state.ssm[layer]  # [2 * lanes, Hv, dk, dv] f32
        if ix.cuts is None:
            o = self._recur(y, a, b, ssm, ix.src, ix.dst, ix.reset, ix.counts)
        else:
            o = self._recur_cut(mixed, y, a, b, state, layer, ix)
        from services.worker.models.layers import linear

        return linear(
            self.norm(o.to(x.dtype), z).reshape(B, T, self.hv * self.dv), self.out_proj.weight
        )

    def _recur(self, y, a, b, ssm, src, dst, reset, counts) -> torch.Tensor:
        # The recurrence over y [B, T, C] from ssm[src] into ssm[dst]: o [B, T, Hv, dv].
        kw = {"num_k_heads": self.hk, "key_dim": self.dk}
        if y.shape[1] > CHUNK_MIN_TOKENS:
            q, k, v, g, beta = gdn_ref.gdn_inputs(y, a, b, self.A_log, self.dt_bias, counts, **kw)
            initial = torch.where(reset[:, None, None, None] != 0, 0.0, ssm[src])  # [B, Hv, dk, dv]
            o, final = chunk(q, k, v, g, beta, initial)
            ssm[dst] = final
            return o
        return step(y, a, b, self.A_log, self.dt_bias, ssm, src, dst, reset, counts, **kw)

    def _recur_cut(self, mixed, y, a, b, state: "Qwen35State", layer: int, ix: "StepIndex"):
        # The recurrence in segments that end at the forward's cuts, each continuing the last
        # from ssm[dst]: after each, the cut rows' state goes to their snapshot slots; their conv
        # windows after the cut are columns t .. t+K-2 of [window before the forward | inputs].
        cuts, ssm, T = ix.cuts, state.ssm[layer], y.shape[1]
        outs, p, src, reset = [], 0, ix.src, ix.reset
        for t, rows, slots in zip(cuts.offsets + (T,), cuts.rows + (None,), cuts.slots + (None,)):
            if t > p:
                counts = (ix.counts - p).clamp(0, t - p)
                outs.append(self._recur(y[:, p:t], a[:, p:t], b[:, p:t], ssm, src, ix.dst, reset,
                                        counts))
                p, src, reset = t, ix.dst, torch.zeros_like(ix.reset)
            if rows is not None:
                state.snap_ssm[layer].index_copy_(0, slots, ssm.index_select(0, ix.dst[rows]))
        conv = state.conv[layer]
        r = cuts.all_rows
        before = torch.where(ix.reset[r, None, None] != 0, 0, conv[ix.src[r]])  # [n, C, K-1]
        stream = torch.cat((before.to(mixed.dtype), mixed[r].transpose(1, 2)), dim=2)
        window = gdn_ref.window_after(stream, cuts.all_offsets, conv.shape[2])
        state.snap_conv[layer].index_copy_(0, cuts.all_slots, window.to(conv.dtype))
        return torch.cat(outs, 1)
