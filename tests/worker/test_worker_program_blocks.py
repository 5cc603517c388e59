"""Program: the paged KV block manager and the prefix cache (program/blocks.py), without a model.

Design document: "ordinary prefix caches keep only model state, never mutable matchers"; issue 13:
"full prompt blocks are identified by a hash chain of their token ids (and the model/adapter
identity), reused by later requests with the same prefix, reference counted while in use and
evicted LRU when the pool needs blocks".
"""

from __future__ import annotations

import random

import pytest
import torch

from services.worker.models.kv_cache import TRASH_BLOCK, KVCache
from services.worker.program.blocks import BlockManager

BS = 16


def _cache(lanes: int, max_len: int, num_blocks: int | None = None) -> KVCache:
    # one layer, one KV head of width 1: the "KV" of a slot is whatever a test writes there
    return KVCache.create(1, 1, 1, lanes, max_len, num_blocks=num_blocks)


def _fill(manager: BlockManager, lane: int, tokens, start: int = 0) -> None:
    """What a committed forward does: reserve, write each token's "KV" (its id), commit."""
    manager.reserve(lane, start + len(tokens))
    table = manager.cache.block_table[lane]
    for p, t in enumerate(tokens, start):
        manager.cache.pool[0, 0, int(table[p // BS]), p % BS, 0, 0] = float(t)
    manager.commit(lane, start, tokens)


def _read(manager: BlockManager, lane: int, length: int) -> list[int]:
    table = manager.cache.block_table[lane]
    return [int(manager.cache.pool[0, 0, int(table[p // BS]), p % BS, 0, 0]) for p in range(length)]


def test_equal_prefixes_share_full_blocks_only():
    """A later lane with the same leading full blocks attaches them (refcount 2); the partial
    block and whatever differs are its own; the table names the trash block past its blocks."""
    m = BlockManager(_cache(3, 96), 3, identity="model-a")
    prompt = list(range(1, 41))  # 2 full blocks + 8 tokens
    _fill(m, 0, prompt)
    assert m.cached_blocks == 2
    found = m.attach(1, prompt + [99], limit=len(prompt))
    assert found == 32
    assert m.lane_blocks(1) == m.lane_blocks(0)[:2]
    assert all(m.refs(b) == 2 for b in m.lane_blocks(0)[:2])
    assert int(m.cache.block_table[1, 2]) == TRASH_BLOCK
    _fill(m, 1, prompt[32:] + [99], start=32)
    assert _read(m, 1, 41) == prompt + [99] and _read(m, 0, 40) == prompt
    assert m.lane_blocks(1)[2] != m.lane_blocks(0)[2]
    # a different first block: nothing shared, even with equal later blocks
    assert m.attach(2, [7] + prompt[1:], limit=40) == 0
    assert m.stats.hit_tokens == 32 and m.stats.lookup_tokens == 80


def test_limit_and_identity():
    """`limit` bounds what is found (a fresh request recomputes its last prompt token); another
    model identity never matches."""
    cache = _cache(2, 64)
    m = BlockManager(cache, 2, identity="model-a")
    prompt = list(range(100, 132))  # exactly 2 blocks
    _fill(m, 0, prompt)
    m.release(0)
    assert m.attach(0, prompt, limit=31) == 16  # the last block is recomputed
    m.release(0)
    assert m.attach(0, prompt, limit=32) == 32
    m.release(0)
    other = BlockManager(_cache(2, 64), 2, identity="model-b")
    _fill(other, 0, prompt)
    other.release(0)
    from services.worker.program.blocks import chain_hash, identity_hash

    assert chain_hash(identity_hash("model-a"), prompt[:16]) != chain_hash(
        identity_hash("model-b"), prompt[:16]
    )
    assert other.attach(1, prompt, limit=32) == 32  # its own entries match under its identity


def test_disabled_cache_allocates_but_never_matches():
    m = BlockManager(_cache(2, 64), 2, identity="x", enabled=False)
    _fill(m, 0, list(range(40)))
    m.release(0)
    assert m.cached_blocks == 0 and m.attach(1, list(range(40)), limit=39) == 0
    assert m.free_blocks == m.cache.num_blocks - 1


def test_eviction_under_a_small_pool_is_lru_and_spares_blocks_in_use():
    """The minimum pool (every lane's full length + trash): cached blocks without references are
    reused least recently used first, deepest block of a released lane first; blocks in use
    never."""
    m = BlockManager(_cache(2, 32), 2, identity="m")  # 1 + 2 x 2 blocks
    a, b = list(range(1, 33)), list(range(201, 233))
    _fill(m, 0, a)
    m.release(0)  # a's 2 blocks cached, unreferenced
    _fill(m, 0, b)  # takes the 2 free blocks
    m.release(0)  # b cached too: LRU order a2, a1, b2, b1 (released deepest first)
    assert m.cached_blocks == 4 and m.free_blocks == 4
    held = m.attach(1, b, limit=32)  # b in use again: not evictable
    assert held == 32
    c = list(range(401, 433))
    _fill(m, 0, c)  # needs 2 blocks: a's two are evicted, deepest first
    assert m.stats.evictions == 2
    assert _read(m, 1, 32) == b  # the blocks in use kept their contents
    m.release(0)
    m.release(1)
    assert m.attach(0, a, limit=32) == 0  # a is gone
    assert m.attach(1, b, limit=32) == 32
    m.release(0)
    m.release(1)


def test_replay_after_release_finds_output_blocks():
    """A preempted lane's committed blocks (prompt and output) stay cached, so a Replay that
    needs all of them but the newest token finds every full block."""
    m = BlockManager(_cache(1, 64), 1, identity="m")
    prompt, output = list(range(1, 21)), list(range(50, 70))
    _fill(m, 0, prompt)
    for i, t in enumerate(output[:-1]):  # decode: one committed token per step
        _fill(m, 0, [t], start=len(prompt) + i)
    m.release(0)
    committed = prompt + output
    assert m.attach(0, committed, limit=len(committed) - 1) == 32


def test_stress_references_never_free_a_block_in_use():
    """Many lanes join and leave with prompts that share prefixes or not, grow by decode steps and
    abandon uncommitted writes, under a pool that must evict; after every operation each live
    lane reads back exactly its own tokens, and every block's refcount equals the lanes naming
    it."""
    rng = random.Random(7)
    lanes, max_len = 6, 80
    m = BlockManager(_cache(lanes, max_len, num_blocks=1 + lanes * 5 + 4), lanes, identity="m")
    stems = [[rng.randrange(1, 500) for _ in range(48)] for _ in range(4)]
    live: dict[int, list[int]] = {}
    for _ in range(600):
        lane = rng.randrange(lanes)
        if lane not in live:
            stem = rng.choice(stems)[:rng.choice((16, 33, 48))]
            prompt = stem + [rng.randrange(1, 500) for _ in range(rng.randrange(0, 20))]
            found = m.attach(lane, prompt, limit=len(prompt) - 1)
            assert found % BS == 0 and found < len(prompt)
            assert _read(m, lane, found) == prompt[:found]
            _fill(m, lane, prompt[found:], start=found)
            live[lane] = prompt
        elif rng.random() < 0.2 or len(live[lane]) >= max_len - 4:
            m.release(lane)
            del live[lane]
        else:
            seq = live[lane]
            if rng.random() < 0.3:  # an uncommitted write past the frontier (a rejected draft)
                m.reserve(lane, len(seq) + 3)
                table = m.cache.block_table[lane]
                for p in range(len(seq), len(seq) + 3):
                    m.cache.pool[0, 0, int(table[p // BS]), p % BS, 0, 0] = -1.0
            t = rng.randrange(1, 500)
            _fill(m, lane, [t], start=len(seq))
            seq.append(t)
        for ln, seq in live.items():
            assert _read(m, ln, len(seq)) == seq, (ln, seq)
        naming = [0] * m.cache.num_blocks
        for ln in live:
            for block in m.lane_blocks(ln):
                naming[block] += 1
        assert all(m.refs(b) == naming[b] for b in range(1, m.cache.num_blocks))
        assert m.free_blocks + sum(1 for b in range(1, m.cache.num_blocks) if naming[b]) \
            == m.cache.num_blocks - 1
    assert m.stats.evictions > 0 and m.stats.hit_tokens > 0


def test_pool_smaller_than_the_lanes_is_refused():
    with pytest.raises(ValueError, match="num_blocks"):
        KVCache.create(1, 1, 1, 2, 32, num_blocks=4)
    assert KVCache.create(1, 1, 1, 2, 32).block_table.tolist() == [[1, 2], [3, 4]]
    assert torch.equal(KVCache.create(1, 1, 1, 2, 17).block_table, torch.tensor([[1, 2], [3, 4]],
                                                                                 dtype=torch.int32))


class _Recurrent:
    """Stands in for Qwen35State's snapshots: a forward's cut writes "state after t tokens"."""

    def __init__(self) -> None:
        self.lane_state: dict[int, object] = {}
        self.slots: dict[int, object] = {}

    def load_snapshot(self, lane: int, slot: int) -> None:
        self.lane_state[lane] = self.slots[slot]


def _prefill(m: BlockManager, rec: _Recurrent, lane: int, prompt, start: int,
             end: int) -> list[int]:
    """One prefill forward of prompt[start:end] with its cuts; returns the cut positions."""
    cuts = m.plan_snapshots(lane, prompt, start, end)
    for t, slot in cuts:
        rec.slots[slot] = ("after", tuple(prompt[:start + t]))
    _fill(m, lane, prompt[start:end], start=start)
    return [start + t for t, _ in cuts]


def test_hybrid_hits_resume_at_the_deepest_boundary_with_a_snapshot():
    """Issue 13: "the recurrent GDN state is cached at block boundaries beside the KV of the
    attention layers (a hit resumes from the state at the last cached boundary)": cached KV
    blocks past the deepest snapshot are not attached, and the lane gets that snapshot's state;
    snapshots are LRU over their slots."""
    rec = _Recurrent()
    m = BlockManager(_cache(2, 96), 2, identity="h", recurrent=rec, snapshots=2,
                     snapshot_interval=0)
    prompt = list(range(1, 61))  # 3 full blocks + 12: the last full block before the end is 48
    assert _prefill(m, rec, 0, prompt, 0, 60) == [48]
    m.release(0)
    assert m.cached_blocks == 3 and m.stats.snapshots == 1
    assert m.attach(1, prompt, limit=59) == 48
    assert rec.lane_state[1] == ("after", tuple(prompt[:48]))
    m.release(1)
    # a prompt sharing 2 blocks: nothing cached at 32 on the first sighting, but the hit tells
    # the lane where the shared blocks end (the branch point) and its prefill snapshots there
    other = prompt[:32] + [500 + i for i in range(28)]
    assert m.attach(1, other, limit=59) == 0
    assert _prefill(m, rec, 1, other, 0, 60) == [32, 48]  # the branch point first
    m.release(1)
    assert m.stats.snapshots == 2
    assert m.attach(0, prompt[:32] + [900] * 20, limit=51) == 32
    assert rec.lane_state[0] == ("after", tuple(prompt[:32]))
    m.release(0)
    # a third prompt's snapshot takes the least recently used slot (other's boundary at 48)
    third = [700 + i for i in range(40)]
    assert _prefill(m, rec, 0, third, 0, 40) == [32]
    m.release(0)
    assert m.attach(1, other, limit=59) == 32
    m.release(1)


def test_special_tokens_place_snapshots_at_message_boundaries():
    """Chat templates open every message with a special token: the block boundary at or before
    each one gets a snapshot (found even when the forward ends before the token), so the next
    prompt with the same system message and another question resumes there."""
    rec = _Recurrent()
    m = BlockManager(_cache(2, 96), 2, identity="h", recurrent=rec, snapshots=4,
                     special_ids={0}, snapshot_interval=0)
    system = list(range(1, 38))  # a message opened at 0 and the next one at 38
    first = [0] + system + [0] + [100 + i for i in range(20)]
    assert _prefill(m, rec, 0, first, 0, 30) == []  # the boundary before 38 (32) is past 30
    assert _prefill(m, rec, 0, first, 30, 59) == [48, 32]  # the last full block, then 38 -> 32
    m.release(0)
    second = [0] + system + [0] + [300 + i for i in range(10)]
    assert m.attach(1, second, limit=len(second) - 1) == 32
    assert rec.lane_state[1] == ("after", tuple(first[:32]))


def test_evicting_a_block_drops_its_snapshots_and_unneeded_blocks_go_first():
    """Snapshots count with the blocks they need: evicting a needed block drops the snapshots
    behind it (and the blocks only they needed become unneeded), and a block no snapshot needs
    is evicted before any block a snapshot needs."""
    rec = _Recurrent()
    m = BlockManager(_cache(1, 64, num_blocks=1 + 6), 1, identity="h", recurrent=rec,
                     snapshots=4, snapshot_interval=0)
    a = list(range(1, 50))  # 3 full blocks: its snapshot at 48 needs all three
    b = [200 + i for i in range(40)]  # 2 full blocks: its snapshot at 32 needs both
    for prompt in (a, b):
        _prefill(m, rec, 0, prompt, 0, len(prompt))
        m.release(0)
    assert m.stats.snapshots == 2 and m.cached_blocks == 5 and m.free_blocks == 6
    m.reserve(0, 20)  # 2 blocks: the free one, then the least recently used (a's deepest)
    assert m.stats.evictions == 1 and m.stats.snapshots == 1  # a's snapshot went with it
    m.release(0)
    assert m.attach(0, a, limit=48) == 0  # a's first two blocks are cached, but no snapshot
    m.release(0)
    m.reserve(0, 64)  # 4 blocks: 2 free, then a's two unneeded blocks, never b's
    assert m.stats.evictions == 3 and m.stats.snapshots == 1
    m.release(0)
    assert m.attach(0, b + [1], limit=40) == 32


def test_cpu_attention_through_tables_equals_the_kernel_reference():
    """models/kv_cache.py's CPU route (whole blocks gathered through the tables + torch SDPA)
    computes what `kernels.paged_kv_ref.paged_attention_ref` (the Triton kernels' reference)
    defines, with rows sharing a prefix block, blocks out of order, GQA and a chunk of queries."""
    from kernels.paged_kv_ref import paged_attention_ref

    gen = torch.Generator().manual_seed(0)
    cache = KVCache.create(1, 2, 8, 3, 64, dtype=torch.float64, num_blocks=20)
    cache.pool.copy_(torch.randn(cache.pool.shape, generator=gen, dtype=torch.float64))
    cache.block_table.copy_(
        torch.tensor([[5, 9, 2, 0], [5, 11, 3, 0], [7, 1, 0, 0]], dtype=torch.int32)
    )
    lanes = torch.tensor([1, 0, 2])
    positions = torch.tensor([[30, 31, 32], [20, 21, 22], [3, 4, 5]])
    q = torch.randn(3, 3, 4, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 3, 2, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 3, 2, 8, generator=gen, dtype=torch.float64)
    before = cache.pool.clone()
    out = cache.attend(0, q, k, v, cache.rows(lanes, positions, 33))
    expected = paged_attention_ref(
        q, cache.keys(0), cache.values(0), cache.block_table[lanes], positions
    )
    torch.testing.assert_close(
        out, expected, rtol=1e-5, atol=1e-6
    )  # the reference scores in float32
    # the new tokens landed in their own blocks and nowhere else (block 5, shared, untouched)
    changed = (cache.pool != before).any(-1).any(-1)[0, 0].nonzero().tolist()  # [block, offset]
    assert sorted(map(tuple, changed)) == sorted(
        [(11, 14), (11, 15), (3, 0), (9, 4), (9, 5), (9, 6), (7, 3), (7, 4), (7, 5)]
    )


def test_program_pool_grows_to_kv_cache_tokens_never_below_the_lanes():
    """`kv_cache_tokens` sizes the pool beyond the lanes (room for the prefix cache); smaller
    values keep every lane's full length."""
    from services.worker.program import Program
    from tests.support.worker_support import tiny_runtime

    runtime = tiny_runtime()
    assert Program(runtime, max_batch=2, max_len=64).blocks.cache.num_blocks == 1 + 2 * 4
    assert (
        Program(runtime, max_batch=2, max_len=64, kv_cache_tokens=10).blocks.cache.num_blocks == 9
    )
    big = Program(runtime, max_batch=2, max_len=64, kv_cache_tokens=1000)
    assert big.blocks.cache.num_blocks == 1 + 63 and big.blocks.free_blocks == 63


def test_snapshot_boundaries_are_ordered_by_value_and_capped():
    """snapshots.py: the branch point, the last full block, the blocks before special tokens,
    the grid; at most MAX_CUTS a forward (each cut is one more recurrence segment per layer)."""
    from services.worker.program.snapshots import MAX_CUTS, boundaries

    prompt = [0] * 300  # a special token everywhere: one candidate per block
    got = boundaries(prompt, 0, 300, 300, block_size=BS, interval=64, special_ids={0},
                     branch=96)
    assert got[:3] == [96, 288, 16] and len(got) == MAX_CUTS and len(set(got)) == len(got)
    plain = boundaries(list(range(1, 301)), 0, 300, 300, block_size=BS, interval=64,
                       special_ids={0}, branch=None)
    assert plain == [288, 64, 128, 192, 256]
    assert boundaries(prompt, 100, 200, 300, block_size=BS, interval=0, special_ids=set(),
                      branch=None) == []  # the last full block (288) is past this forward
