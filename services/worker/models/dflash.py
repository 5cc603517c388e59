"""DFlash and DFlash2 draft models (block drafters over the target's hidden states), loaded from a
checkpoint directory.

A stack of Qwen3-style layers conditioned on the target's hidden states. Per round and row:

    context c = hidden_norm(fc([h_{l1}; ...; h_{ln}]))     target layer outputs at target_layer_ids
    each layer's k_norm(k_proj(c)) and v_proj(c) at the context positions: extra K/V, cached
                per lane
    block  x = embed([anchor, MASK x K]) at positions p .. p+K (the target's embedding)
    each layer: queries from the block only; keys/values = cached context (< p) + the block's own,
                non-causal; sliding-window layers see keys within `sliding_window` positions
    drafts = argmax lm_head(norm(x))[1..K]       (the target's head, x output_multiplier, softcap)

DFlash2 adds (switched on by the checkpoint) a two-tap grouped dynamic causal convolution before
and after each attention and MLP sublayer (`attention_conv`, `mlp_conv`: out[i, c] = sum_t
(base[t, c] + delta[i, t, g(c)]) x[i-t, c], group size 16, delta from `kernel_projection` of the
sublayer's normed input), and a candidate selector that keeps the target head's top-16 per slot
and walks them from the anchor with edge(p -> c) = <A[p] * proj(h), B[c]> + logit(c): greedy at
T = 0, sampled at T > 0, returning the real q over the 16 candidates.

Tensor names as the checkpoints spell them (`layers.0.self_attn.q_proj.weight`, `fc.weight`,
`hidden_norm.weight`, `norm.weight`, `layers.N.attention_conv.base_kernel`,
`candidate_selector.predecessor_codebook`, ...); config.json with `dflash_config`
(`target_layer_ids`, `mask_token_id`, `block_size`, ...).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.models.config import RopeConfig
from services.worker.models.dense import RMSNorm
from services.worker.models.rope import apply_rope, inverse_frequencies, rope_cos_sin


class DraftConfigError(ValueError):
    """A draft checkpoint directory whose config or tensors this loader cannot use."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int  # drafts per block = block_size - 1
    vocab_size: int
    sliding: tuple[bool, ...]  # per layer: a sliding-window layer
    sliding_window: int | None
    attention_bias: bool = False
    output_multiplier: float = 1.0
    softcap: float | None = None
    dflash2: bool = False
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16

    @classmethod
    def from_dict(cls, raw: dict) -> "DFlashConfig":
        """Raises DraftConfigError naming the field for a missing or invalid value."""
        d = raw.get("dflash_config") or {}

        def get(name, default=None):
            value = d.get(name, raw.get(name, default))
            if value is None and default is None:
                raise DraftConfigError(name, "missing from config.json")
            return value

        layers = int(get("num_hidden_layers"))
        types = raw.get("layer_types") or ["full_attention"] * layers
        if len(types) != layers or any(
            t not in ("full_attention", "sliding_attention") for t in types
        ):
            raise DraftConfigError("layer_types", f"expected {layers} of full_attention / "
                                   f"sliding_attention, got {types}")
        rope = raw.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 1e6)))
        if rope.get("rope_type", "default") != "default":
            raise DraftConfigError("rope_parameters", "only default RoPE is supported")
        ids = tuple(int(i) for i in get("target_layer_ids"))
        heads = int(get("num_attention_heads"))
        arch = " ".join(raw.get("architectures") or [])
        dflash2 = "DFlash2" in arch or "selector_top_k" in d
        cfg = cls(hidden_size=int(get("hidden_size")),
                  intermediate_size=int(get("intermediate_size")), num_layers=layers,
                  num_heads=heads, num_kv_heads=int(get("num_key_value_heads", heads)),
                  head_dim=int(get("head_dim", int(get("hidden_size")) // heads)),
                  rms_norm_eps=float(get("rms_norm_eps", 1e-6)), rope=RopeConfig(theta=theta),
                  target_layer_ids=ids, mask_token_id=int(get("mask_token_id")),
                  block_size=int(get("block_size", 16)), vocab_size=int(get("vocab_size")),
                  sliding=tuple(t == "sliding_attention" for t in types),
                  sliding_window=raw.get("sliding_window"),
                  attention_bias=bool(raw.get("attention_bias", False)),
                  output_multiplier=float(d.get("output_multiplier", 1.0)),
                  softcap=d.get("final_logit_softcapping"), dflash2=dflash2,
                  conv_kernel_size=int(d.get("conv_kernel_size", 2)),
                  conv_group_size=int(d.get("conv_group_size", 16)),
                  selector_rank=int(d.get("selector_rank", 256)),
                  selector_top_k=int(d.get("selector_top_k", 16)))
        if not ids or cfg.block_size < 2:
            raise DraftConfigError("dflash_config", "needs target_layer_ids and block_size >= 2")
        if cfg.hidden_size % cfg.conv_group_size and dflash2:
            raise DraftConfigError("conv_group_size", "must divide hidden_size")
        return cfg


class GroupedDynamicConv(nn.Module):
    """The two-tap grouped dynamic causal convolution of DFlash2 (prepare before a sublayer,
    finish after it, both with deltas from the sublayer's normed input)."""

    def __init__(self, c: DFlashConfig, dtype, device) -> None:
        super().__init__()
        self.taps, self.group = c.conv_kernel_size, c.conv_group_size
        groups = c.hidden_size // c.conv_group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, self.taps, c.hidden_size, dtype=dtype,
                                                    device=device))
        self.kernel_projection = nn.Linear(c.hidden_size, 2 * self.taps * groups, bias=False,
                                           dtype=dtype, device=device)

    def deltas(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, H] -> [B, S, 2, taps, groups]
        return self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, -1)

    def apply(self, x: torch.Tensor, delta: torch.Tensor, phase: int) -> torch.Tensor:
        # out[i, c] = sum_t (base[phase, t, c] + delta[i, t, g(c)]) * x[i - t, c]; x: [B, S, H]
        B, S, H = x.shape
        out = torch.zeros_like(x)
        for t in range(self.taps):
            shifted = x if t == 0 else F.pad(x[:, :-t], (0, 0, t, 0))  # x[i - t], zero before 0
            d = delta[:, :, phase, t].repeat_interleave(self.group, dim=-1)  # [B, S, H]
            out = out + (self.base_kernel[phase, t] + d).to(x.dtype) * shifted
        return out


class DraftLayer(nn.Module):
    def __init__(self, c: DFlashConfig, sliding: bool, dtype, device) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        H, D = c.hidden_size, c.head_dim
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, D
        self.window = c.sliding_window if sliding else None
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps, **kw)
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps, **kw)
        attn = nn.Module()
        attn.q_proj = nn.Linear(H, c.num_heads * D, bias=c.attention_bias, **kw)
        attn.k_proj = nn.Linear(H, c.num_kv_heads * D, bias=c.attention_bias, **kw)
        attn.v_proj = nn.Linear(H, c.num_kv_heads * D, bias=c.attention_bias, **kw)
        attn.o_proj = nn.Linear(c.num_heads * D, H, bias=c.attention_bias, **kw)
        attn.q_norm = RMSNorm(D, c.rms_norm_eps, **kw)
        attn.k_norm = RMSNorm(D, c.rms_norm_eps, **kw)
        self.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(H, c.intermediate_size, bias=False, **kw)
        mlp.up_proj = nn.Linear(H, c.intermediate_size, bias=False, **kw)
        mlp.down_proj = nn.Linear(c.intermediate_size, H, bias=False, **kw)
        self.mlp = mlp
        self.attention_conv = GroupedDynamicConv(c, dtype, device) if c.dflash2 else None
        self.mlp_conv = GroupedDynamicConv(c, dtype, device) if c.dflash2 else None

    def context_kv(self, ctx: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        # ctx: [B, T, H] -> keys, values [B, T, Hkv, D] (keys normed and rotated)
        a = self.self_attn
        B, T, _ = ctx.shape
        k = a.k_norm(a.k_proj(ctx).view(B, T, self.kv_heads, self.head_dim))
        return apply_rope(k, cos, sin), a.v_proj(ctx).view(B, T, self.kv_heads, self.head_dim)

    def forward(self, x, cos, sin, ctx_k, ctx_v, ctx_visible, q_pos, k_pos) -> torch.Tensor:
        # x: [B, S, H] block; ctx_k/v: [B, L, Hkv, D]; ctx_visible: [B, 1, 1, L] bool
        a = self.self_attn
        B, S, _ = x.shape
        n = self.input_layernorm(x)
        if self.attention_conv is not None:
            delta = self.attention_conv.deltas(n)
            n = self.attention_conv.apply(n, delta, 0)
        q = apply_rope(a.q_norm(a.q_proj(n).view(B, S, self.heads, self.head_dim)), cos, sin)
        k, v = self.context_kv(n, cos, sin)
        keys = torch.cat([ctx_k.to(k.dtype), k], 1).transpose(1, 2)  # [B, Hkv, L+S, D]
        values = torch.cat([ctx_v.to(v.dtype), v], 1).transpose(1, 2)
        visible = torch.cat([ctx_visible.expand(B, 1, S, -1),
                             torch.ones(B, 1, S, S, dtype=torch.bool, device=x.device)], -1)
        if self.window is not None:  # keys within the window of each query (both directions)
            visible = visible & ((q_pos[:, None, :, None] - k_pos[:, None, None, :]).abs()
                                 < self.window)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=visible,
                                             enable_gqa=self.heads != self.kv_heads)
        out = a.o_proj(out.transpose(1, 2).reshape(B, S, -1))
        if self.attention_conv is not None:
            out = self.attention_conv.apply(out, delta, 1)
        x = x + out
        n = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            delta = self.mlp_conv.deltas(n)
            n = self.mlp_conv.apply(n, delta, 0)
        out = self.mlp.down_proj(F.silu(self.mlp.gate_proj(n)) * self.mlp.up_proj(n))
        if self.mlp_conv is not None:
            out = self.mlp_conv.apply(out, delta, 1)
        return x + out


class CandidateSelector(nn.Module):
    def __init__(self, c: DFlashConfig, dtype, device) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.top_k = c.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_rank, **kw))
        self.successor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_rank, **kw))
        self.hidden_projection = nn.Linear(c.hidden_size, c.selector_rank, bias=False, **kw)


class DFlashDraft(nn.Module):
    """The draft model (see the module docstring); `config.dflash2` adds convs and selector."""

    def __init__(self, config: DFlashConfig, dtype=None, device=None) -> None:
        super().__init__()
        c = self.config = config
        kw = {"dtype": dtype, "device": device}
        self.layers = nn.ModuleList(DraftLayer(c, s, **kw) for s in c.sliding)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, **kw)
        self.fc = nn.Linear(
            len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False, **kw
        )
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, **kw)
        self.candidate_selector = CandidateSelector(c, **kw) if c.dflash2 else None
        w, self.rope_scaling = inverse_frequencies(c.rope, c.head_dim)
        self.register_buffer("rope_w", w.to(device=device), persistent=False)

    def new_cache(self, lanes: int, max_len: int, *, dtype, device) -> torch.Tensor:
        """The per-lane context K/V: [layers, 2, lanes, max_len, Hkv, D], zero-filled."""
        c = self.config
        return torch.zeros(c.num_layers, 2, lanes, max_len, c.num_kv_heads, c.head_dim,
                           dtype=dtype, device=device)

    def cache_bytes_per_position(self, dtype: torch.dtype) -> int:
        """Bytes of `new_cache` per lane position (what the KV budget pays for it)."""
        c = self.config
        return c.num_layers * 2 * c.num_kv_heads * c.head_dim * dtype.itemsize

    def write_context(self, feats: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
                      lanes: torch.Tensor) -> None:
        """feats: [B, T, n*H] target features at `positions` [B, T] of `lanes` [B]: their K/V
        into every layer's context cache (later positions stay as they are)."""
        ctx = self.hidden_norm(self.fc(feats))  # [B, T, H]
        cos, sin = rope_cos_sin(self.rope_w, positions, self.rope_scaling)
        for i, layer in enumerate(self.layers):
            k, v = layer.context_kv(ctx, cos, sin)
            cache[i, 0][lanes[:, None], positions] = k.to(cache.dtype)
            cache[i, 1][lanes[:, None], positions] = v.to(cache.dtype)

    def block(
        self,
        embedded: torch.Tensor,
        positions: torch.Tensor,
        cache: torch.Tensor,
        lanes: torch.Tensor,
        context_len: torch.Tensor,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """embedded: [B, S, H] block input at `positions` [B, S]; each row sees its lane's
        context positions < context_len[b] (its anchor's position). kv_len: a host-side bound
        >= every context_len (default: their maximum, read from the device; a CUDA graph passes
        the lane length). Returns normed [B, S, H]."""
        L = int(context_len.max()) if kv_len is None else kv_len
        cos, sin = rope_cos_sin(self.rope_w, positions, self.rope_scaling)
        slots = torch.arange(max(L, 1), device=embedded.device)
        ctx_visible = (slots[None, :] < context_len[:, None])[:, None, None, :]  # [B, 1, 1, L]
        k_pos = torch.cat([slots[None].expand(len(lanes), -1), positions], 1)  # [B, L+S]
        x = embedded
        for i, layer in enumerate(self.layers):
            ck = cache[i, 0][lanes, :max(L, 1)]
            cv = cache[i, 1][lanes, :max(L, 1)]
            x = layer(x, cos, sin, ck, cv, ctx_visible, positions, k_pos)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """The target head's logits of draft hidden states, x output_multiplier, softcapped."""
        z = F.linear(hidden, head).float() * self.config.output_multiplier
        cap = self.config.softcap
        return torch.tanh(z / cap) * cap if cap else z

    def select(self, hidden: torch.Tensor, z: torch.Tensor, anchor: torch.Tensor,
               temperature: torch.Tensor, uniforms: torch.Tensor):
        """DFlash2's walk over the top-k candidates of each slot. hidden: [B, S, H] and z:
        [B, S, V] of the draft slots; anchor: [B]; temperature: [B] (0 = greedy); uniforms: [B, S]
        in [0, 1). Returns (drafts [B, S] int64, candidate ids [B, S, k] int32, q [B, S, k]
        float32: the distribution each draft was drawn from)."""
        sel = self.candidate_selector
        unary, cand = torch.topk(z, sel.top_k, dim=-1)  # [B, S, k]
        proj = sel.hidden_projection(hidden).float()  # [B, S, r]
        pred = anchor
        path, qs = [], []
        for s in range(z.shape[1]):
            a = sel.predecessor_codebook[pred].float() * proj[:, s]  # [B, r]
            succ = sel.successor_codebook[cand[:, s]].float()  # [B, k, r]
            scores = unary[:, s] + torch.einsum("br,bkr->bk", a, succ)  # [B, k]
            greedy = temperature <= 0
            t = torch.where(greedy, 1.0, temperature)[:, None]
            q = torch.softmax(scores / t, dim=-1)
            q = torch.where(greedy[:, None], F.one_hot(scores.argmax(-1), sel.top_k).float(), q)
            cdf = torch.cumsum(q, -1)
            idx = (cdf <= uniforms[:, s, None] * cdf[:, -1:]).sum(-1).clamp(max=sel.top_k - 1)
            idx = torch.where(greedy, scores.argmax(-1), idx)
            pred = cand[:, s].gather(1, idx[:, None])[:, 0]
            path.append(pred)
            qs.append(q)
        return torch.stack(path, 1), cand.to(torch.int32), torch.stack(qs, 1)


def load_dflash(path: str, *, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> DFlashDraft:
    """The draft model of checkpoint directory `path` (config.json, *.safetensors). Raises
    FileNotFoundError for missing files, DraftConfigError for an unusable config or a tensor
    that is missing, unexpected or of the wrong shape."""
    from services.worker.models.hf_loading import read_safetensors

    config_path = os.path.join(path, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = DFlashConfig.from_dict(json.load(f))
    tensors = read_safetensors(path)
    model = DFlashDraft(config, dtype=dtype, device=device)
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing or extra:
        raise DraftConfigError("tensors", f"missing {missing[:4]}, unexpected {extra[:4]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise DraftConfigError(name, f"shape {tuple(tensor.shape)}, expected "
                                   f"{tuple(own[name].shape)}")
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})
    model.rope_w = model.rope_w.to(device)
    return model.eval().requires_grad_(False)
