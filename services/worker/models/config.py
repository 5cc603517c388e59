"""The configuration of a Llama-family dense decoder (Llama, Qwen2, Qwen3), read from a Hugging Face
`config.json` dictionary (transformers 4 and 5 spellings) and validated once.

Which differences between the families matter to the math:

| family | q/k/v bias | o bias | q/k RMSNorm per head | MLP bias |
|---|---|---|---|---|
| llama  | `attention_bias` | `attention_bias` | no | `mlp_bias` |
| qwen2  | always | never | no | never |
| qwen3  | `attention_bias` | `attention_bias` | yes | never |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ARCHITECTURES = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class ModelConfigError(ValueError):
    """A model's configuration is malformed or asks for something this code does not implement.

    The operator's fault (a checkpoint or file), never a request's. `field` names the offending key
    as it is spelled in config.json (dotted for nested keys) or GGUF metadata.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters, as transformers' `rope_parameters` names them."""

    rope_type: str = "default"  # one of ROPE_TYPES
    theta: float = 10000.0  # base wavelength (rope_theta), > 1
    factor: float = 1.0  # linear / llama3 / yarn scaling factor, >= 1 for yarn and llama3, > 0
    # llama3: wavelengths above original/low_freq_factor are scaled, below original/high are kept.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0  # llama3 and yarn: the pretraining context, tokens
    # yarn: ramp boundaries (rotations), optional explicit cos/sin scale and its mscale inputs.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ModelConfigError(
                "rope_parameters.rope_type",
                f"unsupported RoPE type {self.rope_type!r}; supported: {', '.join(ROPE_TYPES)}",
            )
        if not (math.isfinite(self.theta) and self.theta > 1.0):
            raise ModelConfigError(
                "rope_parameters.rope_theta", f"must be a finite number > 1, got {self.theta!r}"
            )
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ModelConfigError(
                "rope_parameters.factor", f"must be a finite number > 0, got {self.factor!r}"
            )
        if self.rope_type in ("llama3", "yarn"):
            if self.original_max_position_embeddings <= 0:
                raise ModelConfigError(
                    "rope_parameters.original_max_position_embeddings",
                    f"must be a positive integer for {self.rope_type}, "
                    f"got {self.original_max_position_embeddings!r}",
                )
        if self.rope_type == "llama3" and not (0 < self.low_freq_factor < self.high_freq_factor):
            raise ModelConfigError(
                "rope_parameters.high_freq_factor",
                f"llama3 needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor!r} and {self.high_freq_factor!r}",
            )
        if self.rope_type == "yarn" and not (self.beta_fast > 0 and self.beta_slow > 0):
            raise ModelConfigError(
                "rope_parameters.beta_fast",
                f"yarn betas must be > 0, got {self.beta_fast!r}, {self.beta_slow!r}",
            )


@dataclass(frozen=True)
class ModelConfig:
    """The shape and numerics of one dense decoder; built with
    `ModelConfig.from_hf(config_dict)`."""

    architecture: str  # one of ARCHITECTURES
    vocab_size: int  # rows of the embedding and of the LM head
    hidden_size: int  # residual width
    intermediate_size: int  # SwiGLU inner width
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA); divides num_heads
    head_dim: int  # even
    rms_norm_eps: float  # > 0
    max_position_embeddings: int  # longest context the model claims, tokens
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ModelConfigError(
                "model_type",
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(ARCHITECTURES)}",
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(name, f"must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                "num_key_value_heads",
                f"must divide num_attention_heads={self.num_heads}, got {self.num_kv_heads}",
            )
        if self.head_dim % 2:
            raise ModelConfigError("head_dim", f"must be even for RoPE, got {self.head_dim}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise ModelConfigError(
                "rms_norm_eps", f"must be a finite number > 0, got {self.rms_norm_eps!r}"
            )
        if not isinstance(self.rope, RopeConfig):
            raise ModelConfigError(
                "rope_parameters", f"must be a RopeConfig, got {type(self.rope).__name__}"
            )

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face `config.json` dictionary (transformers 4 `rope_scaling` +
        `rope_theta` or transformers 5 `rope_parameters`); keys missing from the file take
        transformers' defaults for that model type. Raises ModelConfigError naming the key."""
        if not isinstance(config, dict):
            raise ModelConfigError(
                "config.json", f"must be a JSON object, got {type(config).__name__}"
            )
        arch = config.get("model_type")
        if arch not in ARCHITECTURES:
            raise ModelConfigError(
                "model_type",
                f"unsupported model type {arch!r}; supported: {', '.join(ARCHITECTURES)}",
            )
        _reject_unsupported(config)
        hidden = _get(config, "hidden_size", int)
        heads = _get(config, "num_attention_heads", int)
        kv_heads = _get(config, "num_key_value_heads", int, heads)
        head_dim = _get(config, "head_dim", int, None)
        if head_dim is None:
            if hidden % heads:
                raise ModelConfigError(
                    "head_dim",
                    f"absent and hidden_size={hidden} is not a multiple of "
                    f"num_attention_heads={heads}",
                )
            head_dim = hidden // heads
        max_pos = _get(config, "max_position_embeddings", int, 2048 if arch == "llama" else 32768)
        attention_bias = _get(config, "attention_bias", bool, False)
        return cls(
            architecture=arch,
            vocab_size=_get(config, "vocab_size", int),
            hidden_size=hidden,
            intermediate_size=_get(config, "intermediate_size", int),
            num_layers=_get(config, "num_hidden_layers", int),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_get(config, "rms_norm_eps", float, 1e-6),
            max_position_embeddings=max_pos,
            rope=_rope_from_hf(config, max_pos),
            tie_word_embeddings=_get(config, "tie_word_embeddings", bool, False),
            qkv_bias=True if arch == "qwen2" else attention_bias,
            o_bias=False if arch == "qwen2" else attention_bias,
            mlp_bias=_get(config, "mlp_bias", bool, False) if arch == "llama" else False,
            qk_norm=arch == "qwen3",
        )


_MISSING = object()


def _get(config: dict[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    value = config.get(key, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise ModelConfigError(key, "is required")
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise ModelConfigError(key, f"must be {kind.__name__}, got {value!r}")
    return value


def _reject_unsupported(config: dict[str, Any]) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError("hidden_act", f"only 'silu' (SwiGLU) is supported, got {act!r}")
    if config.get("use_sliding_window"):
        raise ModelConfigError("use_sliding_window", "sliding-window attention is not supported")
    layer_types = config.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(
            "layer_types",
            f"only full_attention layers are supported, got {sorted(set(layer_types))}",
        )
    partial = config.get("partial_rotary_factor")
    if partial is not None and partial != 1.0:
        raise ModelConfigError("partial_rotary_factor", f"only 1.0 is supported, got {partial!r}")


def _rope_from_hf(config: dict[str, Any], max_pos: int) -> RopeConfig:
    # transformers 5 writes `rope_parameters` (with rope_theta inside); 4 wrote `rope_scaling` and a
    # top-level `rope_theta`. Either may carry the legacy key "type" instead of "rope_type".
    key = "rope_parameters" if config.get("rope_parameters") is not None else "rope_scaling"
    params = config.get(key) or {}
    if not isinstance(params, dict):
        raise ModelConfigError(key, f"must be an object, got {params!r}")
    if any(isinstance(v, dict) for v in params.values()):
        raise ModelConfigError(key, "per-layer-type RoPE parameters are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelConfigError(
            f"{key}.rope_type",
            f"unsupported RoPE type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}",
        )
    partial = params.get("partial_rotary_factor")
    if partial is not None and partial != 1.0:
        raise ModelConfigError(
            f"{key}.partial_rotary_factor", f"only 1.0 is supported, got {partial!r}"
        )

    def num(name: str, default: Any) -> Any:
        value = params.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelConfigError(f"{key}.{name}", f"must be a number, got {value!r}")
        return value

    theta = num("rope_theta", None)
    if theta is None:
        theta = _get(config, "rope_theta", float, 10000.0)
    # As transformers does: a top-level original_max_position_embeddings wins over the nested one.
    original = config.get("original_max_position_embeddings")
    if original is None:
        original = num("original_max_position_embeddings", max_pos)
    factor = num("factor", 1.0)
    if params.get("factor") is None:
        if rope_type == "yarn":
            factor = max_pos / original
        elif rope_type in ("linear", "llama3"):
            raise ModelConfigError(f"{key}.factor", f"is required for rope_type {rope_type!r}")
    if rope_type == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if params.get(name) is None:
                raise ModelConfigError(f"{key}.{name}", "is required for rope_type 'llama3'")
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelConfigError(f"{key}.truncate", f"must be a boolean, got {truncate!r}")
    return RopeConfig(
        rope_type=rope_type,
        theta=float(theta),
        factor=float(factor),
        low_freq_factor=float(num("low_freq_factor", 1.0)),
        high_freq_factor=float(num("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(original),
        beta_fast=float(num("beta_fast", 32.0)),
        beta_slow=float(num("beta_slow", 1.0)),
        attention_factor=None
        if params.get("attention_factor") is None
        else float(num("attention_factor", 1.0)),
        mscale=None if params.get("mscale") is None else float(num("mscale", 1.0)),
        mscale_all_dim=None
        if params.get("mscale_all_dim") is None
        else float(num("mscale_all_dim", 1.0)),
        truncate=truncate,
    )
