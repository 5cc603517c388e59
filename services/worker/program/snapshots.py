"""The recurrent-state snapshots of a hybrid model's prefix cache (Qwen3.5's GDN layers).

A GDN layer's recurrent state and conv window cannot be rebuilt from cached KV, so a cached prefix
is usable by a hybrid model only up to a block boundary whose state was kept. The block manager
(blocks.py) keeps such snapshots in a fixed number of slots of the model state
(models/qwen35_state.py `allocate_snapshots`), keyed by the hash of the block that ends at the
boundary, least recently used first out.

Where snapshots are taken (`boundaries`): a prefill forward takes them inside itself at the block
boundaries it crosses (the GDN layers split their recurrence there, models/gdn.py), so the
scheduler never ends a chunk for a snapshot. The boundaries are, in order of value:

- the branch point: at admission a prompt that found cached KV blocks beyond its deepest snapshot
  (another prompt shares that prefix) snapshots where the shared blocks end;
- the prompt's last full block before its last token: an exact repeat, a Replay, or the next turn
  of the conversation (which extends the whole prompt) resumes there;
- the block boundary at or before every special token of the prompt: chat templates open and close
  every message with one, so the boundary before a new message is where the next prompt with the
  same system prompt and tools (and another question) diverges;
- every `interval` positions (512 by default): shared prefixes of raw prompts.

At most `MAX_CUTS` per row and forward, in that order: every cut splits each GDN layer's
recurrence of the forward once more (one more chunk-kernel launch per layer on CUDA).

A snapshot is worth something only while every KV block of its chain is cached: evicting such a
block drops the snapshots that cover it (`covering`), and cached blocks that no snapshot covers are
of no use to a hybrid model, so the block manager evicts them first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass
class _Pending:
    boundary: int  # position (a multiple of the block size)
    slot: int


class SnapshotIndex:
    """Slots, their keys (LRU), the KV blocks each snapshot needs, and each lane's pending cuts.

    `slots`: how many snapshots fit. `on_cover(block_hash, covered)`: called when a cached block
    becomes needed by a snapshot (True) or no longer needed by any (False)."""

    def __init__(self, slots: int, *, on_cover) -> None:
        self.slots = slots
        self._free: deque[int] = deque(range(slots))
        self._slot_of: OrderedDict[bytes, int] = OrderedDict()  # snapshot hash -> slot, LRU
        self._chain: dict[bytes, tuple[bytes, ...]] = {}  # snapshot hash -> its blocks' hashes
        self._cover: dict[bytes, set[bytes]] = {}  # block hash -> snapshots that need it
        self._pending: dict[int, list[_Pending]] = {}  # lane -> cuts of its launched forward
        self._on_cover = on_cover
        self.saved = 0  # snapshots keyed (cumulative)
        self.evictions = 0  # snapshots dropped for a slot or with a KV block (cumulative)

    def __len__(self) -> int:
        return len(self._slot_of)

    def slot(self, h: bytes) -> int | None:
        """The slot of the snapshot at the boundary ending block `h` (touched), or None."""
        slot = self._slot_of.get(h)
        if slot is not None:
            self._slot_of.move_to_end(h)
        return slot

    def covered(self, h: bytes) -> bool:
        return h in self._cover

    # ---------------------------------------------------------------- a lane's cuts

    def plan(self, lane: int, wanted: list[tuple[int, bytes]]) -> list[tuple[int, int]]:
        """Slots for the cuts of the lane's next forward: `wanted` (boundary, hash of the block
        ending there) in order of value; boundaries already kept are only touched. Returns
        (boundary, slot) in the order given; a cut without a slot is left out."""
        self.forget(lane)
        out: list[tuple[int, int]] = []
        for boundary, h in wanted:
            if self.slot(h) is not None:
                continue
            slot = self._take()
            if slot is None:
                break
            out.append((boundary, slot))
        self._pending[lane] = [_Pending(b, s) for b, s in out]
        return out

    def commit(self, lane: int, committed: int, hashes: list[bytes], block_size: int,
               cached) -> None:
        """The lane's forward committed its positions < `committed` (its chain `hashes`): its
        cuts there become snapshots (unless kept already or a block of the chain is no longer
        cached: `cached(h)`); cuts past it are dropped."""
        for cut in self._pending.pop(lane, []):
            depth = cut.boundary // block_size
            if cut.boundary > committed or depth > len(hashes):
                self._free.append(cut.slot)
                continue
            chain = tuple(hashes[:depth])
            h = chain[-1]
            if h in self._slot_of or not all(cached(c) for c in chain):
                self._free.append(cut.slot)
                continue
            self._slot_of[h] = cut.slot
            self._chain[h] = chain
            for c in chain:
                users = self._cover.setdefault(c, set())
                if not users:
                    self._on_cover(c, True)
                users.add(h)
            self.saved += 1

    def forget(self, lane: int) -> None:
        """Drop the lane's pending cuts (released, or a forward that was never committed)."""
        for cut in self._pending.pop(lane, []):
            self._free.append(cut.slot)

    # ---------------------------------------------------------------- eviction

    def drop_covering(self, block_hash: bytes) -> None:
        """A cached block is gone: the snapshots that need it are too."""
        for h in list(self._cover.get(block_hash, ())):
            self._drop(h)
            self._free.append(self._slot_of.pop(h))

    def clear(self) -> None:
        for h in list(self._slot_of):
            self._drop(h)
            self._free.append(self._slot_of.pop(h))

    def _take(self) -> int | None:
        if self._free:
            return self._free.popleft()
        if not self._slot_of:  # every slot is a pending cut
            return None
        h, slot = self._slot_of.popitem(last=False)
        self._drop(h)
        return slot

    def _drop(self, h: bytes) -> None:
        self.evictions += 1
        for c in self._chain.pop(h):
            users = self._cover[c]
            users.discard(h)
            if not users:
                del self._cover[c]
                self._on_cover(c, False)


MAX_CUTS = 8  # per row and forward: each cut is one more segment of every GDN layer's recurrence


def boundaries(tokens, start: int, end: int, limit: int, *, block_size: int, interval: int,
               special_ids, branch: int | None, max_cuts: int = MAX_CUTS) -> list[int]:
    """The block boundaries in (start, min(end, limit)] a hybrid model snapshots at (the module
    docstring's policy, most valuable first, at most `max_cuts`). `tokens`: the prompt (`limit`
    tokens: snapshots stay inside it)."""
    bs, top = block_size, min(end, limit)
    if top <= start:
        return []
    out: list[int] = []

    def want(b: int) -> None:
        if start < b <= top and b > 0 and b not in out:
            out.append(b)

    if branch is not None:
        want(branch)
    want((limit - 1) // bs * bs)
    for p in range(start, min(limit, top + bs)):  # the block at or before each special token
        if int(tokens[p]) in special_ids:
            want(p // bs * bs)
    if interval > 0:
        for b in range((start // interval + 1) * interval, top + 1, interval):
            want(b)
    return out[:max_cuts]
