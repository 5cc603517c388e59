"""Plain-torch reference of the RoPE kernel (`kernels.rope`).

Hugging Face's rotate_half layout: with rotary dimension R (even, <= head dim D) and pair index
i < R/2, the pair (x[i], x[i + R/2]) is rotated by the angle whose cosine and sine the caller
precomputed (default, linear, Llama3 or YaRN frequencies and YaRN's attention factor are folded into
cos/sin by `services.worker.models.rope.rope_cos_sin`):

    x[i]       <- x[i] * cos[i] - x[i + R/2] * sin[i]
    x[i + R/2] <- x[i + R/2] * cos[i] + x[i] * sin[i]

Dimensions R..D-1 pass through unchanged (partial rotary: Qwen3.5 rotates 64 of 256). Computed in
float32 from the stored values, rounded once to the tensor's dtype.
"""

from __future__ import annotations

import torch


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotated copy of x: [..., H, D] with cos, sin: [..., R/2] over the same leading dims."""
    half = cos.shape[-1]
    rot = 2 * half
    assert rot <= x.shape[-1] and cos.shape == sin.shape == x.shape[:-2] + (half,)
    x1 = x[..., :half].float()  # [..., H, R/2]
    x2 = x[..., half:rot].float()
    c, s = cos.float()[..., None, :], sin.float()[..., None, :]  # [..., 1, R/2]
    out = x.clone()
    out[..., :half] = (x1 * c - x2 * s).to(x.dtype)
    out[..., half:rot] = (x2 * c + x1 * s).to(x.dtype)
    return out


def apply_rope_ref_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> None:
    """Rotate q: [..., H, D] and k: [..., Hkv, D] in place (the kernel's signature)."""
    q.copy_(rope_ref(q, cos, sin))
    k.copy_(rope_ref(k, cos, sin))
