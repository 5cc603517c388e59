"""The building blocks of a Qwen3.5 decoder layer (Hugging Face names), shared by the backbone and
the MTP head:

    h   = x + mixer(norm(x))        mixer: GatedDeltaNet (models/gdn.py) or GatedAttention
    out = h + down_proj(silu(gate_proj(m)) * up_proj(m)),  m = norm(h)

Every norm here is zero-centred: x / rms(x) * (1 + w), in float32 (the GDN's gated norm is not).
Gated attention: q_proj yields per head [query; gate]; q and k get a zero-centred RMSNorm per head,
RoPE on their first rotary_dim dimensions; the output is attention * sigmoid(gate), then o_proj.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.models import layers as ops
from services.worker.models.fused_linear import project
from services.worker.models.gdn import GatedDeltaNet
from services.worker.models.layers import ATTENTION_PROJECTIONS, MLP_PROJECTIONS
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.models.rope import apply_rope

if TYPE_CHECKING:
    from services.worker.models.kv_cache import KVCache, PagedRows
    from services.worker.models.qwen35_state import Qwen35State, StepIndex


class Qwen35RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (1 + weight), computed in float32, returned in x's dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype, device=device))
        self.register_buffer("scale", None, persistent=False)
        self.fused = False  # Qwen35Model.fused: one Triton kernel on CUDA (models/layers.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and ops.uses_kernels(x):
            return ops.rms_norm(x, self.weight, self.eps, zero_centered=True)
        scale = self.scale if self.scale is not None else 1.0 + self.weight.float()  # [dim] f32
        return F.rms_norm(x.float(), (x.shape[-1],), scale, self.eps).to(x.dtype)

    def freeze(self) -> None:
        """Precompute 1 + weight in float32 (once the weights are final; saves two ops a call)."""
        self.scale = (1.0 + self.weight.detach().float()).contiguous()


class GatedAttention(nn.Module):
    def __init__(self, config: Qwen35Config, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        c, kw = config, {"dtype": dtype, "device": device}
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.rotary_dim = c.rotary_dim
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, 2 * c.num_heads * c.head_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias, **kw)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=bias, **kw)
        self.q_norm = Qwen35RMSNorm(c.head_dim, c.rms_norm_eps, **kw)
        self.k_norm = Qwen35RMSNorm(c.head_dim, c.rms_norm_eps, **kw)
        self.fused = False  # Qwen35Model.fused: RoPE in place on the normed q and k

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, H, D]; cos, sin: [B, T, rotary_dim/2]: rotate the leading rotary_dim dims only
        r = self.rotary_dim
        return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: "KVCache",
        layer: int,
        rows: "PagedRows",
    ) -> torch.Tensor:
        # x: [B, T, hidden]; cache: the paged KV of the attention layers, `layer` one of them;
        # rows: the forward's view of its KV (cache.rows)
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        qg, k, v = project(self, x, ATTENTION_PROJECTIONS)
        qg = qg.view(B, T, H, 2 * D)
        q, gate = qg[..., :D], qg[..., D:].reshape(B, T, H * D)  # [B, T, H, D], [B, T, H*D]
        k, v = k.view(B, T, self.num_kv_heads, D), v.view(B, T, self.num_kv_heads, D)
        if self.fused:  # norms, then RoPE on the leading rotary_dim dims in place (layers.py)
            q, k = ops.rope(self.q_norm(q), self.k_norm(k), cos, sin)
        else:
            q, k = self._rope(self.q_norm(q), cos, sin), self._rope(self.k_norm(k), cos, sin)
        out = cache.attend(layer, q, k, v, rows)  # [B, T, H, D]
        out = out.reshape(B, T, H * D) * torch.sigmoid(gate)
        if self.fused:
            return ops.linear(out, self.o_proj.weight, self.o_proj.bias)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: Qwen35Config, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        c, kw = config, {"dtype": dtype, "device": device}
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False, **kw)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False, **kw)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False, **kw)
        self.fused = False  # Qwen35Model.fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = getattr(self, f"fused_{MLP_PROJECTIONS[0]}", None)
        if self.fused and weight is not None and ops.uses_kernels(x):  # one GEMM, one SwiGLU kernel
            return ops.linear(ops.swiglu(ops.linear(x, weight)), self.down_proj.weight)
        gate, up = project(self, x, MLP_PROJECTIONS)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """One pre-norm layer; `kind` is "linear_attention" (GDN) or "full_attention"."""

    def __init__(self, config: Qwen35Config, kind: str, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.kind = kind
        self.input_layernorm = Qwen35RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, **kw)
        else:
            self.self_attn = GatedAttention(config, **kw)
        self.post_attention_layernorm = Qwen35RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.mlp = MLP(config, **kw)
        self.fused = False  # Qwen35Model.fused

    def forward(
        self,
        x: torch.Tensor,
        state: "Qwen35State",
        index: int,
        lanes: torch.Tensor,
        *,
        step: "StepIndex | None" = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        rows: "PagedRows | None" = None,
    ) -> torch.Tensor:
        """x: [B, T, hidden]; index: the layer's ordinal among the state's GDN layers (which need
        `step`) or among its KV layers (which need rope and rows = the forward's view of its KV,
        `state.kv.rows`); lanes: [B]."""
        n = self.input_layernorm(x)
        if self.kind == "linear_attention":
            mixed = self.linear_attn(n, state, index, step)
        else:
            cos, sin = rope
            mixed = self.self_attn(n, cos, sin, state.kv, index, rows)
        norm = self.post_attention_layernorm
        if self.fused and ops.uses_kernels(x):  # the residual add fused with the norm
            m, h = ops.add_rms_norm(mixed, x, norm.weight, norm.eps, zero_centered=True)
            return h + self.mlp(m)
        h = x + mixed
        return h + self.mlp(norm(h))
