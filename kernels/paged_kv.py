"""Paged key/value storage: the layout, and the Triton kernel that writes new tokens into it.

Layout (one layer; a pool `[num_layers, 2, num_blocks, block_size, Hkv, D]` gives every layer's
K and V as views):

    k_cache, v_cache: [num_blocks, block_size, Hkv, D]   any float dtype, unit last stride
    block_table:      [B, max_blocks] int32                row b's logical block j -> physical block
    token at position p of row b:
        k_cache[block_table[b, p // block_size], p % block_size]   (and v_cache alike)

- Rows are the batch rows of one call (gather a per-lane table with `table[lanes]` first); a row's
  blocks need not be contiguous or ordered, and several rows may name the same physical block: a
  prefix cache shares full blocks of equal token prefixes between lanes. Shared blocks
  are read-only by construction: a row only writes positions after its cached prefix, which lie in
  blocks it owns; the allocator (not these kernels) guarantees that.
- A kernel reads `block_table[b, j]` only for blocks that hold a position it needs (j <=
  max position // block_size); other entries may hold anything.
- Positions are per token: `positions[b, t]` is the position of row b's t-th new token (the query
  and key/value of that token), or -1 for padding, which writes nothing and attends to nothing.
  Attention of query (b, t) reads positions 0..positions[b, t] of row b: causal inside the window
  of new tokens (speculative verification, T = K + 1) and no mask tensor.
- block_size is any positive integer (16 is the usual choice; the kernels tile the sequence in
  BLOCK_N tokens that may span several physical blocks).

`kernels.paged_kv_ref` holds the plain-torch references of `write_kv` and of
`kernels.paged_attention.paged_attention`, with the same semantics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_util import to_dtype


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor) -> None:
    """Raise ValueError unless k_cache, v_cache are equal [NB, BS, Hkv, D] (unit last stride) and
    block_table is int32 [B, max_blocks] on their device."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype \
            or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError(
            f"k_cache, v_cache: expected equal [num_blocks, block_size, Hkv, D] of one "
            f"dtype and equal strides with a unit last stride, got "
            f"{tuple(k_cache.shape)} {k_cache.dtype} {k_cache.stride()} and "
            f"{tuple(v_cache.shape)} {v_cache.dtype} {v_cache.stride()}"
        )
    if block_table.dim() != 2 or block_table.dtype != torch.int32 \
            or block_table.device != k_cache.device or v_cache.device != k_cache.device:
        raise ValueError(f"block_table: expected int32 [B, max_blocks] on {k_cache.device}, got "
                         f"{block_table.dtype} {tuple(block_table.shape)} on {block_table.device}")


def check_positions(positions: torch.Tensor, rows: int, tokens: int, device) -> None:
    if positions.shape != (rows, tokens) or positions.dtype not in (torch.int32, torch.int64) \
            or positions.device != torch.device(device):
        raise ValueError(f"positions: expected int32/int64 [{rows}, {tokens}] on {device}, got "
                         f"{positions.dtype} {tuple(positions.shape)} on {positions.device}")


@triton.jit
def _write_kv_kernel(k_ptr, k_sb, k_st, k_sh, v_ptr, v_sb, v_st, v_sh,
                     kc_ptr, vc_ptr, c_sblk, c_stok, c_sh, table_ptr, table_stride,
                     pos_ptr, pos_sb, pos_st, T, HKV, D, BS,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0) // T
    t = tl.program_id(0) % T
    pos = tl.load(pos_ptr + row * pos_sb + t * pos_st).to(tl.int64)
    blk = tl.load(table_ptr + row * table_stride + tl.maximum(pos, 0) // BS)  # entry 0 if padding
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    # [BLOCK_H, BLOCK_D]; pos broadcast first (the interpreter rejects tensor & scalar-bool masks)
    ok = (h < HKV)[:, None] & (d < D)[None, :] & (h[:, None] * 0 + pos >= 0)
    src = h[:, None].to(tl.int64) * k_sh + d[None, :]
    k = tl.load(k_ptr + row.to(tl.int64) * k_sb + t * k_st + src, mask=ok)
    src = h[:, None].to(tl.int64) * v_sh + d[None, :]
    v = tl.load(v_ptr + row.to(tl.int64) * v_sb + t * v_st + src, mask=ok)
    dst = (
        blk.to(tl.int64) * c_sblk
        + (pos % BS) * c_stok
        + h[:, None].to(tl.int64) * c_sh
        + d[None, :]
    )
    tl.store(kc_ptr + dst, to_dtype(k.to(tl.float32), kc_ptr.dtype.element_ty), mask=ok)
    tl.store(vc_ptr + dst, to_dtype(v.to(tl.float32), vc_ptr.dtype.element_ty), mask=ok)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             block_table: torch.Tensor, positions: torch.Tensor) -> None:
    """Write the new tokens' keys and values into their blocks (see the module docstring).

    k, v: [B, T, Hkv, D] (any strides with a unit last stride: views of a fused q|k|v output work),
        cast to the cache dtype (the same dtype in the model: a plain copy);
    positions: [B, T] int32/int64, -1 = padding (not written); every written position p must have
        block_table[b, p // block_size] allocated, and no two tokens may name the same slot.
    Raises ValueError for inconsistent shapes, dtypes or devices. No host synchronisation."""
    check_cache(k_cache, v_cache, block_table)
    _, bs, hkv, d = k_cache.shape
    if k.dim() != 4 or k.shape != v.shape or k.shape[2:] != (hkv, d) or k.stride(-1) != 1 \
            or v.stride(-1) != 1 or k.device != k_cache.device or v.device != k_cache.device:
        raise ValueError(f"k, v: expected equal [B, T, {hkv}, {d}] with a unit last stride on "
                         f"{k_cache.device}, got {tuple(k.shape)} and {tuple(v.shape)}")
    rows, tokens = k.shape[:2]
    check_positions(positions, rows, tokens, k_cache.device)
    if block_table.shape[0] != rows:
        raise ValueError(f"block_table: expected {rows} rows, got {block_table.shape[0]}")
    if rows * tokens == 0:
        return
    _write_kv_kernel[(rows * tokens,)](
        k, k.stride(0), k.stride(1), k.stride(2), v, v.stride(0), v.stride(1), v.stride(2),
        k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table,
        block_table.stride(0), positions, positions.stride(0), positions.stride(1), tokens, hkv,
        d, bs,
        BLOCK_H=triton.next_power_of_2(hkv), BLOCK_D=triton.next_power_of_2(d), num_warps=4)
