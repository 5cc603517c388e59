"""Paged key/value storage of a model's attention layers: fixed-size blocks and a table per lane.

Layout (`kernels.paged_kv`): one pool `pool: [num_layers, 2, num_blocks, block_size, Hkv, D]`,
allocated once at start, and `block_table: [lanes, max_blocks]` int32 on the same device. Token
`p` of the request in lane `l` lives in block `block_table[l, p // block_size]` at offset
`p % block_size`. Block 0 is the trash block: every table entry not backed by an allocated block
names it, so the writes of padding rows and of the scratch lane land there and nothing reads them.

Right after `allocate` each lane owns `ceil(max_len / block_size)` blocks of its own in order (a
static layout: the model runs without any allocator). The Program's block manager
(program/blocks.py) then takes the tables over: it allocates blocks as lanes grow, shares the full
blocks of equal prompt prefixes between lanes (the prefix cache) and frees them.

A forward writes each new token's keys and values into its slot, then attends each query at
position p to positions 0..p of its row through the table (`attend`): the Triton kernels
`kernels.paged_kv.write_kv` + `kernels.paged_attention.paged_attention` on CUDA (one kernel pair,
whose plain-torch reference is `kernels.paged_kv_ref`, for prefill chunks, decode and verification
alike); on the CPU the rows' blocks are gathered whole through the same tables and attended with
torch's scaled_dot_product_attention (`attend`). Slots past a lane's committed frontier are
overwritten before being read (models/state.py), so a lane is reused without clearing anything and
`commit` has nothing to do. A shared (cached) block is never written: a lane only writes positions
after its cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.worker.models.config import ModelConfig

BLOCK_SIZE = 16  # positions per block (the default)
TRASH_BLOCK = 0
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the Triton kernels take


def _width_invariant(q: torch.Tensor) -> bool:
    # The width-invariant route (models/layers.py `width_invariant`) for q [B, T, H, D]
    from kernels.gemv import INVARIANT_MAX_ROWS
    from services.worker.models import layers

    return layers.width_invariant(q.shape[1]) and q.shape[0] * q.shape[1] <= INVARIANT_MAX_ROWS


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def blocks_per_lane(max_len: int, block_size: int) -> int:
    return -(-max_len // block_size)


def positions_for_budget(bytes_per_token: int, lanes: int, budget_bytes: int,
                         block_size: int = BLOCK_SIZE) -> int:
    """The most positions per lane (a multiple of block_size) whose pool, trash block and block
    tables (`KVCache.create`'s layout) fit `budget_bytes`; 0 if not one block per lane fits."""
    if lanes <= 0 or budget_bytes < 0:
        raise ValueError(
            f"lanes must be positive and budget_bytes >= 0, got {lanes}, {budget_bytes}"
        )
    block = block_size * bytes_per_token
    return max(0, (budget_bytes - block) // (lanes * (block + 4))) * block_size


@dataclass(frozen=True, eq=False)
class PagedRows:
    """One forward's view of its rows' KV (`KVCache.rows`), shared by all its layers."""

    tables: torch.Tensor  # [B, max_blocks] int32
    positions: torch.Tensor  # [B, T]
    kv_len: int  # host-side bound on positions + 1
    slots: torch.Tensor | None = None  # [B, T] int64 flat slots (CPU path; None on CUDA)
    blocks: torch.Tensor | None = None  # [B, ceil(kv_len / block_size)] int64 (CPU path)
    visible: torch.Tensor | None = None  # [B, 1, T, kv_len] bool (CPU path)


@dataclass(eq=False)
class KVCache:
    """Paged key/value storage; build it with `KVCache.allocate`, `KVCache.create` or
    `KVCache.from_budget`. `max_len`: positions one lane may hold."""

    pool: torch.Tensor  # [num_layers, 2, num_blocks, block_size, Hkv, D]
    block_table: torch.Tensor  # [lanes, max_blocks] int32, on pool's device
    max_len: int

    @property
    def num_layers(self) -> int:
        return self.pool.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.pool.shape[2]

    @property
    def block_size(self) -> int:
        return self.pool.shape[3]

    @property
    def lanes(self) -> int:
        return self.block_table.shape[0]

    @property
    def max_blocks(self) -> int:
        """Table entries per lane: ceil(max_len / block_size)."""
        return self.block_table.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def nbytes(self) -> int:
        return self.pool.numel() * self.pool.element_size() + self.block_table.numel() * 4

    def keys(self, layer: int) -> torch.Tensor:
        """Keys of one layer: [num_blocks, block_size, Hkv, D] (a view)."""
        return self.pool[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        """Values of one layer: [num_blocks, block_size, Hkv, D] (a view)."""
        return self.pool[layer, 1]

    def rows(self, lanes: torch.Tensor, positions: torch.Tensor, kv_len: int) -> "PagedRows":
        """What every layer of one forward needs to reach its rows' KV: lanes [B] int64,
        positions [B, T] (each < kv_len, a host-side bound <= max_len). The block tables are a
        gather on the device (inside a CUDA graph it reads the tables as they are at replay)."""
        tables = self.block_table.index_select(0, lanes)  # [B, max_blocks] int32
        if self.device.type == "cuda" and self.dtype in _KERNEL_DTYPES:
            return PagedRows(tables, positions, kv_len)
        bs = self.block_size
        pos = positions.long()
        blk = tables.long().gather(1, pos.clamp(min=0) // bs)  # [B, T]
        slots = torch.where(pos >= 0, blk * bs + pos % bs, TRASH_BLOCK * bs)  # padding -> trash
        blocks = tables[:, :blocks_per_lane(kv_len, bs)].long()  # [B, nblk]
        visible = (torch.arange(kv_len, device=pos.device)[None, None, :] <= pos[:, :, None])[
            :, None
        ]
        return PagedRows(tables, positions, kv_len, slots=slots, blocks=blocks, visible=visible)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               rows: "PagedRows") -> torch.Tensor:
        """Write this forward's keys and values of `layer`, then attend: q [B, T, H, D], k, v
        [B, T, Hkv, D], rows from `rows(lanes, positions, kv_len)` -> [B, T, H, D] in q's dtype;
        query (b, t) sees positions 0..positions[b, t] of row b.

        CUDA (bf16 / fp16 / fp32 caches): `kernels.paged_kv.write_kv` +
        `kernels.paged_attention.paged_attention` (the kernel pair whose reference is
        `kernels.paged_kv_ref`). Elsewhere (the CPU; float64 test models): the same slots written
        with one index_put, the rows' blocks gathered whole through their tables (positions
        < kv_len) and torch's scaled_dot_product_attention under the causal mask: the numerical
        route the CPU engine had before paging, several times faster there than the per-token
        reference."""
        kc, vc = self.keys(layer), self.values(layer)
        dtype = q.dtype
        q, k, v = q.to(kc.dtype), k.to(kc.dtype), v.to(kc.dtype)
        if rows.slots is None:
            from kernels.paged_attention import paged_attention
            from kernels.paged_kv import write_kv

            write_kv(kc, vc, k, v, rows.tables, rows.positions)
            if _width_invariant(q):
                from kernels.paged_attention import paged_attention_per_query

                out = paged_attention_per_query(q, kc, vc, rows.tables, rows.positions,
                                                lane_len=self.max_len)
            else:
                out = paged_attention(q, kc, vc, rows.tables, rows.positions,
                                      max_seq_len=rows.kv_len)
            return out.to(dtype)
        nb, bs, hkv, d = kc.shape
        B, T, H, _ = q.shape
        flat = rows.slots.reshape(-1)  # [B*T]
        kc.view(nb * bs, hkv, d).index_copy_(0, flat, k.reshape(B * T, hkv, d))
        vc.view(nb * bs, hkv, d).index_copy_(0, flat, v.reshape(B * T, hkv, d))
        L, blocks = rows.kv_len, rows.blocks.reshape(-1)
        keys = (
            kc.index_select(0, blocks).view(B, -1, hkv, d)[:, :L].transpose(1, 2)
        )  # [B, Hkv, L, D]
        values = vc.index_select(0, blocks).view(B, -1, hkv, d)[:, :L].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=rows.visible, enable_gqa=H != hkv
        )  # [B, H, T, D]
        return out.transpose(1, 2).to(dtype)

    def commit(self, lanes: torch.Tensor, kept: torch.Tensor) -> None:
        """Nothing to do: keys and values past the kept positions lie beyond the committed
        frontier and are overwritten before being read (models/state.py)."""

    def count_whole(self, lanes: torch.Tensor, counts: torch.Tensor) -> None:
        """Nothing to do (a forward split into segments, program/prefill_graphs.py
        `run_segments`, left its KV in place; commit keeps no per-forward count)."""

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one cached token costs over all layers (keys and values)."""
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element_size(dtype)

    @staticmethod
    def positions_for_budget(
        config: ModelConfig, lanes: int, budget_bytes: int, dtype: torch.dtype
    ) -> int:
        """Positions per lane (whole blocks) that `lanes` lanes fit in `budget_bytes`; 0 if none."""
        return positions_for_budget(KVCache.bytes_per_token(config, dtype), lanes, budget_bytes)

    @classmethod
    def create(cls, num_layers: int, num_kv_heads: int, head_dim: int, lanes: int, max_len: int, *,
               dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               block_size: int = BLOCK_SIZE, num_blocks: int | None = None) -> "KVCache":
        """A zero-filled pool with the static layout (module docstring). num_blocks: default (and
        minimum) 1 + lanes * ceil(max_len / block_size), every lane's full length plus the trash
        block; more blocks give the prefix cache room beyond the lanes. Raises ValueError for
        non-positive sizes or too few blocks."""
        if lanes <= 0:
            raise ValueError(f"lanes must be positive, got {lanes}")
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        per_lane = blocks_per_lane(max_len, block_size)
        least = 1 + lanes * per_lane
        if num_blocks is None:
            num_blocks = least
        if num_blocks < least:
            raise ValueError(
                f"num_blocks: {lanes} lanes of {max_len} positions need at least {least} "
                f"blocks of {block_size}, got {num_blocks}"
            )
        pool = torch.zeros(
            num_layers,
            2,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype=dtype,
            device=device,
        )
        static = 1 + torch.arange(lanes * per_lane, dtype=torch.int32).view(lanes, per_lane)
        return cls(pool, static.to(device), max_len)

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        lanes: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        block_size: int = BLOCK_SIZE,
        num_blocks: int | None = None,
    ) -> "KVCache":
        """The dense model's cache: `lanes` lanes of `max_len` positions (see `create`)."""
        return cls.create(config.num_layers, config.num_kv_heads, config.head_dim, lanes, max_len,
                          dtype=dtype, device=device, block_size=block_size, num_blocks=num_blocks)

    @classmethod
    def from_budget(
        cls,
        config: ModelConfig,
        lanes: int,
        budget_bytes: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_len: int | None = None,
    ) -> "KVCache":
        """The longest lanes that fit `budget_bytes`, capped at `max_len` (default: the model's
        max_position_embeddings). Raises ValueError when not even one position per lane fits."""
        if lanes <= 0:
            raise ValueError(f"lanes must be positive, got {lanes}")
        cap = config.max_position_embeddings if max_len is None else max_len
        per_lane = cls.positions_for_budget(config, lanes, budget_bytes, dtype)
        if per_lane <= 0:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no position for {lanes} lanes "
                f"({cls.bytes_per_token(config, dtype)} bytes per token)"
            )
        return cls.allocate(config, lanes, min(per_lane, cap), dtype, device)
