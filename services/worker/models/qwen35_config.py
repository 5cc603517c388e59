"""The configuration of a Qwen3.5 text model (hybrid Gated DeltaNet + gated attention), read from a
Hugging Face `config.json` dictionary: a top-level `Qwen3_5ForConditionalGeneration` config (the
text model's keys under `text_config`, a vision tower beside it that we never load) or a text-only
`qwen3_5_text` config. Missing keys take transformers' `Qwen3_5TextConfig` defaults.

What the fields mean for the math (as transformers' Qwen3.5 text model computes it):

- `layer_types[i]` is "linear_attention" (a Gated DeltaNet layer) or "full_attention" (gated
  attention); absent, every `full_attention_interval`-th layer (default 4) is attention.
- Attention: `num_heads` x `head_dim` queries plus as many gate columns (`q_proj` is twice as wide),
  `num_kv_heads` keys/values, zero-centred RMSNorm per head on q and k, RoPE on the first
  `rotary_dim = head_dim * partial_rotary_factor` dimensions of each head. For text, mRoPE's three
  position streams are equal, so its sections reduce to ordinary positions.
- GDN: `linear_num_key_heads` x `linear_key_head_dim` queries and keys, `linear_num_value_heads` x
  `linear_value_head_dim` values (each key head serves num_v / num_k consecutive value heads), a
  depthwise causal conv of `linear_conv_kernel_dim` taps over [q; k; v].
- MoE variants (`qwen3_5_moe*`, or any expert count) are rejected: this issue serves dense MLPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from services.worker.models.config import ModelConfigError, RopeConfig, _get, _rope_from_hf
from shared.frontends.qwen35 import is_qwen35_config  # noqa: F401 - the one family test

TEXT_MODEL_TYPES = ("qwen3_5_text", "qwen3_5")
LAYER_TYPES = ("linear_attention", "full_attention")
_MOE_KEYS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


@dataclass(frozen=True)
class Qwen35Config:
    """Shape and numerics of one Qwen3.5 text model; build it with
    `Qwen35Config.from_hf(config_dict)`."""

    vocab_size: int  # rows of the embedding and of the LM head
    hidden_size: int  # residual width
    intermediate_size: int  # SwiGLU inner width
    layer_types: tuple[str, ...]  # one of LAYER_TYPES per layer
    num_heads: int  # attention query heads
    num_kv_heads: int  # attention key/value heads; divides num_heads
    head_dim: int  # attention head width
    rotary_dim: int  # leading dims of each attention head that RoPE rotates; even, <= head_dim
    linear_num_key_heads: int  # GDN query/key heads
    linear_num_value_heads: int  # GDN value heads; a multiple of linear_num_key_heads
    linear_key_head_dim: int  # d_k of the recurrent state
    linear_value_head_dim: int  # d_v of the recurrent state
    linear_conv_kernel_dim: int  # causal conv taps, >= 2
    rms_norm_eps: float  # > 0
    max_position_embeddings: int  # longest context the model claims, tokens
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v/o projections carry biases
    mtp_num_hidden_layers: int = 0  # MTP decoder layers in the checkpoint's config (0 or 1 served)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "rotary_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(name, f"must be a positive integer, got {value!r}")
        if not self.layer_types:
            raise ModelConfigError("layer_types", "must name at least one layer")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ModelConfigError(
                "layer_types", f"unsupported layer types {bad}; supported: {', '.join(LAYER_TYPES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                "num_key_value_heads",
                f"must divide num_attention_heads={self.num_heads}, got {self.num_kv_heads}",
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ModelConfigError(
                "linear_num_value_heads",
                f"must be a multiple of linear_num_key_heads="
                f"{self.linear_num_key_heads}, got {self.linear_num_value_heads}",
            )
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ModelConfigError(
                "partial_rotary_factor",
                f"gives rotary_dim={self.rotary_dim}: must be even and <= head_dim={self.head_dim}",
            )
        if self.linear_conv_kernel_dim < 2:
            raise ModelConfigError(
                "linear_conv_kernel_dim", f"must be >= 2, got {self.linear_conv_kernel_dim}"
            )
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise ModelConfigError(
                "rms_norm_eps", f"must be a finite number > 0, got {self.rms_norm_eps!r}"
            )
        if self.mtp_num_hidden_layers < 0:
            raise ModelConfigError(
                "mtp_num_hidden_layers", f"must be >= 0, got {self.mtp_num_hidden_layers}"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the full-attention layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        """Indices of the Gated DeltaNet layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN causal conv: [q; k; v]."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> "Qwen35Config":
        """Build from a config.json dictionary (see the module docstring). Raises ModelConfigError
        naming the key: not a Qwen3.5 config, a MoE variant, or a malformed value."""
        if not isinstance(config, dict):
            raise ModelConfigError(
                "config.json", f"must be a JSON object, got {type(config).__name__}"
            )
        text = config.get("text_config")
        prefix = ""
        if text is not None:
            if not isinstance(text, dict):
                raise ModelConfigError("text_config", f"must be an object, got {text!r}")
            prefix = "text_config."
            # A composite config may keep tie_word_embeddings at its top level.
            if "tie_word_embeddings" not in text and "tie_word_embeddings" in config:
                text = dict(text, tie_word_embeddings=config["tie_word_embeddings"])
        else:
            text = config
        model_type = text.get("model_type", config.get("model_type"))
        if (
            isinstance(model_type, str)
            and "moe" in model_type
            or any(text.get(k) for k in _MOE_KEYS)
        ):
            raise ModelConfigError(
                f"{prefix}model_type",
                f"Qwen3.5 mixture-of-experts models are not supported "
                f"(got {model_type!r}); only the dense Qwen3.5 text models are",
            )
        if model_type not in TEXT_MODEL_TYPES:
            raise ModelConfigError(
                f"{prefix}model_type", f"not a Qwen3.5 text config: {model_type!r}"
            )
        try:
            return cls._from_text(text)
        except ModelConfigError as e:
            if not prefix:
                raise
            raise ModelConfigError(prefix + e.field, str(e).split(": ", 1)[-1]) from e

    @classmethod
    def _from_text(cls, text: dict[str, Any]) -> "Qwen35Config":
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError("hidden_act", f"only 'silu' is supported, got {act!r}")
        if text.get("attn_output_gate", True) is not True:
            raise ModelConfigError("attn_output_gate", "only gated attention (true) is supported")
        gate_type = text.get("output_gate_type")
        if gate_type not in (None, "sigmoid"):
            raise ModelConfigError(
                "output_gate_type", f"only the sigmoid output gate is supported, got {gate_type!r}"
            )
        num_layers = _get(text, "num_hidden_layers", int, 32)
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = _get(text, "full_attention_interval", int, 4)
            if interval <= 0:
                raise ModelConfigError(
                    "full_attention_interval", f"must be positive, got {interval}"
                )
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                           for i in range(num_layers)]
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ModelConfigError(
                "layer_types", f"must list num_hidden_layers={num_layers} layer types"
            )
        head_dim = _get(text, "head_dim", int, 256)
        max_pos = _get(text, "max_position_embeddings", int, 32768)
        rope_params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        partial = rope_params.pop("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        if (
            isinstance(partial, bool)
            or not isinstance(partial, (int, float))
            or not 0 < partial <= 1
        ):
            raise ModelConfigError(
                "rope_parameters.partial_rotary_factor", f"must be in (0, 1], got {partial!r}"
            )
        for key in ("mrope_section", "mrope_interleaved"):  # text positions: the sections coincide
            rope_params.pop(key, None)
        rope = _rope_from_hf(
            {
                "rope_parameters": rope_params,
                "rope_theta": text.get("rope_theta", 10000.0),
                "max_position_embeddings": max_pos,
            },
            max_pos,
        )
        mtp_layers = _get(text, "mtp_num_hidden_layers", int, 0)
        if mtp_layers > 1:
            raise ModelConfigError(
                "mtp_num_hidden_layers", f"at most 1 MTP layer is supported, got {mtp_layers}"
            )
        if text.get("mtp_use_dedicated_embeddings"):
            raise ModelConfigError(
                "mtp_use_dedicated_embeddings", "MTP with its own embeddings is not supported"
            )
        return cls(
            vocab_size=_get(text, "vocab_size", int, 248320),
            hidden_size=_get(text, "hidden_size", int, 4096),
            intermediate_size=_get(text, "intermediate_size", int, 12288),
            layer_types=tuple(layer_types),
            num_heads=_get(text, "num_attention_heads", int, 16),
            num_kv_heads=_get(text, "num_key_value_heads", int, 4),
            head_dim=head_dim,
            rotary_dim=int(head_dim * partial),
            linear_num_key_heads=_get(text, "linear_num_key_heads", int, 16),
            linear_num_value_heads=_get(text, "linear_num_value_heads", int, 32),
            linear_key_head_dim=_get(text, "linear_key_head_dim", int, 128),
            linear_value_head_dim=_get(text, "linear_value_head_dim", int, 128),
            linear_conv_kernel_dim=_get(text, "linear_conv_kernel_dim", int, 4),
            rms_norm_eps=_get(text, "rms_norm_eps", float, 1e-6),
            max_position_embeddings=max_pos,
            rope=rope,
            tie_word_embeddings=_get(text, "tie_word_embeddings", bool, False),
            attention_bias=_get(text, "attention_bias", bool, False),
            mtp_num_hidden_layers=mtp_layers,
        )
