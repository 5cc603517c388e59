"""Triton attention over paged KV (layout: `kernels.paged_kv`), for decode, verification and chunks.

Query (b, t) at position `positions[b, t]` attends to positions 0..positions[b, t] of row b, read
in place through the block table: no gather of the lane, no mask tensor; padding queries
(position -1) produce zeros. GQA: the G = H / Hkv query heads of one KV head share every key tile.
`kernels.paged_kv_ref.paged_attention_ref` is the torch reference of the same semantics.

Work split (flash-decoding): grid (B x M tiles, Hkv, S). An M tile holds BLOCK_M (token, q head)
pairs of one row and KV head, ordered m = t * G + g, so T = 1 decode has G rows and T = K + 1
verification (K+1)G rows in one tile; long query windows (prefill chunks) take several tiles. Each
of the S splits takes an equal share of the tile's context, in whole BLOCK_N tiles, computed in the
kernel from the row's real length, so one launch configuration (a CUDA graph) serves any length.
With S > 1 each split writes its running max, sum and unnormalised output in float32 and
`_combine_kernel` merges them; with S = 1 the attention kernel writes the output itself.

Inside a split: online softmax in base 2 (exp2 of scores pre-scaled by scale * log2 e) over KV tiles
of BLOCK_N tokens; each token's physical block is looked up per token, so tiles may span blocks of
any size. Scores and the softmax are float32; products use tensor cores in the cache dtype (bf16 /
fp16; float32 caches use exact IEEE float32 products). Triton's CPU interpreter (triton 3.9)
multiplies bf16 tiles wrongly, so under TRITON_INTERPRET=1 the tiles are converted to float32 first.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels.paged_kv import check_cache, check_positions
from kernels.triton_util import INTERPRETED, to_dtype

_LOG2E = 1.4426950408889634
_NEG_INF = tl.constexpr(float("-inf"))


# The split count S is a loop bound and an index only: unspecialized, so a context that picks a
# new S reuses the kernel compiled for its block BLOCK_S (the warm-up visits each BLOCK_S once).
@triton.jit(do_not_specialize=["S"])
def _attn_kernel(q_ptr, q_sb, q_st, q_sh, kc_ptr, vc_ptr, c_sblk, c_stok, c_sh,
                 table_ptr, table_stride, pos_ptr, pos_sb, pos_st,
                 out_ptr, o_sb, o_st, o_sh, acc_ptr, ml_ptr, qk_scale,
                 T, G, D, BS, S, M_TILES,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 SPLIT: tl.constexpr, F32_DOT: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0) // M_TILES
    mt = tl.program_id(0) % M_TILES
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    m = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] (token, head) pairs, m = t * G + g
    t = m // G
    head = kvh * G + m % G
    valid = t < T
    qpos = tl.load(pos_ptr + b * pos_sb + t * pos_st, mask=valid, other=-1).to(tl.int32)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(q_ptr + b.to(tl.int64) * q_sb + t[:, None].to(tl.int64) * q_st
                + head[:, None].to(tl.int64) * q_sh + d[None, :],
                mask=valid[:, None] & dmask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if F32_DOT:
        q = q.to(tl.float32)
    # this split's share of the tile's context, in whole BLOCK_N tiles
    length = tl.max(qpos, axis=0) + 1
    share = tl.cdiv(tl.cdiv(length, S), BLOCK_N) * BLOCK_N
    start = s * share
    end = tl.minimum(start + share, length)
    m_i = tl.full([BLOCK_M], _NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = table_ptr + b.to(tl.int64) * table_stride
    head_off = kvh.to(tl.int64) * c_sh
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] positions
        live = n < end
        blk = tl.load(table + n // BS, mask=live, other=0).to(tl.int64)
        row = blk * c_sblk + (n % BS).to(tl.int64) * c_stok + head_off  # [BLOCK_N]
        kv_mask = live[:, None] & dmask[None, :]
        k = tl.load(
            kc_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0
        )  # [BLOCK_N, BLOCK_D]
        v = tl.load(vc_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if F32_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] float32
        seen = (n[None, :] <= qpos[:, None]) & live[None, :]
        scores = tl.where(seen, scores * qk_scale, _NEG_INF)
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_ref = tl.where(m_new == _NEG_INF, 0.0, m_new)  # rows that saw nothing yet stay at 0
        p = tl.exp2(scores - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if SPLIT:
        part = ((b * M_TILES + mt) * tl.num_programs(1) + kvh) * S + s
        rows = part.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(acc_ptr + rows[:, None] * BLOCK_D + d[None, :], acc)
        tl.store(ml_ptr + rows * 2, m_i)
        tl.store(ml_ptr + rows * 2 + 1, l_i)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        dst = out_ptr + b.to(tl.int64) * o_sb + t[:, None].to(tl.int64) * o_st \
            + head[:, None].to(tl.int64) * o_sh + d[None, :]
        tl.store(dst, to_dtype(out, out_ptr.dtype.element_ty), mask=valid[:, None] & dmask[None, :])


@triton.jit(do_not_specialize=["S"])
def _combine_kernel(acc_ptr, ml_ptr, out_ptr, o_sb, o_st, o_sh, T, G, D, S, M_TILES,
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0) // M_TILES
    mt = tl.program_id(0) % M_TILES
    kvh = tl.program_id(1)
    first = ((b * M_TILES + mt) * tl.num_programs(1) + kvh) * S  # partial index of split 0
    r = tl.arange(0, BLOCK_M)
    sp = tl.arange(0, BLOCK_S)
    ml = (
        ml_ptr + ((first + sp[:, None]).to(tl.int64) * BLOCK_M + r[None, :]) * 2
    )  # [BLOCK_S, BLOCK_M]
    m_s = tl.load(ml, mask=(sp < S)[:, None], other=_NEG_INF)
    l_s = tl.load(ml + 1, mask=(sp < S)[:, None], other=0.0)
    m_max = tl.max(m_s, axis=0)  # [BLOCK_M]
    m_ref = tl.where(m_max == _NEG_INF, 0.0, m_max)
    total = tl.sum(l_s * tl.exp2(m_s - m_ref[None, :]), axis=0)
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for i in range(0, S):
        row = (first + i).to(tl.int64) * BLOCK_M + r
        m_i = tl.load(ml_ptr + row * 2)
        part = tl.load(acc_ptr + row[:, None] * BLOCK_D + d[None, :])
        acc += part * tl.exp2(m_i - m_ref)[:, None]
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    m = mt * BLOCK_M + r
    t = m // G
    head = kvh * G + m % G
    dst = out_ptr + b.to(tl.int64) * o_sb + t[:, None].to(tl.int64) * o_st \
        + head[:, None].to(tl.int64) * o_sh + d[None, :]
    tl.store(dst, to_dtype(out, out_ptr.dtype.element_ty), mask=(t < T)[:, None] & (d < D)[None, :])


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_splits(rows: int, m_tiles: int, kv_heads: int, max_seq_len: int, device: torch.device,
                  block_n: int = 64, min_share: int = 256) -> int:
    """The number of context splits S: enough programs for two waves of the GPU's SMs, each
    split at least `min_share` positions of `max_seq_len` (a host-side bound), 1 on CPU."""
    programs = rows * m_tiles * kv_heads
    if device.type != "cuda" or programs == 0:
        return 1
    want = triton.cdiv(2 * _sm_count(device.index or 0), programs)
    return max(1, min(want, triton.cdiv(max_seq_len, max(min_share, block_n))))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_table: torch.Tensor, positions: torch.Tensor, *,
                    scale: float | None = None, max_seq_len: int | None = None,
                    num_splits: int | None = None, out: torch.Tensor | None = None,
                    block_n: int | None = None, num_warps: int = 4,
                    num_stages: int = 2) -> torch.Tensor:
    """Causal attention of new queries over a paged KV cache (module docstring; `kernels.paged_kv`).

    q: [B, T, H, D] (bf16 / fp16 / fp32, the cache dtype; any strides with a unit last one: a view
        of a fused projection works); H a multiple of the cache's Hkv.
    k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_table: int32 [B, max_blocks];
    positions: int32/int64 [B, T], the queries' positions (-1 = padding); every key position a
        query sees must already be written (`write_kv` before this call).
    scale: default 1/sqrt(D). max_seq_len: host-side bound on positions + 1 used only to choose S
        (default block_table.shape[1] * block_size). num_splits: S, default `choose_splits`.
    out: [B, T, H, D] in q's dtype (any strides, unit last), default a new contiguous tensor.
    block_n, num_warps, num_stages: tuning (KV tile, default 64 for D <= 128 else 32; Triton's
        warps and pipeline stages); bench/kernel_speed.py sweeps them.
    Returns out. Raises ValueError for inconsistent shapes, dtypes or devices. No host sync."""
    check_cache(k_cache, v_cache, block_table)
    _, bs, hkv, d = k_cache.shape
    if q.dim() != 4 or q.shape[-1] != d or q.shape[2] % hkv or q.dtype != k_cache.dtype \
            or q.stride(-1) != 1 or q.device != k_cache.device:
        raise ValueError(f"q: expected {k_cache.dtype} [B, T, H, {d}] with H a multiple of {hkv} "
                         f"and a unit last stride on {k_cache.device}, got {q.dtype} "
                         f"{tuple(q.shape)} strides {q.stride()} on {q.device}")
    rows, tokens, heads, _ = q.shape
    check_positions(positions, rows, tokens, q.device)
    if block_table.shape[0] != rows:
        raise ValueError(f"block_table: expected {rows} rows, got {block_table.shape[0]}")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out: expected {q.dtype} {tuple(q.shape)} with a unit last stride, got "
                         f"{out.dtype} {tuple(out.shape)} strides {out.stride()}")
    if rows * tokens == 0:
        return out
    group = heads // hkv
    pairs = tokens * group
    block_m = max(16, triton.next_power_of_2(pairs)) if pairs <= 64 else 64
    m_tiles = triton.cdiv(pairs, block_m)
    block_d = max(16, triton.next_power_of_2(d))
    block_n = (64 if block_d <= 128 else 32) if block_n is None else block_n
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n: expected a power of two >= 16, got {block_n}")
    bound = block_table.shape[1] * bs if max_seq_len is None else max_seq_len
    splits = choose_splits(rows, m_tiles, hkv, bound, q.device, block_n) if num_splits is None \
        else num_splits
    if splits < 1:
        raise ValueError(f"num_splits: expected >= 1, got {splits}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if splits > 1:
        count = rows * m_tiles * hkv * splits
        acc = torch.empty(count, block_m, block_d, dtype=torch.float32, device=q.device)
        ml = torch.empty(count, block_m, 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # unused
    grid = (rows * m_tiles, hkv, splits)
    _attn_kernel[grid](
        q, q.stride(0), q.stride(1), q.stride(2), k_cache, v_cache, k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), block_table, block_table.stride(0), positions,
        positions.stride(0), positions.stride(1), out, out.stride(0), out.stride(1), out.stride(2),
        acc, ml, scale * _LOG2E, tokens, group, d, bs, splits, m_tiles,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, SPLIT=splits > 1,
        F32_DOT=INTERPRETED, IEEE=q.dtype == torch.float32, num_warps=num_warps,
        num_stages=num_stages)
    if splits > 1:
        _combine_kernel[(rows * m_tiles, hkv)](
            acc, ml, out, out.stride(0), out.stride(1), out.stride(2), tokens, group, d, splits,
            m_tiles, BLOCK_M=block_m, BLOCK_D=block_d,
            BLOCK_S=triton.next_power_of_2(splits), num_warps=4)
    return out


def paged_attention_per_query(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_table: torch.Tensor, positions: torch.Tensor, *,
                              lane_len: int, scale: float | None = None) -> torch.Tensor:
    """`paged_attention` with each query computed as a decode step (T = 1) at its position would
    compute it, whatever the forward's width and batch: the B x T queries run as B x T rows of one
    token (the rows' tables repeated per token), so a row's M tile holds one query's G heads and
    its context, read from 0 to its own position, is split by its own length; the split count S
    comes from the lane length `lane_len` and the KV heads alone (`choose_splits` of one row), not
    from the forward's rows or its context bound. Arguments as `paged_attention`; returns a new
    [B, T, H, D] tensor."""
    rows, tokens, heads, d = q.shape
    hkv = k_cache.shape[2]
    pairs = heads // hkv
    block_m = max(16, triton.next_power_of_2(pairs)) if pairs <= 64 else 64
    block_n = 64 if max(16, triton.next_power_of_2(d)) <= 128 else 32
    splits = choose_splits(1, triton.cdiv(pairs, block_m), hkv, lane_len, q.device, block_n)
    tables = block_table if tokens == 1 else block_table.repeat_interleave(tokens, dim=0)
    out = paged_attention(q.reshape(rows * tokens, 1, heads, d), k_cache, v_cache, tables,
                          positions.reshape(rows * tokens, 1), scale=scale, max_seq_len=lane_len,
                          num_splits=splits, block_n=block_n)
    return out.view(rows, tokens, heads, d)
