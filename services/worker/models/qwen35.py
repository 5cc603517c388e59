"""The Qwen3.5 text model (hybrid Gated DeltaNet + gated attention, dense MLP) for a serving engine
with resident lanes, and its MTP module.

The model owns its per-lane state (`new_state`, models/qwen35_state.py). One call serves chunked
prefill (T = chunk), decode (T = 1) and verification of drafts (T = K + 1 <= verify_width):

    logits = model(tokens, positions, state, lanes, kv_len=None, logit_index=None, num_tokens=None)

Rows are right-padded to T; `num_tokens[b]` real tokens per row (None: all T). Padding never changes
a lane's recurrent state or conv window; its attention keys land beyond the row's last real
position, where no real query reads them before they are overwritten; its logits are meaningless.
A row whose first position is 0 starts its lane afresh (a reused lane keeps nothing of its
previous request). `state.commit(lanes, kept)` then keeps each row's state after its first kept[b]
tokens (all of them in ordinary decoding; the accepted prefix after a verification); a step never
committed leaves the committed state as it was (models/state.py).

Parameter names follow Hugging Face's `Qwen3_5ForCausalLM` (`model.layers.0.linear_attn.A_log`),
plus `mtp.*` for the MTP module when the checkpoint has it; with tied embeddings there is no
`lm_head` and the logits use `model.embed_tokens.weight`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.models.dense import Embedding
from services.worker.models.mtp_head import MTPHead
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.models.qwen35_layers import DecoderLayer, Qwen35RMSNorm
from services.worker.models.qwen35_state import Qwen35State
from services.worker.models.rope import inverse_frequencies, rope_cos_sin


class Backbone(nn.Module):
    def __init__(self, config: Qwen35Config, dtype: torch.dtype | None, device) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(DecoderLayer(config, kind, **kw) for kind in config.layer_types)
        self.norm = Qwen35RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)


class Qwen35Model(nn.Module):
    """The causal LM; `mtp=True` adds the MTP module (`mtp.*` weights)."""

    def __init__(self, config: Qwen35Config, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, *, mtp: bool = False) -> None:
        super().__init__()
        self.config = config
        kw = {"dtype": dtype, "device": device}
        self.model = Backbone(config, **kw)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False, **kw)
        self.mtp = MTPHead(config, **kw) if mtp else None
        # Ordinal of each layer among its kind: the index of its GDN state or of its KV.
        counters = {"linear_attention": 0, "full_attention": 0}
        self._index = []
        for kind in config.layer_types:
            self._index.append(counters[kind])
            counters[kind] += 1
        w, self.rope_scaling = inverse_frequencies(config.rope, config.rotary_dim)
        self.register_buffer(
            "rope_w", w.to(device=device), persistent=False
        )  # [rotary_dim/2] float32
        self.source_path: str | None = None  # checkpoint directory, set by the loader

    def fuse_projections(self) -> None:
        """Compute each layer's input projections with one GEMM (models/fused_linear.py): GDN
        in_proj_qkv/z/a/b, attention q/k/v, MLP gate/up; and precompute the norms' scales. Call
        once the weights are final and on their device; names and state_dict are unchanged."""
        from services.worker.models.fused_linear import fuse_linears
        from services.worker.models.gdn import GDN_PROJECTIONS
        from services.worker.models.qwen35_layers import ATTENTION_PROJECTIONS, MLP_PROJECTIONS

        layers = list(self.model.layers) + (list(self.mtp.layers) if self.mtp is not None else [])
        for layer in layers:
            if layer.kind == "linear_attention":
                fuse_linears(layer.linear_attn, GDN_PROJECTIONS)
            else:
                fuse_linears(layer.self_attn, ATTENTION_PROJECTIONS)
            fuse_linears(layer.mlp, MLP_PROJECTIONS)
        for module in self.modules():
            if isinstance(module, Qwen35RMSNorm):
                module.freeze()
        self.fused = True

    @property
    def fused(self) -> bool:
        """Whether the layers take the fused path of models/layers.py on CUDA (Triton norms, the
        residual add fused with the post-attention norm, RoPE in place, SwiGLU); set by
        `fuse_projections`. False keeps the op-by-op code on the same (projection-fused) weights,
        the benchmarks' "before"."""
        return getattr(self, "_fused", False)

    @fused.setter
    def fused(self, value: bool) -> None:
        self._fused = bool(value)
        for module in self.modules():
            if (
                module is not self
                and hasattr(module, "fused")
                and not isinstance(module, Qwen35Model)
            ):
                module.fused = self._fused

    def reset_rope(self, device: torch.device | str) -> None:
        """Recompute the RoPE frequencies on `device` (after loading a model built on `meta`)."""
        w, self.rope_scaling = inverse_frequencies(self.config.rope, self.config.rotary_dim)
        self.rope_w = w.to(device)

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head matrix [vocab, hidden] (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def new_state(self, lanes: int, max_len: int, *, dtype: torch.dtype, device: torch.device | str,
                  verify_width: int = 0, num_blocks: int | None = None) -> Qwen35State:
        """Allocate the state of `lanes` lanes of `max_len` positions (paged KV of `num_blocks`
        blocks, default the lanes' full length; GDN states, the MTP layer's KV when present, and
        what verifying up to `verify_width` tokens needs). Raises ValueError for non-positive
        sizes."""
        return Qwen35State(
            self.config,
            lanes,
            max_len,
            dtype=dtype,
            device=device,
            verify_width=verify_width,
            mtp=self.mtp is not None,
            gates=self._gates(),
            num_blocks=num_blocks,
        )

    def max_len_for_budget(self, lanes: int, budget_bytes: int, dtype: torch.dtype, *,
                           verify_width: int = 0) -> int:
        """The longest lanes whose state fits `budget_bytes` (per-lane fixed bytes first, then
        positions), capped at the model's context. Raises ValueError when not even one position
        per lane fits."""
        n = Qwen35State.max_len_for_budget(
            self.config,
            lanes,
            budget_bytes,
            dtype,
            verify_width=verify_width,
            mtp=self.mtp is not None,
        )
        if n <= 0:
            per_token, per_lane = self.state_sizes(dtype, verify_width=verify_width)
            raise ValueError(
                f"a state budget of {budget_bytes} bytes holds no position for {lanes} lanes "
                f"({per_lane} bytes per lane + {per_token} per position)"
            )
        return min(n, self.config.max_position_embeddings)

    def state_sizes(self, dtype: torch.dtype, *, verify_width: int = 0) -> tuple[int, int]:
        """(bytes per cached position of a lane, fixed bytes per lane) of `new_state`'s layout."""
        mtp = self.mtp is not None
        return (Qwen35State.bytes_per_token(self.config, dtype, mtp=mtp),
                Qwen35State.bytes_per_lane(self.config, dtype, verify_width=verify_width))

    def snapshot_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one prefix-cache snapshot of the recurrent state (`allocate_snapshots`)."""
        return Qwen35State.bytes_per_snapshot(self.config, dtype)

    def _gates(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.linear_attn.A_log, layer.linear_attn.dt_bias) for layer in self.model.layers
                if layer.kind == "linear_attention"]

    def _attention_inputs(self, positions: torch.Tensor, state: Qwen35State, lanes: torch.Tensor,
                          kv_len: int) -> tuple:
        cos, sin = rope_cos_sin(
            self.rope_w, positions, self.rope_scaling
        )  # [B, T, rotary_dim/2] each
        return (cos, sin), state.kv.rows(lanes, positions, kv_len)

    def hidden_states(self, tokens: torch.Tensor, positions: torch.Tensor, state: Qwen35State,
                      lanes: torch.Tensor, *, kv_len: int | None = None,
                      num_tokens: torch.Tensor | None = None,
                      tap: tuple[int, ...] = ()) -> torch.Tensor:
        """Final normed hidden states [B, T, hidden] after advancing the rows' lanes by this chunk.

        tokens, positions: [B, T] int64; lanes: [B] int64, distinct; kv_len: a host-side bound with
        every position < kv_len <= state.max_len (default state.max_len); num_tokens: [B] int64 real
        tokens per row, 1..T (default T). tap: layer ids, GDN or attention alike, whose outputs
        (the residual stream after the layer) are also returned, concatenated in that order:
        (final, [B, T, len(tap) * hidden]) (a draft model's conditioning, models/dflash.py)."""
        B, T = tokens.shape
        L = state.max_len if kv_len is None else kv_len
        assert positions.shape == (B, T) and lanes.shape == (B,), (positions.shape, lanes.shape)
        assert 0 < L <= state.max_len and state.ssm.shape[0] == len(self.config.gdn_layers)
        rope, rows = self._attention_inputs(positions, state, lanes, L)
        step = state.begin(lanes, positions, num_tokens)
        x = self.model.embed_tokens(tokens)  # [B, T, hidden]
        taps = {}
        for i, (layer, index) in enumerate(zip(self.model.layers, self._index)):
            x = layer(x, state, index, lanes, step=step, rope=rope, rows=rows)
            if i in tap:
                taps[i] = x
        state.end(step)
        if tap:
            return self.model.norm(x), torch.cat([taps[i] for i in tap], dim=-1)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """[..., hidden] -> [..., vocab] in the model's dtype; `rows`: only the logits of the
        first `rows` token ids (a leading slice of the head's rows: no copy)."""
        weight = self.output_weight if rows is None else self.output_weight[:rows]
        if self.fused:
            from services.worker.models.layers import linear

            return linear(hidden, weight)
        return F.linear(hidden, weight)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        state: Qwen35State,
        lanes: torch.Tensor,
        *,
        kv_len: int | None = None,
        logit_index: torch.Tensor | None = None,
        num_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, vocab] of a prefill chunk, decode step or verification (see
        `hidden_states`). With logit_index: [B, S] int64 indices into T, only those columns:
        [B, S, vocab]."""
        hidden = self.hidden_states(
            tokens, positions, state, lanes, kv_len=kv_len, num_tokens=num_tokens
        )
        return self.logits(_gather(hidden, logit_index))

    def mtp_forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
                    state: Qwen35State, lanes: torch.Tensor, *, kv_len: int | None = None,
                    logit_index: torch.Tensor | None = None,
                    vocab: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP module (models/mtp_head.py): target hidden states h_t [B, T, hidden] (from
        `hidden_states`) and the next tokens x_{t+1} [B, T] at `positions` [B, T] (the MTP layer's
        KV positions, chosen by the caller) -> (logits predicting x_{t+2} [B, T or S, vocab], the
        module's normed output hidden states [B, T or S, hidden]); `vocab`: the logits of the
        first `vocab` token ids only (None: every row of the LM head). Raises ValueError when the
        model was loaded without MTP weights."""
        if self.mtp is None or state.mtp_layer is None:
            raise ValueError("mtp: this model (or its state) has no MTP module")
        B, T = next_tokens.shape
        L = state.max_len if kv_len is None else kv_len
        assert hidden.shape[:2] == (B, T) and positions.shape == (B, T) and 0 < L <= state.max_len
        rope, rows = self._attention_inputs(positions, state, lanes, L)
        u = self.mtp.fuse(self.model.embed_tokens(next_tokens), hidden)
        u = self.mtp.layers[0](u, state, state.mtp_layer, lanes, rope=rope, rows=rows)
        out = _gather(self.mtp.norm(u), logit_index)
        return self.logits(out, vocab), out


def _gather(hidden: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    # hidden: [B, T, H]; index: [B, S] -> [B, S, H]
    if index is None:
        return hidden
    return hidden.gather(1, index[:, :, None].expand(-1, -1, hidden.shape[-1]))
