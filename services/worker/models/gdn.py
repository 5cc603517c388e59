"""The Gated DeltaNet token mixer of Qwen3.5 (Hugging Face names: `linear_attn.in_proj_qkv`, ...).

Per layer, for x: [B, T, hidden] (notes/models.md section 4):

    [q; k; v] = silu(causal_conv1d(in_proj_qkv(x)))       depthwise, K taps, continuing the lane's window
    q, k      = l2norm(q) * dk^-1/2, l2norm(k)            float32, per key head
    beta      = sigmoid(in_proj_b(x)),  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
    o         = gated delta rule(q, k, v, g, beta) from the lane's recurrent state (float32)
    out       = out_proj(rmsnorm(o) * norm.weight * silu(in_proj_z(x)))   per value head

Right-padded tokens (t >= num_tokens[b]) get g = beta = 0, which leaves the recurrent state bit for
bit unchanged, and never enter the conv window. Dispatch: Triton kernels on CUDA (kernels/gdn.py,
kernels/conv.py; fla-core's chunked kernel for prefill when installed), the torch references of
kernels/gdn_ref.py elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kernels import gdn_ref
from services.worker.models.qwen35_config import Qwen35Config

if TYPE_CHECKING:
    from services.worker.models.qwen35_state import Qwen35State, StepIndex

# Forwards longer than this run the chunked form (prefill); shorter ones the per-token recurrence.
CHUNK_MIN_TOKENS = 32


def recurrent(q, k, v, g, beta, state, src, dst, reset, skip=None):
    """`gdn_recurrent` of kernels/gdn.py on CUDA, its torch reference elsewhere (same arguments)."""
    if state.is_cuda:
        from kernels.gdn import gdn_recurrent

        return gdn_recurrent(q, k, v, g, beta, state, src, dst, reset, skip)
    return gdn_ref.gdn_recurrent_ref(q, k, v, g, beta, state, src, dst, reset, skip)


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

        return gdn_chunk(q, k, v, g, beta, initial)
    return gdn_ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, initial)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim, float32 (the eps of transformers and fla)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedRMSNorm(nn.Module):
    """rmsnorm(x) * weight * silu(gate) per head: statistics in float32, weight applied in x's dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = (self.weight * x32.to(x.dtype)) * F.silu(gate.float())
        return out.to(x.dtype)


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

    def forward(self, x: torch.Tensor, state: "Qwen35State", layer: int, step: "StepIndex") -> torch.Tensor:
        # x: [B, T, hidden]; layer: this layer's GDN ordinal in state
        B, T, _ = x.shape
        mixed = self.in_proj_qkv(x)  # [B, T, C]
        if step.record:
            state.rx[layer, step.lanes, :T] = mixed
        y = conv(mixed, state.conv[layer], self.conv1d.weight[:, 0], step.src, step.dst, step.reset,
                 step.counts)  # [B, T, C]
        key_dim = self.hk * self.dk
        q = l2norm(y[..., :key_dim].reshape(B, T, self.hk, self.dk)) * self.dk ** -0.5  # [B, T, Hk, dk] f32
        k = l2norm(y[..., key_dim:2 * key_dim].reshape(B, T, self.hk, self.dk))  # [B, T, Hk, dk] f32
        v = y[..., 2 * key_dim:].reshape(B, T, self.hv, self.dv)  # [B, T, Hv, dv]
        valid = step.valid[:, :, None]  # [B, T, 1]
        beta = torch.sigmoid(self.in_proj_b(x)).float() * valid  # [B, T, Hv] f32
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float()) * valid
        if step.record:
            state.rk[layer, step.lanes, :T] = k
            state.rv[layer, step.lanes, :T] = v
            state.rg[layer, step.lanes, :T] = g
            state.rbeta[layer, step.lanes, :T] = beta
        ssm = state.ssm[layer]  # [lanes * slots, Hv, dk, dv] f32
        if T > CHUNK_MIN_TOKENS:
            initial = torch.where(step.reset[:, None, None, None] != 0, 0.0, ssm[step.src])  # [B, Hv, dk, dv]
            o, final = chunk(q, k, v, g, beta, initial)
            ssm[step.dst] = final
        else:
            o = recurrent(q, k, v, g, beta, ssm, step.src, step.dst, step.reset)  # [B, T, Hv, dv]
        z = self.in_proj_z(x).reshape(B, T, self.hv, self.dv)
        return self.out_proj(self.norm(o.to(x.dtype), z).reshape(B, T, self.hv * self.dv))
