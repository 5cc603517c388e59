"""The block manager of the paged KV cache, and the automatic prefix cache.

The pool (models/kv_cache.py) is allocated once at start; this module decides which physical block
backs each lane's logical block, through the lanes' block tables:

- `reserve(lane, end)` before a forward: the lane's table covers positions < end, new blocks taken
  from the free list, else from the least recently used cached block (an eviction).
- `commit(lane, start, tokens)` after a committed step: the lane holds `tokens` from `start` on;
  every block that is now full of committed tokens joins the prefix cache under its hash.
- `attach(lane, tokens, limit)` at admission: the longest chain of cached full blocks that begins
  `tokens` (at most `limit` tokens) becomes the start of the lane's table; those positions are not
  prefilled again.
- `release(lane)` when the lane is freed (finish, preemption): each block loses a reference; a
  cached block with none left stays cached (least recently used first out), any other is free.

Cache identity: block j of a sequence is named by the hash chain h_j = H(h_{j-1}, tokens of block
j) with h_{-1} = H(model identity), so a block matches only under the same model and the same
tokens before it and in it. Only model state (KV) is cached: never a matcher or sampling choice;
constraints, tools and thinking settings change the cache identity only through the tokens they
render. A cached block is never written: it is full of committed tokens, and a lane writes only
positions at or after its committed frontier. A block is free only when no lane references it
(`refs`), so a block in use is never evicted.

Hybrid models (Qwen3.5): the recurrent GDN state cannot be rebuilt from KV, so the manager also
keeps snapshots of a lane's committed recurrent state at block boundaries its prompt chunks end
on (the scheduler ends one chunk at the prompt's last full block: models/qwen35_state.py
`save_snapshot`), keyed by the boundary block's hash, LRU over a fixed number of slots. A hit
attaches cached blocks only up to the deepest boundary with a snapshot and loads it into the lane.

Capacity: the pool has at least every lane's full length plus the trash block, so a lane can always
grow to max_len: the referenced blocks never exceed the lanes' table entries, and every other block
is free or evictable.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import torch

from services.worker.models.kv_cache import TRASH_BLOCK, KVCache


def chain_hash(parent: bytes, tokens) -> bytes:
    """h_j = H(h_{j-1}, block tokens): a 128-bit BLAKE2b digest."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
    return h.digest()


def identity_hash(identity: str) -> bytes:
    """h_{-1}: the model (and adapter) identity a chain starts from."""
    return hashlib.blake2b(identity.encode("utf-8"), digest_size=16).digest()


@dataclass
class PrefixCacheStats:
    """Cumulative counters (the worker's metrics read their deltas)."""

    lookups: int = 0  # attach calls with the cache enabled
    lookup_tokens: int = 0  # tokens those calls could have found (up to their limit)
    hit_tokens: int = 0  # tokens found cached
    evictions: int = 0  # cached blocks reused for new data

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


@dataclass
class _Lane:
    blocks: list[int] = field(default_factory=list)  # physical block of each logical block
    tokens: list[int] = field(default_factory=list)  # committed tokens held (positions 0..)
    hashes: list[bytes] = field(default_factory=list)  # hash of each full committed block


class BlockManager:
    """Allocation, reference counts, the prefix cache and LRU eviction over one KVCache.

    `lanes`: the lanes it manages (the Program's resident lanes; a scratch lane beyond them keeps
    the trash block). `identity`: the model identity hashed into every chain. `enabled`: False
    turns the prefix cache off (blocks are still allocated and freed here)."""

    def __init__(self, cache: KVCache, lanes: int, *, identity: str, enabled: bool = True,
                 recurrent=None, snapshots: int = 0) -> None:
        assert lanes <= cache.lanes
        self.cache = cache
        self.block_size = cache.block_size
        self.enabled = enabled
        self.stats = PrefixCacheStats()
        self._root = identity_hash(identity)
        self._refs = [0] * cache.num_blocks
        self._free: deque[int] = deque(range(1, cache.num_blocks))  # block 0 is the trash block
        self._hash_of: dict[int, bytes] = {}  # cached block -> its hash
        self._block_of: dict[bytes, int] = {}  # hash -> cached block
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks without references
        self._lanes = [_Lane() for _ in range(lanes)]
        # A hybrid model's recurrent state at block boundaries: hash -> snapshot slot, LRU order.
        self._recurrent = recurrent if enabled else None
        self._snap_of: OrderedDict[bytes, int] = OrderedDict()
        self._free_snaps: deque[int] = deque(range(snapshots))
        cache.block_table.fill_(TRASH_BLOCK)  # the manager takes the static layout over

    # ---------------------------------------------------------------- views

    @property
    def free_blocks(self) -> int:
        """Blocks a lane could take now: free plus cached without references."""
        return len(self._free) + len(self._lru)

    @property
    def cached_blocks(self) -> int:
        return len(self._hash_of)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def lane_blocks(self, lane: int) -> list[int]:
        return list(self._lanes[lane].blocks)

    # ---------------------------------------------------------------- lane life

    def attach(self, lane: int, tokens, limit: int) -> int:
        """Start `lane` (holding nothing) with the cached blocks of the longest cached prefix of
        `tokens`, at most `limit` tokens (whole blocks). Returns the number of tokens found."""
        state = self._lanes[lane]
        assert not state.blocks and not state.tokens, f"lane {lane} is not empty"
        if not self.enabled:
            return 0
        bs = self.block_size
        self.stats.lookups += 1
        self.stats.lookup_tokens += max(0, limit)
        parent = self._root
        for j in range(max(0, limit) // bs):
            block_tokens = tokens[j * bs:(j + 1) * bs]
            h = chain_hash(parent, block_tokens)
            block = self._block_of.get(h)
            if block is None:
                break
            self._take(block)
            state.blocks.append(block)
            state.hashes.append(h)
            state.tokens.extend(block_tokens)
            parent = h
        if self._recurrent is not None:
            self._resume_recurrent(lane)
        found = len(state.blocks) * bs
        self.stats.hit_tokens += found
        if state.blocks:
            self._write_table(lane, 0)
        return found

    def reserve(self, lane: int, end: int) -> None:
        """Back the lane's positions < end with blocks (end <= max_len)."""
        state = self._lanes[lane]
        need = -(-end // self.block_size)
        assert need <= self.cache.max_blocks, (end, self.cache.max_len)
        first = len(state.blocks)
        while len(state.blocks) < need:
            state.blocks.append(self._allocate())
        if need > first:
            self._write_table(lane, first)

    def commit(self, lane: int, start: int, tokens, *, snapshot: bool = False) -> None:
        """The lane's committed positions are now `start + len(tokens)`, holding `tokens` from
        `start`; full committed blocks join the prefix cache. `snapshot`: a hybrid model's
        recurrent state is kept too when the frontier is a block boundary (prompt chunks)."""
        if not self.enabled:
            return
        state = self._lanes[lane]
        assert start >= len(state.hashes) * self.block_size, "a cached block cannot change"
        del state.tokens[start:]
        assert len(state.tokens) == start, (len(state.tokens), start)
        state.tokens.extend(int(t) for t in tokens)
        bs = self.block_size
        while (len(state.hashes) + 1) * bs <= len(state.tokens):
            j = len(state.hashes)
            parent = state.hashes[-1] if state.hashes else self._root
            h = chain_hash(parent, state.tokens[j * bs:(j + 1) * bs])
            state.hashes.append(h)
            block = state.blocks[j]
            if self.enabled and h not in self._block_of and block not in self._hash_of:
                self._hash_of[block] = h
                self._block_of[h] = block
        if snapshot and self._recurrent is not None and state.tokens and len(state.tokens) % bs == 0:
            self._save_recurrent(lane, state.hashes[-1])

    def release(self, lane: int) -> None:
        """Drop the lane's references; its table names the trash block again."""
        state = self._lanes[lane]
        for block in reversed(state.blocks):  # deepest first: prefixes outlive their suffixes
            self._refs[block] -= 1
            assert self._refs[block] >= 0, block
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._lru[block] = None
                    self._lru.move_to_end(block)
                else:
                    self._free.append(block)
        if state.blocks:
            self.cache.block_table[lane].fill_(TRASH_BLOCK)
        self._lanes[lane] = _Lane()

    def clear_cache(self) -> None:
        """Forget every cached block without references (tests, a model reload)."""
        for block in list(self._lru):
            del self._block_of[self._hash_of.pop(block)]
            self._free.append(block)
        self._lru.clear()

    # ---------------------------------------------------------------- recurrent snapshots

    def _resume_recurrent(self, lane: int) -> None:
        # Keep the attached blocks only up to the deepest boundary with a recurrent snapshot, and
        # make that snapshot the lane's committed recurrent state.
        state = self._lanes[lane]
        keep = len(state.hashes)
        while keep and state.hashes[keep - 1] not in self._snap_of:
            keep -= 1
        for block in reversed(state.blocks[keep:]):  # back to where they were: cached
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._lru[block] = None
        del state.blocks[keep:], state.hashes[keep:], state.tokens[keep * self.block_size:]
        if keep:
            h = state.hashes[-1]
            self._snap_of.move_to_end(h)
            self._recurrent.load_snapshot(lane, self._snap_of[h])

    def _save_recurrent(self, lane: int, h: bytes) -> None:
        if h in self._snap_of:
            self._snap_of.move_to_end(h)
            return
        if self._free_snaps:
            slot = self._free_snaps.popleft()
        elif self._snap_of:
            _, slot = self._snap_of.popitem(last=False)
        else:
            return
        self._recurrent.save_snapshot(lane, slot)
        self._snap_of[h] = slot

    # ---------------------------------------------------------------- internals

    def _take(self, block: int) -> None:
        if self._refs[block] == 0:
            self._lru.pop(block, None)
        self._refs[block] += 1

    def _allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]
            self.stats.evictions += 1
        else:  # the pool holds every lane's full length: unreachable
            raise RuntimeError("the KV pool has no free block")
        assert self._refs[block] == 0, block
        self._refs[block] = 1
        return block

    def _write_table(self, lane: int, first: int) -> None:
        blocks = self._lanes[lane].blocks
        row = torch.tensor(blocks[first:], dtype=torch.int32)
        table = self.cache.block_table
        if table.is_cuda:  # pinned and non-blocking: a release inside the commit must not wait for
            # the forward the Engine's pipeline launched before it (the host allocator keeps the
            # pinned row until the copy has run)
            table[lane, first:len(blocks)].copy_(row.pin_memory(), non_blocking=True)
        else:
            table[lane, first:len(blocks)].copy_(row)
