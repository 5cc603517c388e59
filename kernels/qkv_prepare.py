"""One launch per attention layer before attention: q/k RMSNorm, RoPE on q and k, the KV write.

`prepare_qkv` does, per token, what these do in sequence (and `prepare_qkv_ref` is exactly that
sequence of references, rounding included):

    q <- rope(q_norm(q))               in place (kernels.norms_ref, kernels.rope_ref)
    k_cache, v_cache <- rope(k_norm(k)), v   at the token's slot (kernels.paged_kv)

One program per token loads its q heads and k/v heads once: the norm's statistics over the whole
head, the rotary pairs (i, i + R/2) for i < R/2 and the pass-through dims R..D-1 as three tiles.
The norms are optional (Qwen3 and Qwen3.5 have them; Llama has none), either convention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.norms_ref import rms_norm_ref
from kernels.paged_kv import check_cache, check_positions
from kernels.paged_kv_ref import write_kv_ref
from kernels.rope_ref import rope_ref
from kernels.triton_util import to_dtype


@triton.jit
def _norm_piece(x, w_ptr, cols, ok, rstd, HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    # One tile of heads [BLOCK_H, n] after the norm, rounded to the storage dtype.
    if not HAS_NORM:
        return x
    normed = x.to(tl.float32) * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)[None, :]
    if ZERO_CENTERED:
        return to_dtype(normed * (1.0 + w.to(tl.float32)), x.dtype)
    w = to_dtype(w.to(tl.float32), x.dtype).to(tl.float32)
    return to_dtype(to_dtype(normed, x.dtype).to(tl.float32) * w, x.dtype)


@triton.jit
def _heads(src, tok_off, head_stride, NH, w_ptr, c, s, eps, D, HALF,
           HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, BLOCK_H: tl.constexpr,
           BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr):
    # Load NH heads of one token as (first half, second half, rest), norm them, rotate the pairs.
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    r = tl.arange(0, BLOCK_REST)
    rows = src + tok_off + h[:, None].to(tl.int64) * head_stride
    ok_i = (h < NH)[:, None] & (i < HALF)[None, :]
    ok_r = (h < NH)[:, None] & (r < D - 2 * HALF)[None, :]
    x1 = tl.load(rows + i[None, :], mask=ok_i, other=0.0)
    x2 = tl.load(rows + HALF + i[None, :], mask=ok_i, other=0.0)
    x3 = tl.load(rows + 2 * HALF + r[None, :], mask=ok_r, other=0.0)
    if HAS_NORM:
        a, b, rest = x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
        ss = tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1) + tl.sum(rest * rest, axis=1)
        rstd = 1.0 / tl.sqrt(ss / D + eps)
    else:
        rstd = tl.zeros([BLOCK_H], tl.float32)
    x1 = _norm_piece(x1, w_ptr, i, i < HALF, rstd, HAS_NORM, ZERO_CENTERED)
    x2 = _norm_piece(x2, w_ptr, HALF + i, i < HALF, rstd, HAS_NORM, ZERO_CENTERED)
    x3 = _norm_piece(x3, w_ptr, 2 * HALF + r, r < D - 2 * HALF, rstd, HAS_NORM, ZERO_CENTERED)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    y1 = to_dtype(a * c - b * s, x1.dtype)
    y2 = to_dtype(b * c + a * s, x1.dtype)
    return y1, y2, x3, ok_i, ok_r, h


@triton.jit
def _prepare_kernel(q_ptr, q_sb, q_st, q_sh, k_ptr, k_sb, k_st, k_sh, v_ptr, v_sb, v_st, v_sh,
                    cos_ptr, sin_ptr, cs_stride, qw_ptr, kw_ptr, eps,
                    kc_ptr, vc_ptr, c_sblk, c_stok, c_sh, table_ptr, table_stride,
                    pos_ptr, pos_sb, pos_st, T, HQ, HKV, D, HALF, BS,
                    Q_NORM: tl.constexpr, K_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr,
                    BLOCK_REST: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0)
    b = (tok // T).to(tl.int64)
    t = (tok % T).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    c = tl.load(cos_ptr + tok.to(tl.int64) * cs_stride + i, mask=i < HALF, other=0.0)[None, :]
    s = tl.load(sin_ptr + tok.to(tl.int64) * cs_stride + i, mask=i < HALF, other=0.0)[None, :]
    # q: normed and rotated in place
    y1, y2, y3, ok_i, ok_r, h = _heads(q_ptr, b * q_sb + t * q_st, q_sh, HQ, qw_ptr, c, s, eps, D,
                                       HALF, Q_NORM, ZERO_CENTERED, BLOCK_HQ, BLOCK_HALF,
                                       BLOCK_REST)
    rows = q_ptr + b * q_sb + t * q_st + h[:, None].to(tl.int64) * q_sh
    r = tl.arange(0, BLOCK_REST)
    tl.store(rows + i[None, :], y1, mask=ok_i)
    tl.store(rows + HALF + i[None, :], y2, mask=ok_i)
    if Q_NORM:
        tl.store(rows + 2 * HALF + r[None, :], y3, mask=ok_r)
    # k: normed and rotated into the cache; v copied
    pos = tl.load(pos_ptr + b * pos_sb + t * pos_st).to(tl.int64)
    blk = tl.load(table_ptr + b * table_stride + tl.maximum(pos, 0) // BS).to(tl.int64)
    y1, y2, y3, ok_i, ok_r, h = _heads(k_ptr, b * k_sb + t * k_st, k_sh, HKV, kw_ptr, c, s, eps, D,
                                       HALF, K_NORM, ZERO_CENTERED, BLOCK_HKV, BLOCK_HALF,
                                       BLOCK_REST)
    keep_i = ok_i & (h[:, None] * 0 + pos >= 0)  # broadcast first (interpreter masks)
    keep_r = ok_r & (h[:, None] * 0 + pos >= 0)
    dst = blk * c_sblk + (pos % BS) * c_stok + h[:, None].to(tl.int64) * c_sh
    kd = kc_ptr.dtype.element_ty
    tl.store(kc_ptr + dst + i[None, :], to_dtype(y1.to(tl.float32), kd), mask=keep_i)
    tl.store(kc_ptr + dst + HALF + i[None, :], to_dtype(y2.to(tl.float32), kd), mask=keep_i)
    tl.store(kc_ptr + dst + 2 * HALF + r[None, :], to_dtype(y3.to(tl.float32), kd), mask=keep_r)
    d = tl.arange(0, BLOCK_D)
    keep_v = (h < HKV)[:, None] & (d < D)[None, :] & (h[:, None] * 0 + pos >= 0)
    vv = tl.load(v_ptr + b * v_sb + t * v_st + h[:, None].to(tl.int64) * v_sh + d[None, :],
                 mask=keep_v)
    tl.store(vc_ptr + dst + d[None, :], to_dtype(vv.to(tl.float32), vc_ptr.dtype.element_ty),
             mask=keep_v)


def _check(q, k, v, cos, sin, positions, q_norm, k_norm):
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] \
            or q.shape[3] != k.shape[3] or q.dtype != k.dtype or v.dtype != k.dtype \
            or any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError(f"q, k, v: expected [B, T, H, D], [B, T, Hkv, D] x2 of one dtype with a "
                         f"unit last stride, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    half = cos.shape[-1]
    if cos.shape != sin.shape or cos.shape[:-1] != q.shape[:2] or not 1 <= 2 * half <= q.shape[3] \
            or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"cos, sin: expected float32 {tuple(q.shape[:2])} + (R/2,), R <= "
                         f"{q.shape[3]}, got {cos.dtype} {tuple(cos.shape)}")
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None and (w.shape != (q.shape[3],) or w.device != q.device):
            raise ValueError(f"{name}: expected [{q.shape[3]}] on {q.device}, got "
                             f"{tuple(w.shape)} on {w.device}")
    check_positions(positions, q.shape[0], q.shape[1], q.device)


def prepare_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_table: torch.Tensor, positions: torch.Tensor, *,
                q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                eps: float = 1e-6, zero_centered: bool = False) -> None:
    """Norm and rotate q in place; norm, rotate and write k, and write v, into the paged cache.

    q: [B, T, H, D]; k, v: [B, T, Hkv, D] (one float dtype; views of a fused q|k|v projection,
        any strides with a unit last one; k and v are not modified);
    cos, sin: float32 [B, T, R/2] (R the rotary dimension, even, <= D; contiguous rows);
    k_cache, v_cache, block_table, positions: as `kernels.paged_kv.write_kv` (-1 = padding:
        nothing written; its q is still rotated);
    q_norm, k_norm: per-head RMSNorm weights [D] or None (no norm); eps; zero_centered: the
        Qwen3.5 (1 + w) convention.
    Raises ValueError for inconsistent shapes, dtypes or devices. No host synchronisation."""
    check_cache(k_cache, v_cache, block_table)
    _check(q, k, v, cos, sin, positions, q_norm, k_norm)
    rows, tokens, hq, d = q.shape
    if k_cache.shape[2:] != k.shape[2:] or block_table.shape[0] != rows:
        raise ValueError(f"k_cache: expected [.., .., {k.shape[2]}, {d}] and {rows} block table "
                         f"rows, got {tuple(k_cache.shape)} and {block_table.shape[0]}")
    if rows * tokens == 0:
        return
    half = cos.shape[-1]
    cs, sn = cos.reshape(-1, half).contiguous(), sin.reshape(-1, half).contiguous()
    rest = d - 2 * half
    _prepare_kernel[(rows * tokens,)](
        q, q.stride(0), q.stride(1), q.stride(2), k, k.stride(0), k.stride(1), k.stride(2),
        v, v.stride(0), v.stride(1), v.stride(2), cs, sn, cs.stride(0),
        q if q_norm is None else q_norm, q if k_norm is None else k_norm, float(eps),
        k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table,
        block_table.stride(0), positions, positions.stride(0), positions.stride(1), tokens, hq,
        k.shape[2], d, half, k_cache.shape[1],
        Q_NORM=q_norm is not None, K_NORM=k_norm is not None, ZERO_CENTERED=zero_centered,
        BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HKV=triton.next_power_of_2(k.shape[2]),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(rest) if rest else 1,
        BLOCK_D=triton.next_power_of_2(d), num_warps=4)


def prepare_qkv_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_table: torch.Tensor, positions: torch.Tensor, *,
                    q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                    eps: float = 1e-6, zero_centered: bool = False) -> None:
    """`prepare_qkv` as the sequence of the references (same arguments and effects)."""
    check_cache(k_cache, v_cache, block_table)
    _check(q, k, v, cos, sin, positions, q_norm, k_norm)
    if q_norm is not None:
        q.copy_(rms_norm_ref(q, q_norm, eps, zero_centered=zero_centered))
    kk = k if k_norm is None else rms_norm_ref(k, k_norm, eps, zero_centered=zero_centered)
    q.copy_(rope_ref(q, cos, sin))
    write_kv_ref(k_cache, v_cache, rope_ref(kk, cos, sin), v, block_table, positions)
