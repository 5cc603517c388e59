"""A Llama-family dense decoder (Llama, Qwen2, Qwen3) for a serving engine with resident lanes.

Every forward writes the keys and values of its tokens into the preallocated paged `KVCache` at
the given positions of each row's lane, then attends each query at position p to the lane's cached
positions 0..p through the lane's block table (models/kv_cache.py). The same call serves

- prefill of a chunk: tokens [B, T] at positions start_b .. start_b + T - 1, causal inside the chunk
  and attending to what earlier chunks cached;
- batched decode: T = 1, each row at its own position;
- verification of K drafted tokens: T = K + 1.

Rows shorter than T are padded on the right with any token at the following positions (still
< max_len): the padding writes cache slots beyond the row's last real token, which no real query
reads before the row's next forward overwrites them. Their logits are meaningless.

Module and parameter names follow Hugging Face (`model.layers.3.self_attn.q_proj.weight`), so a
checkpoint's state dict loads as is. Per block (pre-norm):

    h = x + o_proj(attention(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n))),
        n = norm(x)
    out = h + down_proj(silu(gate_proj(m)) * up_proj(m)),  m = norm(h)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu_gemv import QuantizedMatrix
from services.worker.models import layers as ops
from services.worker.models.config import ModelConfig
from services.worker.models.fused_linear import fuse_linears, project
from services.worker.models.kv_cache import KVCache, PagedRows
from services.worker.models.layers import ATTENTION_PROJECTIONS, MLP_PROJECTIONS
from services.worker.models.rope import apply_rope, inverse_frequencies, rope_cos_sin


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the statistics in float32."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Embedding(nn.Module):
    """Token embedding [vocab, hidden]; left uninitialised (the loaders always fill it), which also
    keeps construction on `meta` free of the random-init path."""

    def __init__(self, vocab: int, dim: int, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim, dtype=dtype, device=device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        c = config
        kw = {"dtype": dtype, "device": device}
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias, **kw)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias, **kw)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias, **kw)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias, **kw)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **kw)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **kw)
        else:
            self.q_norm = self.k_norm = None
        self.fused = False  # DenseDecoder.fuse_projections sets it
        # "qkv", "o_proj": the block-format matrices of the fused GEMMs (gguf_loading)
        self.quantized: dict[str, QuantizedMatrix | None] = {}

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        rows: PagedRows,
    ) -> torch.Tensor:
        # x: [B, T, hidden]; cos, sin: [B, T, D/2]; rows: the forward's view of its KV (cache.rows)
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)  # [B, T, H, D], [B, T, Hkv, D], [B, T, Hkv, D]
        out = cache.attend(layer, q, k, v, rows)  # [B, T, H, D]
        out = out.reshape(B, T, self.num_heads * self.head_dim)
        if self.fused:
            return ops.linear(out, self.o_proj.weight, self.o_proj.bias,
                              self.quantized.get("o_proj"))
        return self.o_proj(out)

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """q, k (normed when the model has q/k norms, rotated) and v of x [B, T, hidden]."""
        B, T, _ = x.shape
        if not self.fused:  # the op-by-op path (the benchmarks' "before")
            q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # [B, T, H, D]
            k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, D]
            v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, D]
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v
        # views of one [B, T, (H + 2Hkv) D] GEMM
        q, k, v = project(self, x, ATTENTION_PROJECTIONS, self.quantized.get("qkv"))
        q = q.view(B, T, self.num_heads, self.head_dim)
        k = k.view(B, T, self.num_kv_heads, self.head_dim)
        v = v.view(B, T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = ops.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            k = ops.rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        q, k = ops.rope(q, k, cos, sin)
        return q, k, v


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        c, kw = config, {"dtype": dtype, "device": device}
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias, **kw)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias, **kw)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, **kw)
        self.fused = False  # DenseDecoder.fuse_projections sets it
        # "gate_up", "down_proj": the block-format matrices of the fused GEMMs (gguf_loading)
        self.quantized: dict[str, QuantizedMatrix | None] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        weight = getattr(self, f"fused_{MLP_PROJECTIONS[0]}")
        gate_up = ops.linear(
            x, weight, getattr(self, f"fused_{MLP_PROJECTIONS[0]}_bias"),
            self.quantized.get("gate_up"),
        )  # [..., 2I]
        return ops.linear(ops.swiglu(gate_up), self.down_proj.weight, self.down_proj.bias,
                          self.quantized.get("down_proj"))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.self_attn = Attention(config, **kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.mlp = MLP(config, **kw)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(DecoderLayer(config, **kw) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)


class DenseDecoder(nn.Module):
    """The whole causal LM. `forward(tokens, positions, cache, lanes) -> logits`.

    Parameters are named as in Hugging Face checkpoints; with tied embeddings there is no
    `lm_head` and the logits use `model.embed_tokens.weight`.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        kw = {"dtype": dtype, "device": device}
        self.model = Backbone(config, **kw)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False, **kw)
        w, self.rope_scaling = inverse_frequencies(config.rope, config.head_dim)
        self.register_buffer("rope_w", w.to(device=device), persistent=False)  # [D/2] float32
        self.source_path: str | None = None  # checkpoint directory or GGUF file, set by the loaders
        self.quantized_output: QuantizedMatrix | None = None  # output_weight as stored (GGUF)
        self._fused = False

    def reset_rope(self, device: torch.device | str) -> None:
        """Recompute the RoPE frequencies on `device` (after loading a model built on `meta`)."""
        w, self.rope_scaling = inverse_frequencies(self.config.rope, self.config.head_dim)
        self.rope_w = w.to(device)

    def fuse_projections(self) -> None:
        """Compute q|k|v and gate|up with one GEMM each (models/fused_linear.py: the children's
        parameters become row slices of the fused matrix, no memory duplicated, state_dict
        unchanged) and take the fused path (models/layers.py). Call once the weights are final
        and on their device; the loaders do."""
        for layer in self.model.layers:
            if getattr(layer.self_attn, f"fused_{ATTENTION_PROJECTIONS[0]}", None) is None:
                fuse_linears(layer.self_attn, ATTENTION_PROJECTIONS)
                fuse_linears(layer.mlp, MLP_PROJECTIONS)
        self.fused = True

    @property
    def fused(self) -> bool:
        """Whether forwards take the fused path (set by `fuse_projections`); False runs the
        original op-by-op code on the same weights (the benchmarks' "before")."""
        return self._fused

    @fused.setter
    def fused(self, value: bool) -> None:
        if value and getattr(self.model.layers[0].self_attn, f"fused_{ATTENTION_PROJECTIONS[0]}",
                             None) is None:
            raise ValueError("fused: call fuse_projections() first")
        self._fused = bool(value)
        for layer in self.model.layers:
            layer.self_attn.fused = layer.mlp.fused = self._fused

    def max_len_for_budget(self, lanes: int, budget_bytes: int, dtype: torch.dtype, *,
                           verify_width: int = 0) -> int:
        """The longest lanes whose KV fits `budget_bytes`, capped at the model's context. Raises
        ValueError when not even one position per lane fits. `verify_width` costs nothing here
        (as in `new_state`)."""
        per_lane = KVCache.positions_for_budget(self.config, max(lanes, 1), budget_bytes, dtype)
        if per_lane <= 0:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no position for {lanes} "
                f"lanes ({KVCache.bytes_per_token(self.config, dtype)} bytes per token)"
            )
        return min(per_lane, self.config.max_position_embeddings)

    def new_state(self, lanes: int, max_len: int, *, dtype: torch.dtype,
                  device: torch.device | str, num_blocks: int | None = None,
                  verify_width: int = 0) -> KVCache:
        """The per-lane state of this model: its paged KV cache (models/state.py; num_blocks:
        default the lanes' full length, see `KVCache.create`). `verify_width` (the widest
        verification) needs nothing here: KV past the kept positions is overwritten."""
        return KVCache.allocate(self.config, lanes, max_len, dtype, device, num_blocks=num_blocks)

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head matrix [vocab, hidden] (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def hidden_states(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                      lanes: torch.Tensor, *, kv_len: int | None = None,
                      num_tokens: torch.Tensor | None = None,
                      tap: tuple[int, ...] = ()) -> torch.Tensor:
        """Final normed hidden states [B, T, hidden] after writing this chunk into `cache`.

        tokens, positions: [B, T] int64; lanes: [B] int64, distinct; kv_len: a host-side bound with
        every position < kv_len <= cache.max_len (default cache.max_len); attention reads each row
        through its block table up to the row's own position. tap: layer ids whose outputs (the
        residual stream after the layer) are also returned, concatenated in that order: (final,
        [B, T, len(tap) * hidden]) (a draft model's conditioning, models/dflash.py). num_tokens:
        real tokens per row, taken for the hybrid model's signature: a dense model needs no bound
        (padding writes only uncommitted slots).
        """
        B, T = tokens.shape
        L = cache.max_len if kv_len is None else kv_len
        assert positions.shape == (B, T) and lanes.shape == (B,), (positions.shape, lanes.shape)
        assert 0 < L <= cache.max_len and cache.num_layers == self.config.num_layers
        cos, sin = rope_cos_sin(self.rope_w, positions, self.rope_scaling)  # [B, T, D/2] each
        rows = cache.rows(lanes, positions, L)
        x = self.model.embed_tokens(tokens)  # [B, T, hidden]
        if self._fused:
            return self._fused_layers(x, cos, sin, cache, rows, tap)
        taps = {}
        for i, layer in enumerate(self.model.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, cache, i, rows)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in tap:
                taps[i] = x
        if tap:
            return self.model.norm(x), torch.cat([taps[i] for i in tap], dim=-1)
        return self.model.norm(x)

    def _fused_layers(self, x, cos, sin, cache, rows, tap):
        # The residual stream h is carried beside each sublayer's output `out`; every residual
        # add is fused with the norm that follows it: (n, h) = add_rms_norm(out, h). The stream
        # after layer i (what `tap` returns) is the h that layer i + 1's first add_rms_norm (or
        # the final norm) forms.
        eps = self.config.rms_norm_eps
        layers = self.model.layers
        h = x
        n = ops.rms_norm(x, layers[0].input_layernorm.weight, eps)
        taps = {}
        for i, layer in enumerate(layers):
            out = layer.self_attn(n, cos, sin, cache, i, rows)
            n, h = ops.add_rms_norm(out, h, layer.post_attention_layernorm.weight, eps)
            out = layer.mlp(n)
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            n, h = ops.add_rms_norm(out, h, nxt.weight, eps)
            if i in tap:
                taps[i] = h
        if tap:
            return n, torch.cat([taps[i] for i in tap], dim=-1)
        return n

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., vocab] in the model's dtype."""
        if self.fused:
            return ops.linear(hidden, self.output_weight, None, self.quantized_output)
        return F.linear(hidden, self.output_weight)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        lanes: torch.Tensor,
        *,
        kv_len: int | None = None,
        logit_index: torch.Tensor | None = None,
        num_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, vocab] of a prefill chunk or decode step (see `hidden_states` for the
        arguments). With logit_index: [B, S] int64 indices into T, only those columns: [B, S, vocab]
        (e.g. each row's last real token of a padded prefill chunk). num_tokens: [B] real tokens
        per row; a dense model needs no such bound (padding writes only uncommitted slots)."""
        hidden = self.hidden_states(
            tokens, positions, cache, lanes, kv_len=kv_len
        )  # [B, T, hidden]
        if logit_index is not None:
            hidden = hidden.gather(
                1, logit_index[:, :, None].expand(-1, -1, hidden.shape[-1])
            )  # [B, S, hidden]
        return self.logits(hidden)
