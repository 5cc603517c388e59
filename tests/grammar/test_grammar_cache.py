"""The compile cache: L1 and Redis hits, byte budgets, single flight, cold slots, Redis outages.

Grammars of the small test vocabulary compile faster than they load, so the store policy would
keep none of them; the tests about what Redis holds use STORE_ALL (min_speedup 0)."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from services.grammar.cache import records
from services.grammar.cache.grammar_cache import CacheConfig, GrammarCache
from services.grammar.cache.limits import StorePolicy
from services.grammar.cache.records import Record
from services.grammar.cache.store import RedisStore, StoreConfig
from services.grammar.compiler import ModelCompiler, cache_key
from services.grammar.engines.matching import accepts
from shared.contract import OutputConstraint
from shared.errors import InvalidGrammar, RequestError
from tests.support.common import byte_domain

STORE_ALL = CacheConfig(policy=StorePolicy(min_speedup=0))
STORE_ALL_RO = CacheConfig(policy=StorePolicy(min_speedup=0), read_only=True)


class CountingCompiler(ModelCompiler):
    """A real ModelCompiler that counts builds, can hold them at a gate, and can fail on demand."""

    def __init__(self, domain=None, fail: RequestError | None = None) -> None:
        super().__init__(domain or byte_domain())
        self.gate = threading.Event()
        self.gate.set()
        self.fail = fail
        self.started = 0
        self.running = 0
        self.max_running = 0
        self._count_lock = threading.Lock()

    def compile(self, constraint):
        with self._count_lock:
            self.started += 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if not self.gate.wait(timeout=20):
                raise RuntimeError("test gate never opened")
            if self.fail is not None:
                raise self.fail
            return super().compile(constraint)
        finally:
            with self._count_lock:
                self.running -= 1


def options(n: int, length: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefgh ") for _ in range(length)) for _ in range(n)]


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def new_store(url: str, budget: int = 64 * 1024 * 1024) -> RedisStore:
    return RedisStore(StoreConfig(url, budget, timeout_s=0.3, retry_s=0.05))


@pytest_asyncio.fixture
async def make_store(redis_server):
    """RedisStore factory on the test's Redis; every store is closed at teardown."""
    made: list[RedisStore] = []

    def make(budget: int = 64 * 1024 * 1024) -> RedisStore:
        made.append(new_store(redis_server.url, budget))
        return made[-1]

    yield make
    for s in made:
        await s.aclose()


@pytest.fixture
def make_compiler():
    """CountingCompiler factory; every gate is opened at teardown so no thread stays blocked."""
    made: list[CountingCompiler] = []

    def make(**kwargs) -> CountingCompiler:
        made.append(CountingCompiler(**kwargs))
        return made[-1]

    yield make
    for c in made:
        c.gate.set()


@pytest.fixture
def store(make_store):
    return make_store()


@pytest_asyncio.fixture
async def raw(redis_server):
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.mark.asyncio
async def test_l1_hit_keys_on_the_deduplicated_choice_set():
    """'choice uses the de-duplicated literal set; order carries no weight' and 'a hit does not
    parse or convert again': the reordered, duplicated list is an L1 hit with no second build."""
    compiler = CountingCompiler()
    cache = GrammarCache(compiler)
    first = await cache.compile(OutputConstraint.choice(["yes", "no", "maybe"]))
    second = await cache.compile(OutputConstraint.choice(["maybe", "no", "yes", "no"]))
    assert (first.stats.hit, first.stats.built, first.stats.waited) == (None, True, False)
    assert first.stats.compile_ms > 0
    assert (second.stats.hit, second.stats.built, second.stats.waited) == ("l1", False, False)
    assert second.key == first.key == cache_key(OutputConstraint.choice(["no", "yes", "maybe"]),
                                                byte_domain())
    assert second.grammar is first.grammar and compiler.started == 1
    for text in ("yes", "no", "maybe"):
        assert accepts(second.grammar, text)
    assert not accepts(second.grammar, "ye") and not accepts(second.grammar, "yesno")


@pytest.mark.asyncio
async def test_l1_evicts_least_recently_used_within_cache_bytes():
    """'each worker keeps an in-process LRU of deserialised grammars under the same budget'
    (grammar_cache_bytes, counted with CompiledGrammar.memory_size_bytes)."""
    constraints = [OutputConstraint.choice(options(20 + 10 * i, 12, seed=i)) for i in range(5)]
    sizes = [ModelCompiler(byte_domain()).compile(c).grammar.memory_size_bytes for c in constraints]
    budget = sizes[0] + sizes[1] + sizes[2] + sizes[3] // 2
    cache = GrammarCache(CountingCompiler(), config=CacheConfig(cache_bytes=budget))
    keys = [cache.key(c) for c in constraints]
    order: list[int] = []  # independent LRU simulation, least recently used first

    def use(i: int) -> None:
        if i in order:
            order.remove(i)
        order.append(i)
        while sum(sizes[j] for j in order) > budget:
            order.pop(0)

    for i in (0, 1, 2, 0, 3, 4, 0):
        result = await cache.compile(constraints[i])
        assert result.stats.hit == ("l1" if keys[i] in [keys[j] for j in order] else None)
        use(i)
        assert cache.l1_keys() == [keys[j] for j in order]
        assert cache.l1_bytes == sum(sizes[j] for j in order) <= budget


@pytest.mark.asyncio
async def test_redis_hit_from_another_replica(store):
    """'compiled grammars are shared through Redis, so a second worker or grammar replica starts
    warm': the second cache deserialises the blob, builds nothing, and has the same language."""
    constraint = OutputConstraint.choice(["alpha", "beta", "al"])
    a, b = CountingCompiler(), CountingCompiler()
    writer = GrammarCache(a, store=store, config=STORE_ALL)
    first = await writer.compile(constraint)
    await writer.drain()
    cache_b = GrammarCache(b, store=store, config=STORE_ALL)
    second = await cache_b.compile(constraint)
    assert first.stats.built and not first.stats.redis_fallback
    assert (second.stats.hit, second.stats.built, b.started) == ("redis", False, 0)
    assert second.stats.load_ms > 0 and second.key == first.key
    for text in ("alpha", "beta", "al", "alp", "gamma", ""):
        assert accepts(second.grammar, text) == accepts(first.grammar, text) == (
            text in ("alpha", "beta", "al"))
    assert (await cache_b.compile(constraint)).stats.hit == "l1"


@pytest.mark.asyncio
async def test_redis_budget_evicts_least_recently_used(make_store, raw):
    """'Redis, whose LRU eviction and grammar_cache_bytes budget bound what is kept': our Lua
    index evicts least-recently-used blobs (a Redis hit refreshes one) to stay within the budget."""
    constraints = [OutputConstraint.choice(options(40, 10, seed=100 + i)) for i in range(6)]
    blobs = [records.serialize(ModelCompiler(byte_domain()).compile(c).grammar)
             for c in constraints]
    header = 120  # a Record's header is well under this
    budget = 3 * (max(len(b) for b in blobs) + header) + 1
    assert 4 * min(len(b) for b in blobs) > budget  # exactly three fit: eviction is observable
    writer_store = make_store(budget)
    writer = GrammarCache(CountingCompiler(), store=writer_store, config=STORE_ALL)
    reader = GrammarCache(CountingCompiler(), store=writer_store, config=STORE_ALL_RO)
    keys = [writer.key(c) for c in constraints]
    names = [writer_store.blob_name(byte_domain().vocab_id, k) for k in keys]
    sizes: dict[int, int] = {}
    order: list[int] = []

    def use(i: int) -> None:
        if i in order:
            order.remove(i)
        order.append(i)
        while sum(sizes[j] for j in order) > budget:
            order.pop(0)

    for step, i in enumerate((0, 1, 2, 3, 4, 5)):
        await writer.compile(constraints[i])
        await writer.drain()  # the record is stored in the background
        stored = Record.decode(await raw.get(names[i]))
        assert stored.info.stored and stored.blob is not None
        assert records.deserialize(stored.blob, ModelCompiler(byte_domain())).serialize_json() \
            == records.deserialize(blobs[i], ModelCompiler(byte_domain())).serialize_json()
        sizes[i] = await raw.strlen(names[i])
        use(i)
        if step == 3:  # a Redis hit on the oldest survivor makes it the most recent
            survivor = order[0]
            assert await reader.get(keys[survivor]) is not None
            use(survivor)
        present = [j for j in range(6) if await raw.exists(names[j])]
        assert len(order) == min(step + 1, 3)
        assert sorted(present) == sorted(order)
        assert await writer_store.stored_bytes() == sum(sizes[j] for j in order) <= budget
    assert len(order) < 6  # the budget really evicted something


@pytest.mark.asyncio
async def test_blob_larger_than_the_redis_budget_is_never_stored(make_store, raw):
    """An entry is never larger than the Redis budget: the request still succeeds (in process)."""
    small = make_store(budget=64)
    cache = GrammarCache(CountingCompiler(), store=small, config=STORE_ALL)
    result = await cache.compile(OutputConstraint.choice(["only"]))
    await cache.drain()
    assert result.stats.built and not result.stats.redis_fallback
    assert await raw.exists(small.blob_name(byte_domain().vocab_id, result.key)) == 0
    assert await small.stored_bytes() == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("with_redis", [False, True])
async def test_single_flight_in_process(with_redis, make_store, make_compiler):
    """'the same key compiling twice shares one build': N concurrent identical requests, one build;
    everyone else waited and got the same object."""
    store = make_store() if with_redis else None
    compiler = make_compiler()
    compiler.gate.clear()
    cache = GrammarCache(compiler, store=store)
    constraint = OutputConstraint.choice(options(40, 12, seed=7))
    tasks = [asyncio.create_task(cache.compile(constraint)) for _ in range(8)]
    await until(lambda: compiler.started == 1)
    await asyncio.sleep(0.05)  # every request has joined by now
    compiler.gate.set()
    results = await asyncio.gather(*tasks)
    assert compiler.started == 1
    assert sum(r.stats.built for r in results) == 1
    assert all(r.stats.waited and r.stats.hit is None for r in results if not r.stats.built)
    assert len({id(r.grammar) for r in results}) == 1 and len({r.key for r in results}) == 1


@pytest.mark.asyncio
async def test_single_flight_across_replicas(make_store, make_compiler, raw):
    """'single flight, also across grammar replicas through a Redis lock with expiry': two caches
    on one Redis, four requests each, one build; the other replica waits and loads the blob."""
    stores = [make_store(), make_store()]
    compilers = [make_compiler(), make_compiler()]
    for c in compilers:
        c.gate.clear()
    caches = [GrammarCache(c, store=s, config=STORE_ALL) for c, s in zip(compilers, stores)]
    constraint = OutputConstraint.choice(options(50, 12, seed=8))
    tasks = [asyncio.create_task(caches[i % 2].compile(constraint)) for i in range(8)]
    await until(lambda: compilers[0].started + compilers[1].started == 1)
    await asyncio.sleep(0.1)  # the other replica is polling the lock by now
    for c in compilers:
        c.gate.set()
    results = await asyncio.gather(*tasks)
    assert compilers[0].started + compilers[1].started == 1
    builder = 0 if compilers[0].started else 1
    other = [r for i, r in enumerate(results) if i % 2 != builder]
    owner = [r for r in other if not (r.stats.waited and r.stats.hit is None)]
    assert len(owner) == 1 and owner[0].stats.hit == "redis" and owner[0].stats.waited
    for cache in caches:
        await cache.drain()
    lock = stores[0].lock_name(byte_domain().vocab_id, results[0].key)
    assert await raw.exists(lock) == 0  # released once the blob is stored


@pytest.mark.asyncio
async def test_expired_lock_of_a_dead_replica_is_taken_over(store, raw):
    """'a Redis lock with expiry': a lock whose holder never finishes expires, and the waiter
    builds itself."""
    cache = GrammarCache(CountingCompiler(), store=store)
    constraint = OutputConstraint.choice(["dead", "replica"])
    key = cache.key(constraint)
    await raw.set(store.lock_name(byte_domain().vocab_id, key), "someone-else", px=300)
    start = time.monotonic()
    result = await cache.compile(constraint)
    assert time.monotonic() - start >= 0.25
    assert result.stats.waited and result.stats.built
    await cache.drain()
    assert await raw.exists(store.blob_name(byte_domain().vocab_id, key)) == 1


@pytest.mark.asyncio
async def test_two_cold_compiles_at_most_and_hits_never_wait(store, make_compiler):
    """'Cold compiles: at most two at once per model (a semaphore) ... a cache hit takes no cold
    slot': with two builds held, a third waits, while an L1 hit and a Redis hit complete."""
    compiler = make_compiler()
    cache = GrammarCache(compiler, store=store, config=STORE_ALL)
    hot = OutputConstraint.choice(["hot"])
    await cache.compile(hot)
    warm = OutputConstraint.choice(["warm", "in", "redis"])
    warmer = GrammarCache(CountingCompiler(), store=store, config=STORE_ALL)
    await warmer.compile(warm)
    await warmer.drain()
    compiler.gate.clear()
    compiler.started = 0
    cold = [asyncio.create_task(cache.compile(OutputConstraint.choice(options(30, 10, seed=s))))
            for s in range(3)]
    await until(lambda: compiler.started >= 2)
    await asyncio.sleep(0.1)
    assert compiler.started == 2 and compiler.running == 2  # the third is queued
    hit = await asyncio.wait_for(cache.compile(hot), timeout=2)
    redis_hit = await asyncio.wait_for(cache.compile(warm), timeout=2)
    assert (hit.stats.hit, redis_hit.stats.hit) == ("l1", "redis")
    assert compiler.started == 2
    compiler.gate.set()
    results = await asyncio.gather(*cold)
    assert compiler.max_running == 2 and compiler.started == 3
    assert max(r.stats.queue_ms for r in results) >= 90


@pytest.mark.asyncio
async def test_request_errors_reach_every_waiter_and_are_not_cached(store, make_compiler, raw):
    """'Validation errors are typed' and a failed build caches no grammar: concurrent waiters get
    the same typed error, the next request builds (and fails) again, the lock is released."""
    error = InvalidGrammar("expected an expression", line=2, column=5)
    compiler = make_compiler(fail=error)
    compiler.gate.clear()
    cache = GrammarCache(compiler, store=store)
    constraint = OutputConstraint.choice(["x"])
    tasks = [asyncio.create_task(cache.compile(constraint)) for _ in range(3)]
    await until(lambda: compiler.started == 1)
    await asyncio.sleep(0.05)
    compiler.gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert compiler.started == 1
    for exc in outcomes:
        assert type(exc) is InvalidGrammar and exc.to_dict() == error.to_dict()
    with pytest.raises(InvalidGrammar):
        await cache.compile(constraint)
    assert compiler.started == 2
    vocab, key = byte_domain().vocab_id, cache.key(constraint)
    assert await raw.exists(store.blob_name(vocab, key), store.lock_name(vocab, key)) == 0


@pytest.mark.asyncio
async def test_read_only_cache_never_writes_redis(store, raw):
    """A worker's cache reads L1 and Redis and builds in process, but never writes Redis."""
    cache = GrammarCache(CountingCompiler(), store=store, config=CacheConfig(read_only=True))
    result = await cache.compile(OutputConstraint.choice(["ro"]))
    assert result.stats.built and not result.stats.redis_fallback
    assert await raw.dbsize() == 0


@pytest.mark.asyncio
async def test_redis_outage_falls_back_logs_once_and_reconnects(redis_server, store, raw):
    """'Losing Redis never fails a request: ... fall back to compiling and caching in-process,
    log it, count it in a metric, and reconnect.'"""
    cache = GrammarCache(CountingCompiler(), store=store, config=STORE_ALL)
    fallbacks = lambda: cache.metrics.registry.get_sample_value(  # noqa: E731
        "infernix_grammar_redis_fallbacks_total") or 0.0
    assert not (await cache.compile(OutputConstraint.choice(["before"]))).stats.redis_fallback
    await cache.drain()
    redis_server.stop()
    with capture_logs() as logs:
        for word in ("during", "outage", "still"):
            start = time.monotonic()
            result = await cache.compile(OutputConstraint.choice([word]))
            assert time.monotonic() - start < 1.5
            assert result.stats.built and result.stats.redis_fallback
        assert (await cache.compile(OutputConstraint.choice(["during"]))).stats.hit == "l1"
        assert fallbacks() == 3
        redis_server.start()
        await asyncio.sleep(0.1)  # past retry_s
        after = await cache.compile(OutputConstraint.choice(["after"]))
    events = [e["event"] for e in logs]
    assert events.count("grammar_redis_unavailable") == 1
    assert events.count("grammar_redis_reconnected") == 1
    assert not after.stats.redis_fallback and fallbacks() == 3
    await cache.drain()
    assert await raw.exists(store.blob_name(byte_domain().vocab_id, after.key)) == 1
    other = GrammarCache(CountingCompiler(), store=store, config=STORE_ALL)
    assert (await other.compile(OutputConstraint.choice(["after"]))).stats.hit == "redis"


@pytest.mark.asyncio
@pytest.mark.slow
async def test_real_vocabulary_round_trips_through_redis(store):
    """Compiled grammars of a real vocabulary (SmolLM2) survive serialize_json + zlib + Redis and
    deserialise against the same tokenizer info with the same language."""
    from shared.frontends import get_domain

    domain = get_domain("smollm2")
    constraint = OutputConstraint.choice(["Paris", "London", "Rome"])
    writer = GrammarCache(ModelCompiler(domain), store=store, config=STORE_ALL)
    built = await writer.compile(constraint)
    await writer.drain()
    loaded = await GrammarCache(ModelCompiler(domain), store=store, config=STORE_ALL).compile(
        constraint)
    assert (built.stats.built, loaded.stats.hit) == (True, "redis")
    for text in ("Paris", "London", "Rome", "Pari", "Berlin"):
        assert accepts(loaded.grammar, text) == (text in ("Paris", "London", "Rome"))


@pytest.mark.asyncio
async def test_request_does_not_wait_for_the_redis_write(redis_server, raw):
    """A cold compile answers once the grammar is built; storing the blob (serialise, compress,
    write: longer than many compiles) finishes afterwards, still under the key's lock, so another
    replica waits for the blob instead of building again."""
    release = asyncio.Event()

    class SlowStore(RedisStore):
        async def put(self, vocab_id: str, key: str, blob: bytes) -> bool:
            await release.wait()
            return await super().put(vocab_id, key, blob)

    store = SlowStore(StoreConfig(redis_server.url, timeout_s=0.3, retry_s=0.05))
    other_store = new_store(redis_server.url)
    try:
        writer = GrammarCache(CountingCompiler(), store=store, config=STORE_ALL)
        constraint = OutputConstraint.choice(["left", "right", "up"])
        result = await asyncio.wait_for(writer.compile(constraint), timeout=5)
        assert result.stats.built
        vocab = byte_domain().vocab_id
        assert await raw.exists(store.blob_name(vocab, result.key)) == 0
        assert await raw.exists(store.lock_name(vocab, result.key)) == 1  # still held
        other_compiler = CountingCompiler()
        waiting = asyncio.create_task(
            GrammarCache(other_compiler, store=other_store, config=STORE_ALL).compile(constraint))
        await asyncio.sleep(0.1)
        release.set()
        got = await asyncio.wait_for(waiting, timeout=5)
        assert got.stats.hit == "redis" and got.stats.waited and other_compiler.started == 0
        await writer.drain()
        assert await raw.exists(store.lock_name(vocab, result.key)) == 0
    finally:
        release.set()
        await store.aclose()
        await other_store.aclose()
