"""Plain-torch references of the paged KV kernels (`kernels.paged_kv`, `kernels.paged_attention`).

Same layout and semantics (see `kernels.paged_kv`): written for reading, and as the CPU path. The
attention gathers each row's positions 0..max through the block table (the kernel never does),
computes scores and softmax in float32 and rounds the output once to q's dtype.
"""

from __future__ import annotations

import math

import torch

from kernels.paged_kv import check_cache, check_positions


def slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot index block * block_size + offset of each position ([B, T] -> [B, T] int64);
    padding positions (-1) map to -1."""
    pos = positions.long()
    blk = block_table.long().gather(1, pos.clamp(min=0) // block_size)  # [B, T]
    return torch.where(pos >= 0, blk * block_size + pos % block_size, -1)


def write_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 block_table: torch.Tensor, positions: torch.Tensor) -> None:
    """`kernels.paged_kv.write_kv`: k, v [B, T, Hkv, D] into their slots; -1 positions skipped."""
    check_cache(k_cache, v_cache, block_table)
    check_positions(positions, k.shape[0], k.shape[1], k_cache.device)
    nb, bs, hkv, d = k_cache.shape
    flat = slots(block_table, positions, bs)  # [B, T]
    keep = flat >= 0
    k_cache.view(nb * bs, hkv, d)[flat[keep]] = k[keep].to(k_cache.dtype)
    v_cache.view(nb * bs, hkv, d)[flat[keep]] = v[keep].to(v_cache.dtype)


def gather_kv_ref(cache: torch.Tensor, block_table: torch.Tensor, length: int,
                  row_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Positions 0..length-1 of every row: [B, length, Hkv, D] (a copy; the reference's gather).

    row_lengths: [B], the positions each row holds (default all `length`); later positions are
    zeros and their table entries are never read."""
    nb, bs, hkv, d = cache.shape
    rows = block_table.shape[0]
    pos = torch.arange(length, device=cache.device).expand(rows, length)  # [B, L]
    held = pos < (length if row_lengths is None else row_lengths.long()[:, None])
    flat = slots(block_table, torch.where(held, pos, -1), bs)  # [B, L], -1 outside the row
    out = cache.reshape(nb * bs, hkv, d)[flat.clamp(min=0)]
    return torch.where(held[:, :, None, None], out, torch.zeros((), dtype=cache.dtype,
                                                               device=cache.device))


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_table: torch.Tensor, positions: torch.Tensor, *,
                        scale: float | None = None) -> torch.Tensor:
    """`kernels.paged_attention.paged_attention`: q [B, T, H, D] -> [B, T, H, D] in q's dtype.

    Query (b, t) attends to positions 0..positions[b, t] of row b; -1 queries give zeros."""
    check_cache(k_cache, v_cache, block_table)
    rows, tokens, heads, d = q.shape
    check_positions(positions, rows, tokens, q.device)
    hkv = k_cache.shape[2]
    assert heads % hkv == 0 and d == k_cache.shape[3]
    group = heads // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    row_lengths = positions.long().amax(1) + 1  # [B]
    length = int(row_lengths.max()) if positions.numel() else 0
    out = torch.zeros_like(q)
    if length <= 0:
        return out
    keys = gather_kv_ref(k_cache, block_table, length, row_lengths).float()  # [B, L, Hkv, D]
    values = gather_kv_ref(v_cache, block_table, length, row_lengths).float()
    qg = q.float().reshape(rows, tokens, hkv, group, d)  # [B, T, Hkv, G, D]
    scores = torch.einsum("btkgd,blkd->bkgtl", qg, keys) * scale  # [B, Hkv, G, T, L]
    seen = torch.arange(length, device=q.device)[None, None, :] <= positions.long()[:, :, None]
    scores = scores.masked_fill(~seen[:, None, None], float("-inf"))  # [B, T, L] broadcast
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - torch.where(top == float("-inf"), 0.0, top))
    total = weights.sum(-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, 1.0)
    ctx = torch.einsum("bkgtl,blkd->btkgd", probs, values)  # [B, T, Hkv, G, D]
    out.copy_(ctx.reshape(rows, tokens, heads, d))
    return out
