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
`kernels.paged_kv.write_kv` + `kernels.paged_attention.paged_attention` on CUDA, their plain-torch
references (`kernels.paged_kv_ref`) elsewhere; one kernel/reference pair for prefill chunks,
decode and verification alike. Slots past a lane's committed frontier are overwritten before being
read (models/state.py), so a lane is reused without clearing anything and `commit` has nothing to
do. A shared (cached) block is never written: a lane only writes positions after its cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import paged_kv_ref
from services.worker.models.config import ModelConfig

BLOCK_SIZE = 16  # positions per block (the default)
TRASH_BLOCK = 0


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def blocks_per_lane(max_len: int, block_size: int) -> int:
    return -(-max_len // block_size)


def positions_for_budget(bytes_per_token: int, lanes: int, budget_bytes: int,
                         block_size: int = BLOCK_SIZE) -> int:
    """The most positions per lane (a multiple of block_size) whose pool, trash block and block
    tables (`KVCache.create`'s layout) fit `budget_bytes`; 0 if not one block per lane fits."""
    if lanes <= 0 or budget_bytes < 0:
        raise ValueError(f"lanes must be positive and budget_bytes >= 0, got {lanes}, {budget_bytes}")
    block = block_size * bytes_per_token
    return max(0, (budget_bytes - block) // (lanes * (block + 4))) * block_size


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

    def tables(self, lanes: torch.Tensor) -> torch.Tensor:
        """The block tables of a forward's rows: lanes [B] int64 -> [B, max_blocks] int32 (a
        gather on the device: inside a CUDA graph it reads the tables as they are at replay)."""
        return self.block_table.index_select(0, lanes)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               tables: torch.Tensor, positions: torch.Tensor, *, max_seq_len: int | None = None) -> torch.Tensor:
        """Write this forward's keys and values of `layer`, then attend: q [B, T, H, D], k, v
        [B, T, Hkv, D], tables [B, max_blocks] (`tables(lanes)`), positions [B, T] -> [B, T, H, D]
        in q's dtype; query (b, t) sees positions 0..positions[b, t] of row b. max_seq_len: a
        host-side bound on positions + 1 (the CUDA kernel's split choice only)."""
        kc, vc = self.keys(layer), self.values(layer)
        dtype = q.dtype
        q, k, v = q.to(kc.dtype), k.to(kc.dtype), v.to(kc.dtype)
        if kc.device.type == "cuda":
            from kernels.paged_attention import paged_attention
            from kernels.paged_kv import write_kv

            write_kv(kc, vc, k, v, tables, positions)
            out = paged_attention(q, kc, vc, tables, positions, max_seq_len=max_seq_len)
        else:
            paged_kv_ref.write_kv_ref(kc, vc, k, v, tables, positions)
            out = paged_kv_ref.paged_attention_ref(q, kc, vc, tables, positions)
        return out.to(dtype)

    def commit(self, lanes: torch.Tensor, kept: torch.Tensor) -> None:
        """Nothing to do: keys and values past the kept positions lie beyond the committed
        frontier and are overwritten before being read (models/state.py)."""

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one cached token costs over all layers (keys and values)."""
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * _element_size(dtype)

    @staticmethod
    def positions_for_budget(config: ModelConfig, lanes: int, budget_bytes: int, dtype: torch.dtype) -> int:
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
            raise ValueError(f"num_blocks: {lanes} lanes of {max_len} positions need at least {least} "
                             f"blocks of {block_size}, got {num_blocks}")
        pool = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                           device=device)
        static = 1 + torch.arange(lanes * per_lane, dtype=torch.int32).view(lanes, per_lane)
        return cls(pool, static.to(device), max_len)

    @classmethod
    def allocate(cls, config: ModelConfig, lanes: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", *, block_size: int = BLOCK_SIZE,
                 num_blocks: int | None = None) -> "KVCache":
        """The dense model's cache: `lanes` lanes of `max_len` positions (see `create`)."""
        return cls.create(config.num_layers, config.num_kv_heads, config.head_dim, lanes, max_len,
                          dtype=dtype, device=device, block_size=block_size, num_blocks=num_blocks)

    @classmethod
    def from_budget(cls, config: ModelConfig, lanes: int, budget_bytes: int, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", max_len: int | None = None) -> "KVCache":
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
