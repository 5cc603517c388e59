"""Rotary position embeddings with the scalings that Llama-family checkpoints use.

RoPE rotates each pair (x[i], x[i + D/2]) of a query or key head by the angle `position * w[i]`
(the "rotate_half" layout of Hugging Face checkpoints). The scaling types only change the inverse
frequencies `w` and, for yarn, multiply cos and sin by an attention factor:

- default: w[i] = theta ** (-2i / D)
- linear:  w[i] / factor (position interpolation)
- llama3:  long wavelengths (> original / low_freq_factor) divided by factor, short ones
           (< original / high_freq_factor) kept, a linear blend in between
- yarn:    a per-dimension blend between w[i] (extrapolation) and w[i] / factor (interpolation) on
           a ramp between the dimensions that turn beta_fast and beta_slow times over the original
           context; cos and sin scaled by 0.1 * ln(factor) + 1 unless attention_factor is given
"""

from __future__ import annotations

import math

import torch

from services.worker.models.config import RopeConfig


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Per-pair angular speeds and the cos/sin scale for `rope`.

    Returns (w: [head_dim // 2] float32, attention_scaling: float). Computed in float32 in the order
    that transformers uses, so angles agree bit for bit with the reference.
    """
    d = head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d  # [D/2]
    base = rope.theta ** exponents  # [D/2] float32
    w = 1.0 / base  # [D/2]
    if rope.rope_type == "default":
        return w, 1.0
    if rope.rope_type == "linear":
        return w / rope.factor, 1.0
    if rope.rope_type == "llama3":
        original = rope.original_max_position_embeddings
        long_wavelen = original / rope.low_freq_factor  # above: fully interpolated
        short_wavelen = original / rope.high_freq_factor  # below: kept
        wavelen = 2 * math.pi / w  # [D/2]
        scaled = torch.where(wavelen > long_wavelen, w / rope.factor, w)
        blend = (original / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        blended = (1 - blend) * scaled / rope.factor + blend * scaled
        middle = (wavelen >= short_wavelen) & (wavelen <= long_wavelen)
        return torch.where(middle, blended, scaled), 1.0
    if rope.rope_type == "yarn":
        original = rope.original_max_position_embeddings

        def dim_of(rotations: float) -> float:
            # the pair index whose wavelength fits `rotations` turns into the original context
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

        low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(
            0, 1
        )  # [D/2]
        keep = 1 - ramp  # weight of the unscaled (extrapolated) frequency
        w_interp = 1.0 / (rope.factor * base)
        w = w_interp * (1 - keep) + w * keep
        if rope.attention_factor is not None:
            scaling = rope.attention_factor
        elif rope.mscale and rope.mscale_all_dim:
            scaling = _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(
                rope.factor, rope.mscale_all_dim
            )
        else:
            scaling = _yarn_mscale(rope.factor)
        return w, float(scaling)
    raise ValueError(f"unsupported RoPE type {rope.rope_type!r}")  # RopeConfig already rejects it


def rope_cos_sin(
    w: torch.Tensor, positions: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, float32, each [B, T, D/2], for positions [B, T]."""
    angles = positions.to(torch.float32)[..., None] * w  # [B, T, D/2]
    return angles.cos() * scaling, angles.sin() * scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate heads x: [B, T, H, D] by cos, sin: [B, T, D/2]; computed in float32, returns x's
    dtype."""
    half = x.shape[-1] // 2
    x1 = x[..., :half].float()  # [B, T, H, D/2]
    x2 = x[..., half:].float()
    c, s = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, D/2]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
