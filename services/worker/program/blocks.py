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
keeps snapshots of a lane's recurrent state at block boundaries (snapshots.py: where, the slots,
LRU), keyed by the boundary block's hash. `plan_snapshots` before a prefill forward gives the
forward its cuts (the GDN layers write the state at each into a slot); `commit` keys them. A hit
attaches cached blocks only up to the deepest boundary with a snapshot and loads it into the lane;
evicting a block drops the snapshots that need it, and cached blocks no snapshot needs go first.

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
from services.worker.program.snapshots import SnapshotIndex, boundaries


def chain_hash(parent: bytes, tokens) -> bytes:
    """h_j = H(h_{j-1}, block tokens): a 128-bit BLAKE2b digest."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
    return h.digest()


def identity_hash(identity: str) -> bytes:
    """h_{-1}: the model (and adapter) identity a chain starts from."""
    return hashlib.blake2b(identity.encode("utf-8"), digest_size=16).digest()


def model_identity(runtime) -> str:
    """The identity a runtime's (services/worker/runtime.py `ModelRuntime`) chains start from:
    the served name, the weights' source, architecture and dtype (an adapter would join here)."""
    source = getattr(runtime.model, "source_path", None)
    return f"{runtime.name}|{source}|{type(runtime.model).__name__}|{runtime.dtype}"


@dataclass
class PrefixCacheStats:
    """Cumulative counters (the worker's metrics read their deltas)."""

    lookups: int = 0  # attach calls with the cache enabled
    lookup_tokens: int = 0  # tokens those calls could have found (up to their limit)
    hit_tokens: int = 0  # tokens found cached
    evictions: int = 0  # cached blocks reused for new data
    snapshots: int = 0  # recurrent-state snapshots held now (hybrid models)
    snapshot_evictions: int = 0  # snapshots dropped for a slot or with their blocks

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
    turns the prefix cache off (blocks are still allocated and freed here). `recurrent`: a hybrid
    model's state (its `load_snapshot`), with `snapshots` slots; `special_ids` and
    `snapshot_interval` place the snapshots (snapshots.py)."""

    def __init__(self, cache: KVCache, lanes: int, *, identity: str, enabled: bool = True,
                 recurrent=None, snapshots: int = 0, special_ids=frozenset(),
                 snapshot_interval: int = 512) -> None:
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
        # a hybrid model's cached blocks without references that no snapshot needs (evicted first)
        self._lru_dead: OrderedDict[int, None] = OrderedDict()
        self._lanes = [_Lane() for _ in range(lanes)]
        self._recurrent = recurrent if enabled else None
        self._snaps = SnapshotIndex(snapshots, on_cover=self._covered) \
            if self._recurrent is not None else None
        self._special_ids = frozenset(special_ids)
        self.snapshot_interval = snapshot_interval
        self._branch: dict[int, int] = {}  # lane -> where its cached blocks beyond a snapshot end
        cache.block_table.fill_(TRASH_BLOCK)  # the manager takes the static layout over

    # ---------------------------------------------------------------- views

    @property
    def free_blocks(self) -> int:
        """Blocks a lane could take now: free plus cached without references."""
        return len(self._free) + len(self._lru) + len(self._lru_dead)

    @property
    def snapshots(self) -> bool:
        """Whether prefill forwards take recurrent-state snapshots (a hybrid model's cache)."""
        return self._snaps is not None and self._snaps.slots > 0

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

    def commit(self, lane: int, start: int, tokens) -> None:
        """The lane's committed positions are now `start + len(tokens)`, holding `tokens` from
        `start`; full committed blocks join the prefix cache, and a hybrid model's cuts of this
        forward (`plan_snapshots`) its snapshots."""
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
        if self._snaps is not None:
            self._snaps.commit(lane, len(state.tokens), state.hashes, bs,
                               cached=self._block_of.__contains__)
            self._snapshot_stats()

    def release(self, lane: int) -> None:
        """Drop the lane's references; its table names the trash block again."""
        state = self._lanes[lane]
        for block in reversed(state.blocks):  # deepest first: prefixes outlive their suffixes
            self._unref(block)
        if self._snaps is not None:
            self._snaps.forget(lane)
        self._branch.pop(lane, None)
        if state.blocks:
            self.cache.block_table[lane].fill_(TRASH_BLOCK)
        self._lanes[lane] = _Lane()

    def clear_cache(self) -> None:
        """Forget every cached block without references (tests, a model reload)."""
        while self._lru_dead or self._lru:  # (forgetting a block can move others between them)
            block, _ = (self._lru_dead or self._lru).popitem(last=False)
            self._forget_block(block)
            self._free.append(block)

    # ---------------------------------------------------------------- recurrent snapshots

    def plan_snapshots(self, lane: int, prompt, start: int, end: int) -> list[tuple[int, int]]:
        """The cuts of a prefill forward of the lane's positions start..end-1 (its prompt
        `prompt`): (offset into the forward, snapshot slot) at each boundary the policy wants
        (snapshots.py) that no snapshot holds yet. Committing the forward keys them."""
        if self._snaps is None or not self._snaps.slots:
            return []
        state, bs = self._lanes[lane], self.block_size
        assert len(state.tokens) == start, (len(state.tokens), start)
        wanted = boundaries(prompt, start, end, len(prompt), block_size=bs,
                            interval=self.snapshot_interval, special_ids=self._special_ids,
                            branch=self._branch.get(lane))
        if not wanted:
            return []
        hashes = list(state.hashes)  # the chain through the forward's blocks, from the prompt
        top = max(wanted) // bs
        while len(hashes) < top:
            j = len(hashes)
            parent = hashes[-1] if hashes else self._root
            hashes.append(chain_hash(parent, prompt[j * bs:(j + 1) * bs]))
        cuts = self._snaps.plan(lane, [(b, hashes[b // bs - 1]) for b in wanted])
        self._snapshot_stats()
        return [(b - start, slot) for b, slot in cuts]

    def _resume_recurrent(self, lane: int) -> None:
        # Keep the attached blocks only up to the deepest boundary with a recurrent snapshot, and
        # make that snapshot the lane's committed recurrent state; where the cached blocks went
        # deeper, another prompt shares them: this lane's prefill snapshots there.
        state = self._lanes[lane]
        matched = keep = len(state.hashes)
        while keep and self._snaps.slot(state.hashes[keep - 1]) is None:
            keep -= 1
        for block in reversed(state.blocks[keep:]):  # back to where they were: cached
            self._unref(block)
        del state.blocks[keep:], state.hashes[keep:], state.tokens[keep * self.block_size:]
        if matched > keep:
            self._branch[lane] = matched * self.block_size
        if keep:
            self._recurrent.load_snapshot(lane, self._snaps.slot(state.hashes[-1]))

    def _covered(self, h: bytes, covered: bool) -> None:
        # A cached block without references moves between the LRU lists as snapshots need it.
        block = self._block_of.get(h)
        if block is None or self._refs[block]:
            return
        src, dst = (self._lru_dead, self._lru) if covered else (self._lru, self._lru_dead)
        if block in src:
            del src[block]
            dst[block] = None

    # ---------------------------------------------------------------- internals

    def _take(self, block: int) -> None:
        if self._refs[block] == 0:
            self._lru.pop(block, None)
            self._lru_dead.pop(block, None)
        self._refs[block] += 1

    def _unref(self, block: int) -> None:
        self._refs[block] -= 1
        assert self._refs[block] >= 0, block
        if self._refs[block]:
            return
        h = self._hash_of.get(block)
        if h is None:
            self._free.append(block)
        elif self._snaps is not None and not self._snaps.covered(h):
            self._lru_dead[block] = None
        else:
            self._lru[block] = None

    def _forget_block(self, block: int) -> None:
        h = self._hash_of.pop(block)
        del self._block_of[h]
        if self._snaps is not None:
            self._snaps.drop_covering(h)
            self._snapshot_stats()

    def _snapshot_stats(self) -> None:
        self.stats.snapshots = len(self._snaps)
        self.stats.snapshot_evictions = self._snaps.evictions

    def _allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._lru_dead or self._lru:
            block, _ = (self._lru_dead or self._lru).popitem(last=False)
            self._forget_block(block)
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
