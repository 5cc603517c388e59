"""The compile cache of one model: in-process LRU, shared Redis store, single flight, cold slots.

A request's grammar comes from the first of:

1. the in-process LRU (L1) of deserialised `CompiledGrammar`s, bounded by `cache_bytes` counted
   with `CompiledGrammar.memory_size_bytes` (objects still held by requests outlive eviction);
2. a build of the same key already in flight in this process (single flight: one task builds,
   every concurrent request of the key awaits it);
3. the Redis store (`services.grammar.store`): a compressed blob, deserialised in a thread;
4. a build under the key's Redis lock (SET NX PX, renewed while building): a replica that finds the
   lock held polls for the blob, and builds itself if the lock expires (its holder died);
5. with Redis down or not configured, a build in process.

A build takes one of `max_cold_compiles` slots of the model (default 2); hits and waits never do.
Compilation and (de)serialisation run in threads. Typed `RequestError`s of a build reach every
waiter unchanged and are not cached. A cache in read-only mode (a worker's) never writes Redis and
never takes a lock: it reads L1 and Redis, and builds in process when it must.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal, Mapping

import xgrammar as xgr

from services.grammar.compiler import ModelCompiler, cache_key, framing_of
from services.grammar.store import RedisStore, StoreConfig, StoreUnavailable
from shared.contract import OutputConstraint
from shared.errors import InternalError, InvalidRequest, RequestError
from shared.frontends.token_domain import TokenDomain
from shared.logging import get_logger
from shared.metrics import GrammarMetrics

log = get_logger(__name__)

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class CacheConfig:
    cache_bytes: int = DEFAULT_CACHE_BYTES  # L1 budget (grammar_cache_bytes), in bytes
    max_cold_compiles: int = 2  # concurrent builds per model
    lock_ttl_ms: int = 10_000  # Redis build lock; renewed every third of it while building
    poll_s: float = 0.02  # first wait between polls for another replica's build (x1.5, max 0.25)
    max_wait_s: float = 120.0  # after waiting this long on a live lock, build anyway
    recipes: int = 4096  # constraints remembered per model, to rebuild grammars evicted everywhere
    read_only: bool = False  # never write Redis or take locks (a worker's cache)

    def __post_init__(self) -> None:
        for name in ("cache_bytes", "max_cold_compiles", "lock_ttl_ms", "recipes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CacheConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.poll_s <= 0 or self.max_wait_s <= 0:
            raise ValueError("CacheConfig.poll_s and max_wait_s must be > 0")


@dataclass(frozen=True)
class CompileStats:
    """How one request got its compiled grammar (part of the constraint report)."""

    hit: Literal["l1", "redis"] | None  # found in a cache; None when built or shared
    built: bool  # this request ran the compile
    waited: bool  # waited on another build of the key (this process or another replica)
    compile_ms: float  # compile time when built, else 0
    queue_ms: float = 0.0  # waiting for a cold-compile slot
    load_ms: float = 0.0  # Redis fetch + decompress + deserialise on a Redis hit
    total_ms: float = 0.0
    redis_fallback: bool = False  # Redis configured but unusable: cached in process only


@dataclass(frozen=True)
class CachedGrammar:
    key: str
    grammar: xgr.CompiledGrammar
    stats: CompileStats


@dataclass
class _Fill:  # what the task that fills one key found out
    hit: Literal["redis"] | None = None
    built: bool = False
    waited: bool = False
    compile_ms: float = 0.0
    queue_ms: float = 0.0
    load_ms: float = 0.0
    redis_fallback: bool = False


class _LRU:
    """Compiled grammars by key, least recently used first, within a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bytes = 0
        self._items: OrderedDict[str, tuple[xgr.CompiledGrammar, int]] = OrderedDict()

    def get(self, key: str) -> xgr.CompiledGrammar | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, grammar: xgr.CompiledGrammar) -> None:
        size = int(grammar.memory_size_bytes)
        if size > self.budget or key in self._items:
            return
        self._items[key] = (grammar, size)
        self.bytes += size
        while self.bytes > self.budget:
            _, (_, evicted) = self._items.popitem(last=False)
            self.bytes -= evicted

    def keys(self) -> list[str]:
        return list(self._items)


def encode_blob(grammar: xgr.CompiledGrammar) -> bytes:
    """serialize_json, zlib level 1 (fast: Redis blobs are read far more often than written)."""
    return zlib.compress(grammar.serialize_json().encode(), 1)


class GrammarCache:
    """The compile cache of one model (one vocabulary). Use from one event loop."""

    def __init__(self, compiler: ModelCompiler, *, model: str | None = None,
                 store: RedisStore | None = None, config: CacheConfig = CacheConfig(),
                 metrics: GrammarMetrics | None = None) -> None:
        self.compiler = compiler
        self.model = model or compiler.domain.name
        self.store = store
        self.config = config
        self.metrics = metrics if metrics is not None else GrammarMetrics()
        self._l1 = _LRU(config.cache_bytes)
        self._cold = asyncio.Semaphore(config.max_cold_compiles)
        self._flights: dict[str, asyncio.Task] = {}
        self._publishing: set[asyncio.Task] = set()  # blobs being written to Redis
        self._recipes: OrderedDict[str, tuple[OutputConstraint, str]] = OrderedDict()

    @property
    def domain(self) -> TokenDomain:
        return self.compiler.domain

    @property
    def l1_bytes(self) -> int:
        return self._l1.bytes

    def l1_keys(self) -> list[str]:
        """L1 keys, least recently used first."""
        return self._l1.keys()

    def key(self, constraint: OutputConstraint, *, framing: str | None = None) -> str:
        """The cache key of `constraint` under `framing` (default: the source's own framing)."""
        return cache_key(constraint, self.domain, framing=framing or framing_of(constraint))

    def remember(self, key: str, constraint: OutputConstraint, framing: str | None = None) -> None:
        """Keep how to rebuild `key`, so `get_compiled` survives eviction and Redis outages."""
        self._recipes[key] = (constraint, framing or framing_of(constraint))
        self._recipes.move_to_end(key)
        while len(self._recipes) > self.config.recipes:
            self._recipes.popitem(last=False)

    async def compile(self, constraint: OutputConstraint, *,
                      framing: str | None = None) -> CachedGrammar:
        """The compiled grammar of `constraint` with its key and how it was obtained.

        `framing` defaults to the source's own ("raw", or Hermes tools); a framing that does not
        fit the source raises Unsupported (services/grammar/framing.py). Raises the build's typed
        RequestError."""
        from services.grammar.framing import check_framing

        start = time.perf_counter()
        framing = framing or framing_of(constraint)
        check_framing(constraint, framing)
        key = self.key(constraint, framing=framing)
        self.remember(key, constraint, framing)
        grammar = self._l1.get(key)
        if grammar is not None:
            self.metrics.count_compile(self.model, "l1")
            return CachedGrammar(key, grammar, CompileStats(
                "l1", False, False, 0.0, total_ms=_ms_since(start)))
        task = self._flights.get(key)
        owner = task is None
        if task is None:
            task = self._start_flight(key, constraint, framing)
        try:
            grammar, fill = await asyncio.shield(task)
        except RequestError:
            self.metrics.count_compile(self.model, "error")
            raise
        total = _ms_since(start)
        if not owner:
            self.metrics.count_compile(self.model, "shared")
            return CachedGrammar(key, grammar, CompileStats(
                None, False, True, 0.0, total_ms=total, redis_fallback=fill.redis_fallback))
        self.metrics.count_compile(self.model, "built" if fill.built else "redis")
        if fill.redis_fallback:
            self.metrics.redis_fallbacks.inc()
        return CachedGrammar(key, grammar, CompileStats(
            fill.hit, fill.built, fill.waited, fill.compile_ms, fill.queue_ms, fill.load_ms, total,
            fill.redis_fallback))

    async def get(self, key: str) -> xgr.CompiledGrammar | None:
        """The compiled grammar of `key` from L1, a build in flight, or Redis; None if none has it
        (never builds)."""
        return (await self.lookup(key))[0]

    async def lookup(self, key: str) -> tuple[xgr.CompiledGrammar | None, Literal["l1", "redis"] | None]:
        """`get(key)` together with where it was found: "l1", "redis", or None (a build in
        flight of this process, or not found)."""
        grammar = self._l1.get(key)
        if grammar is not None:
            return grammar, "l1"
        task = self._flights.get(key)
        if task is not None:
            try:
                return (await asyncio.shield(task))[0], None
            except RequestError:
                return None, None
        if self.store is None:
            return None, None
        try:
            blob = await self.store.get(self.domain.vocab_id, key)
        except StoreUnavailable:
            self.metrics.redis_fallbacks.inc()
            return None, None
        if blob is None:
            return None, None
        grammar = await self._load(key, blob, _Fill())
        if grammar is not None:
            self._put_l1(key, grammar)
            return grammar, "redis"
        return None, None

    async def get_compiled(self, key: str) -> xgr.CompiledGrammar:
        """`get(key)`, else a rebuild from the remembered constraint of `key`.

        Raises InternalError when no cache holds `key` and it was never compiled here."""
        grammar = await self.get(key)
        if grammar is not None:
            return grammar
        recipe = self._recipes.get(key)
        if recipe is None:
            raise InternalError(f"compiled grammar {key} of model {self.model!r} is in no cache "
                                "and was never compiled here")
        log.info("grammar_rebuild_for_get", model=self.model, key=key[:16])
        return (await self.compile(recipe[0], framing=recipe[1])).grammar

    # -- one flight per key ------------------------------------------------------------------

    def _start_flight(self, key: str, constraint: OutputConstraint, framing: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._fill(key, constraint, framing))
        self._flights[key] = task

        def done(t: asyncio.Task) -> None:
            if self._flights.get(key) is t:
                del self._flights[key]
            if not t.cancelled():
                t.exception()  # retrieved here: every awaiting request re-raises it itself

        task.add_done_callback(done)
        return task

    async def _fill(self, key: str, constraint: OutputConstraint,
                    framing: str) -> tuple[xgr.CompiledGrammar, _Fill]:
        fill = _Fill()
        grammar = None
        if self.store is not None:
            try:
                grammar = await self._fill_shared(key, constraint, framing, fill)
            except StoreUnavailable:
                fill.redis_fallback = True
        if grammar is None:
            grammar = await self._build(constraint, framing, fill)
        self._put_l1(key, grammar)
        return grammar, fill

    async def _fill_shared(self, key: str, constraint: OutputConstraint, framing: str,
                           fill: _Fill) -> xgr.CompiledGrammar | None:
        """Redis blob, or a build under the key's lock. Raises StoreUnavailable only before
        building; returns None when the caller should build in process (read-only mode)."""
        store, vocab = self.store, self.domain.vocab_id
        assert store is not None
        delay, deadline = self.config.poll_s, time.monotonic() + self.config.max_wait_s
        while True:
            blob = await store.get(vocab, key)
            if blob is not None:
                grammar = await self._load(key, blob, fill)
                if grammar is not None:
                    return grammar
            if self.config.read_only:
                return None
            token = await store.try_lock(vocab, key, self.config.lock_ttl_ms)
            if token is not None:
                break
            if time.monotonic() > deadline:
                log.warning("grammar_lock_wait_exceeded", model=self.model, key=key[:16])
                break
            fill.waited = True
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        keepalive = None
        published = False
        try:
            if token is not None:
                keepalive = asyncio.get_running_loop().create_task(self._keep_lock(key, token))
                if fill.waited:  # the holder may have stored it between our get and our lock
                    blob = await store.get(vocab, key)
                    grammar = None if blob is None else await self._load(key, blob, fill)
                    if grammar is not None:
                        return grammar
            grammar = await self._build(constraint, framing, fill)
            # The requester gets its grammar now; serialising, compressing and storing it (longer
            # than many compiles) happens in the background, still under the key's lock so that
            # other replicas wait for the blob instead of building again.
            task = asyncio.get_running_loop().create_task(
                self._publish(key, grammar, token, keepalive))
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)
            store.track(task)
            published = True
            return grammar
        finally:
            if not published:
                await self._release(key, token, keepalive)

    async def _publish(self, key: str, grammar: xgr.CompiledGrammar, token: str | None,
                       keepalive: asyncio.Task | None) -> None:
        try:
            blob = await asyncio.to_thread(encode_blob, grammar)
            await self.store.put(self.domain.vocab_id, key, blob)
        except StoreUnavailable:
            self.metrics.redis_fallbacks.inc()
        finally:
            await self._release(key, token, keepalive)

    async def _release(self, key: str, token: str | None, keepalive: asyncio.Task | None) -> None:
        if keepalive is not None:
            keepalive.cancel()
        if token is not None:
            try:
                await self.store.unlock(self.domain.vocab_id, key, token)
            except StoreUnavailable:
                pass  # the lock expires by itself

    async def drain(self) -> None:
        """Wait until every grammar built here is stored in Redis (or failed to be)."""
        while self._publishing:
            await asyncio.gather(*list(self._publishing), return_exceptions=True)

    async def _keep_lock(self, key: str, token: str) -> None:
        ttl = self.config.lock_ttl_ms
        while True:
            await asyncio.sleep(ttl / 3000.0)
            try:
                if not await self.store.renew_lock(self.domain.vocab_id, key, token, ttl):
                    return
            except StoreUnavailable:
                return

    async def _build(self, constraint: OutputConstraint, framing: str,
                     fill: _Fill) -> xgr.CompiledGrammar:
        queued = time.perf_counter()
        async with self._cold:
            fill.queue_ms = _ms_since(queued)
            in_flight = self.metrics.cold_compiles_in_flight.labels(model=self.model)
            in_flight.inc()
            try:
                args = (constraint,) if framing == framing_of(constraint) else (constraint, framing)
                outcome = await asyncio.to_thread(self.compiler.compile, *args)
            finally:
                in_flight.dec()
        fill.built, fill.hit, fill.compile_ms = True, None, outcome.compile_ms
        self.metrics.compile_seconds.labels(model=self.model).observe(outcome.compile_ms / 1000.0)
        return outcome.grammar

    async def _load(self, key: str, blob: bytes, fill: _Fill) -> xgr.CompiledGrammar | None:
        start = time.perf_counter()
        try:
            grammar = await asyncio.to_thread(self._decode, blob)
        except Exception as exc:  # a corrupt or foreign blob: drop it and build instead
            log.warning("grammar_blob_unreadable", model=self.model, key=key[:16],
                        error=type(exc).__name__)
            if not self.config.read_only and self.store is not None:
                try:
                    await self.store.discard(self.domain.vocab_id, key)
                except StoreUnavailable:
                    pass
            return None
        fill.hit, fill.load_ms = "redis", _ms_since(start)
        return grammar

    def _decode(self, blob: bytes) -> xgr.CompiledGrammar:
        return self.compiler.deserialize(zlib.decompress(blob).decode())

    def _put_l1(self, key: str, grammar: xgr.CompiledGrammar) -> None:
        self._l1.put(key, grammar)
        self.metrics.l1_bytes.labels(model=self.model).set(self._l1.bytes)


class ModelCaches:
    """One GrammarCache per served model, sharing one Redis store (or none: in-process only)."""

    def __init__(self, caches: Mapping[str, GrammarCache], store: RedisStore | None = None) -> None:
        self._caches = dict(caches)
        self.store = store

    @classmethod
    def open(cls, domains: Mapping[str, TokenDomain], *, redis_url: str | None = None,
             config: CacheConfig = CacheConfig(), redis_budget_bytes: int | None = None,
             metrics: GrammarMetrics | None = None) -> "ModelCaches":
        """Caches for `domains` (model name -> token domain). Without `redis_url` nothing is
        shared; `redis_budget_bytes` defaults to `config.cache_bytes`."""
        metrics = metrics if metrics is not None else GrammarMetrics()
        store = None
        if redis_url:
            store = RedisStore(StoreConfig(redis_url, redis_budget_bytes or config.cache_bytes))
        caches = {name: GrammarCache(ModelCompiler(domain), model=name, store=store, config=config,
                                     metrics=metrics) for name, domain in domains.items()}
        return cls(caches, store)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._caches)

    def __getitem__(self, model: str) -> GrammarCache:
        """The cache of `model`; raises InvalidRequest(field="model") for a model not served."""
        cache = self._caches.get(model)
        if cache is None:
            raise InvalidRequest(f"model {model!r} is not served here; expected one of "
                                 f"{', '.join(self._caches) or '(none)'}", field="model")
        return cache

    async def aclose(self) -> None:
        """Finish storing what was built, then close the Redis connection."""
        for cache in self._caches.values():
            await cache.drain()
        if self.store is not None:
            await self.store.aclose()


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
