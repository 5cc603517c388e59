"""Triton RoPE applied to q and k in place, full or partial rotary dimension.

The rule and its rounding are `kernels.rope_ref`'s. One program per token rotates all its q heads
and k heads, reading cos/sin once. q and k may be strided views of a fused q|k|v projection output
(`qkv[..., :H*D].view(B, T, H, D)`): token dimensions that merge into one stride, any head stride,
unit last stride; the rotation is written back into the same memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_util import to_dtype


@triton.jit
def _rotate(ptr, tok_stride, head_stride, tok, c, s, NH, HALF,
            BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    ok = (heads < NH)[:, None] & (i < HALF)[None, :]  # [BLOCK_H, BLOCK_HALF]
    base = (
        ptr + tok.to(tl.int64) * tok_stride + heads[:, None].to(tl.int64) * head_stride + i[None, :]
    )
    x1 = tl.load(base, mask=ok, other=0.0)
    x2 = tl.load(base + HALF, mask=ok, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base, to_dtype(a * c - b * s, x1.dtype), mask=ok)
    tl.store(base + HALF, to_dtype(b * c + a * s, x1.dtype), mask=ok)


@triton.jit
def _rope_kernel(q_ptr, q_st, q_sh, k_ptr, k_st, k_sh, cos_ptr, sin_ptr, cs_st, HQ, HK, HALF,
                 BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr):
    tok = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)
    c = tl.load(cos_ptr + tok.to(tl.int64) * cs_st + i, mask=i < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + tok.to(tl.int64) * cs_st + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate(q_ptr, q_st, q_sh, tok, c[None, :], s[None, :], HQ, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate(k_ptr, k_st, k_sh, tok, c[None, :], s[None, :], HK, HALF, BLOCK_HK, BLOCK_HALF)


def _tokens_view(t: torch.Tensor, name: str) -> torch.Tensor:
    # [..., H, D] -> [N, H, D] without a copy
    if t.dim() < 3 or t.stride(-1) != 1:
        raise ValueError(f"{name}: expected [..., heads, head_dim] with a unit last stride, got "
                         f"{tuple(t.shape)} strides {t.stride()}")
    try:
        return t.view(-1, t.shape[-2], t.shape[-1])
    except RuntimeError as e:
        raise ValueError(f"{name}: token dimensions must merge into one stride: {e}") from e


def apply_rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q and k in place, as `kernels.rope_ref.apply_rope_ref_`.

    q: [..., H, D], k: [..., Hkv, D] (float32 / float16 / bfloat16, one dtype, the same leading
        token dimensions, unit last stride); cos, sin: [..., R/2] float32 over the same token
        dimensions (contiguous rows), R = rotary dimension, even, <= D.
    Raises ValueError for mismatched shapes, dtypes, devices or strides."""
    qv, kv = _tokens_view(q, "q"), _tokens_view(k, "k")  # [N, H, D], [N, Hkv, D]
    half = cos.shape[-1]
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1] or q.dtype != k.dtype:
        raise ValueError(f"k: expected the dtype {q.dtype}, token dims {tuple(q.shape[:-2])} and "
                         f"head dim {q.shape[-1]} of q, got {k.dtype} {tuple(k.shape)}")
    if cos.shape != sin.shape or cos.shape[:-1] != q.shape[:-2] or not 1 <= 2 * half <= q.shape[-1]:
        raise ValueError(f"cos, sin: expected {tuple(q.shape[:-2])} + (R/2,) with R <= "
                         f"{q.shape[-1]}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or \
            {cos.device, sin.device, k.device} != {q.device}:
        raise ValueError(f"cos, sin: expected float32 on {q.device}, got {cos.dtype} on "
                         f"{cos.device}, {sin.dtype} on {sin.device}")
    cs, sn = cos.reshape(-1, half).contiguous(), sin.reshape(-1, half).contiguous()  # [N, R/2]
    n = qv.shape[0]
    if n == 0:
        return
    _rope_kernel[(n,)](qv, qv.stride(0), qv.stride(1), kv, kv.stride(0), kv.stride(1), cs, sn,
                       cs.stride(0), qv.shape[1], kv.shape[1], half,
                       BLOCK_HQ=triton.next_power_of_2(qv.shape[1]),
                       BLOCK_HK=triton.next_power_of_2(kv.shape[1]),
                       BLOCK_HALF=triton.next_power_of_2(half), num_warps=4)
