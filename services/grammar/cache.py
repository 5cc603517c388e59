"""The compile cache of one model: in-process LRU, shared Redis records, single flight, cold slots.

Two caches share this logic and differ in what they hold:

- `GrammarCache` (workers, embedded mode) holds compiled grammars, the objects a matcher needs;
- `RecordCache` (the grammar service) holds `Record`s: a build verdict and, when the store policy
  keeps it, the compressed blob that the service ships to workers. The service never needs a
  compiled grammar itself, so it never deserialises one.

A request's value comes from the first of:

1. the in-process LRU (L1), bounded by `cache_bytes` (objects still held by requests outlive
   eviction); a key whose compile was stopped by a limit is refused from memory (`reject_ttl_s`);
2. a fill of the same key already in flight in this process (single flight);
3. an upstream (a worker's grammar service, see `services.grammar.client`), which answers with a
   Record; when it cannot be reached, the cache serves without it;
4. the Redis store: a Record written by any replica;
5. a build under the key's Redis lock (SET NX PX, renewed while building): a replica that finds
   the lock held polls for the record, and builds itself if the lock expires (its holder died);
6. with Redis down or not configured, or in read-only mode (a worker's), a build in process.

A Record without a blob is a verdict: the grammar compiled within the limits and faster than it
loads, so a GrammarCache compiles it itself in a thread ("trusted"). Every other build (unknown
cost) runs with `isolation`: "process" (a killable child within `CompileLimits`, see
`services.grammar.isolation`) or "thread" (in process: only the waiter's deadline holds).
A build takes one of `max_cold_compiles` slots (`ColdSlots`); hits never do; a request waits at
most `slot_wait_s` for one and then gets `Overloaded`. Typed errors of a build reach every waiter
unchanged; only `ConstraintTooComplex` is remembered. A writer publishes the key's Record (with
its blob when `StorePolicy` keeps it) after answering, still under the key's lock.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, Literal, Mapping, TypeVar

from services.grammar import records
from services.grammar.builders import BuildOutcome, Builder
from services.grammar.compiler import ModelCompiler, cache_key, framing_of, source_kind
from services.grammar.limits import CompileLimits, StorePolicy
from services.grammar.records import Record
from services.grammar.store import RedisStore, StoreConfig, StoreUnavailable
from shared.errors import (ConstraintTooComplex, InvalidRequest, Overloaded, RequestError,
                           Unsupported)
from shared.frontends.token_domain import TokenDomain
from shared.logging import get_logger
from shared.metrics import GrammarMetrics

log = get_logger(__name__)

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
Hit = Literal["l1", "redis", "service"]
V = TypeVar("V")
encode_blob = records.serialize  # the compressed serialisation of a compiled grammar


@dataclass(frozen=True)
class CacheConfig:
    cache_bytes: int = DEFAULT_CACHE_BYTES  # L1 budget (grammar_cache_bytes), in bytes
    max_cold_compiles: int = 2  # concurrent builds per model
    lock_ttl_ms: int = 10_000  # Redis build lock; renewed every third of it while building
    poll_s: float = 0.02  # first wait between polls for another replica's build (x1.5, max 0.25)
    max_wait_s: float = 120.0  # after waiting this long on a live lock, build anyway
    read_only: bool = False  # never write Redis or take locks (a worker's cache)
    slot_wait_s: float = 10.0  # a request waits this long for a cold slot, then gets Overloaded
    limits: CompileLimits = CompileLimits()
    isolation: Literal["thread", "process"] = "thread"  # where builds of unknown cost run
    policy: StorePolicy = StorePolicy()
    reject_ttl_s: float = 600.0  # how long a key stopped by a compile limit stays refused

    def __post_init__(self) -> None:
        for name in ("cache_bytes", "max_cold_compiles", "lock_ttl_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CacheConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.poll_s <= 0 or self.max_wait_s <= 0 or self.slot_wait_s <= 0:
            raise ValueError("CacheConfig.poll_s, max_wait_s and slot_wait_s must be > 0")
        if self.isolation not in ("thread", "process"):
            raise ValueError(f"CacheConfig.isolation must be 'thread' or 'process', "
                             f"got {self.isolation!r}")
        if self.reject_ttl_s < 0:
            raise ValueError("CacheConfig.reject_ttl_s must be >= 0")


@dataclass(frozen=True)
class CompileStats:
    """How one request got its compiled grammar (part of the constraint report)."""

    hit: Hit | None  # where this process found it; None when built (or shared a fill)
    built: bool  # a cold compile ran for this request (here, or in the grammar service)
    waited: bool  # waited on another build of the key (this process or another replica)
    compile_ms: float  # that compile's time, else 0
    queue_ms: float = 0.0  # waiting for a cold-compile slot
    load_ms: float = 0.0  # decompress + deserialise of a blob (Redis or the service)
    total_ms: float = 0.0
    redis_fallback: bool = False  # Redis configured but unusable: served without it
    local_build: bool = False  # this process compiled it (a verdict says so, or a fallback)
    service_fallback: bool = False  # the grammar service was unreachable: served without it


@dataclass(frozen=True)
class Cached(Generic[V]):
    key: str
    value: V
    stats: CompileStats

    @property
    def grammar(self) -> Any:  # a GrammarCache's value
        return self.value

    @property
    def record(self) -> Record:  # a RecordCache's value
        assert isinstance(self.value, Record)
        return self.value


@dataclass(frozen=True)
class Remote:
    """An upstream's answer: the key's Record and how the upstream got it."""

    record: Record
    stats: CompileStats


class UpstreamUnavailable(Exception):
    """The upstream could not be asked (down, unreachable): serve without it."""


Upstream = Callable[[str, Any, str], Awaitable[Remote]]  # (key, constraint, framing) -> Remote


@dataclass
class _Fill:  # what the task that fills one key found out
    hit: Hit | None = None
    built: bool = False
    waited: bool = False
    compile_ms: float = 0.0
    queue_ms: float = 0.0
    load_ms: float = 0.0
    redis_fallback: bool = False
    local_build: bool = False
    service_fallback: bool = False
    extra: dict = field(default_factory=dict)

    def stats(self, total_ms: float) -> CompileStats:
        return CompileStats(self.hit, self.built, self.waited, self.compile_ms, self.queue_ms,
                            self.load_ms, total_ms, self.redis_fallback, self.local_build,
                            self.service_fallback)


class _LRU(Generic[V]):
    """Values by key, least recently used first, within a byte budget."""

    def __init__(self, budget: int, size: Callable[[V], int]) -> None:
        self.budget = budget
        self.bytes = 0
        self._size = size
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()

    def get(self, key: str) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, value: V) -> None:
        size = self._size(value)
        if size > self.budget or key in self._items:
            return
        self._items[key] = (value, size)
        self.bytes += size
        while self.bytes > self.budget:
            _, (_, evicted) = self._items.popitem(last=False)
            self.bytes -= evicted

    def keys(self) -> list[str]:
        return list(self._items)


class _KeyCache(Generic[V]):
    """The shared logic; subclasses say what a value is (`_size`, `_value_of`, `_from_build`)."""

    def __init__(self, compiler: ModelCompiler, *, model: str | None = None,
                 store: RedisStore | None = None, config: CacheConfig = CacheConfig(),
                 metrics: GrammarMetrics | None = None) -> None:
        self.compiler = compiler
        self.model = model or compiler.domain.name
        self.store = store
        self.config = config
        self.metrics = metrics if metrics is not None else GrammarMetrics()
        self.builder = Builder(compiler, config, self.metrics, self.model)
        self._l1: _LRU[V] = _LRU(config.cache_bytes, self._size)
        self._flights: dict[str, asyncio.Task] = {}
        self._publishing: set[asyncio.Task] = set()  # records being written to Redis
        self._rejected: OrderedDict[str, tuple[ConstraintTooComplex, float]] = OrderedDict()

    # -- what a value is (subclasses) --------------------------------------------------------

    def _size(self, value: V) -> int:
        raise NotImplementedError

    async def _value_of(self, record: Record, constraint: Any, fill: _Fill) -> V | None:
        """The value of a Record found in Redis or upstream; None when unusable."""
        raise NotImplementedError

    async def _from_build(self, constraint: Any, fill: _Fill) -> tuple[V, BuildOutcome]:
        raise NotImplementedError

    # -- public ------------------------------------------------------------------------------

    @property
    def domain(self) -> TokenDomain:
        return self.compiler.domain

    @property
    def l1_bytes(self) -> int:
        return self._l1.bytes

    def l1_keys(self) -> list[str]:
        """L1 keys, least recently used first."""
        return self._l1.keys()

    def key(self, constraint: Any, *, framing: str | None = None) -> str:
        """The cache key of `constraint` under `framing` (default: the source's own framing)."""
        return cache_key(constraint, self.domain, framing=framing or framing_of(constraint))

    def cached(self, key: str) -> V | None:
        """The L1 value of `key`, or None (never waits)."""
        return self._l1.get(key)

    async def fetch(self, constraint: Any, *, framing: str | None = None,
                    upstream: Upstream | None = None) -> Cached[V]:
        """The value of `constraint` with its key and how it was obtained.

        `framing` defaults to the source's own framing (others raise Unsupported). Raises the
        build's typed RequestError (ConstraintTooComplex when a limit stopped it), Overloaded
        when no cold slot freed in time, InternalError when a compile process crashed."""
        start = time.perf_counter()
        framing = framing or framing_of(constraint)
        if framing != framing_of(constraint):
            raise Unsupported(f"framing {framing!r} does not fit a {source_kind(constraint)} "
                              f"source; use {framing_of(constraint)!r}", field="framing")
        key = self.key(constraint, framing=framing)
        value = self._l1.get(key)
        if value is not None:
            self.metrics.count_compile(self.model, "l1")
            return Cached(key, value, CompileStats("l1", False, False, 0.0,
                                                   total_ms=_ms_since(start)))
        self._check_rejected(key)
        task = self._flights.get(key)
        owner = task is None
        if task is None:
            task = self._start_flight(key, constraint, framing, upstream)
        try:
            value, fill = await asyncio.shield(task)
        except ConstraintTooComplex as exc:
            self._remember_rejection(key, exc)
            self.metrics.count_compile(self.model, "too_complex")
            raise
        except Overloaded:
            self.metrics.count_compile(self.model, "overloaded")
            raise
        except RequestError:
            self.metrics.count_compile(self.model, "error")
            raise
        total = _ms_since(start)
        if not owner:
            self.metrics.count_compile(self.model, "shared")
            return Cached(key, value, CompileStats(None, False, True, 0.0, total_ms=total,
                                                   redis_fallback=fill.redis_fallback,
                                                   service_fallback=fill.service_fallback))
        self.metrics.count_compile(self.model, fill.hit if fill.hit else "built")
        if fill.redis_fallback:
            self.metrics.redis_fallbacks.inc()
        if fill.service_fallback:
            self.metrics.service_fallbacks.labels(model=self.model).inc()
        return Cached(key, value, fill.stats(total))

    async def get(self, key: str) -> V | None:
        """The value of `key` from L1, a fill in flight, or Redis; None if none has it (never
        builds; a verdict-only Redis record of a GrammarCache counts as none)."""
        value = self._l1.get(key)
        if value is not None:
            return value
        task = self._flights.get(key)
        if task is not None:
            try:
                return (await asyncio.shield(task))[0]
            except (RequestError, Overloaded):
                return None
        if self.store is None:
            return None
        try:
            data = await self.store.get(self.domain.vocab_id, key)
        except StoreUnavailable:
            self.metrics.redis_fallbacks.inc()
            return None
        record = None if data is None else await self._decode_record(key, data)
        if record is None or (record.blob is None and not isinstance(self, RecordCache)):
            return None
        value = await self._value_of(record, None, _Fill())
        if value is not None:
            self._put_l1(key, value)
        return value

    # -- refusals ------------------------------------------------------------------------------

    def _check_rejected(self, key: str) -> None:
        item = self._rejected.get(key)
        if item is None:
            return
        error, until = item
        if time.monotonic() < until:
            self.metrics.count_compile(self.model, "too_complex")
            raise error
        del self._rejected[key]

    def _remember_rejection(self, key: str, error: ConstraintTooComplex) -> None:
        if self.config.reject_ttl_s <= 0:
            return
        self._rejected[key] = (error, time.monotonic() + self.config.reject_ttl_s)
        while len(self._rejected) > 4096:
            self._rejected.popitem(last=False)

    # -- one flight per key ------------------------------------------------------------------

    def _start_flight(self, key: str, constraint: Any, framing: str,
                      upstream: Upstream | None) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(
            self._fill(key, constraint, framing, upstream))
        self._flights[key] = task

        def done(t: asyncio.Task) -> None:
            if self._flights.get(key) is t:
                del self._flights[key]
            if not t.cancelled():
                t.exception()  # retrieved here: every awaiting request re-raises it itself

        task.add_done_callback(done)
        return task

    async def _fill(self, key: str, constraint: Any, framing: str,
                    upstream: Upstream | None) -> tuple[V, _Fill]:
        fill = _Fill()
        value = None
        if upstream is not None:
            try:
                remote = await upstream(key, constraint, framing)
            except UpstreamUnavailable:
                fill.service_fallback = True
            else:
                value = await self._value_of(remote.record, constraint, fill)
                if value is not None and fill.hit == "redis":  # it came over gRPC, not Redis
                    fill.hit = "service"
                if value is not None and not fill.local_build:
                    fill.built, fill.waited = remote.stats.built, remote.stats.waited
                    fill.compile_ms = remote.stats.compile_ms
        if value is None and self.store is not None:
            try:
                value = await self._fill_shared(key, constraint, fill)
            except StoreUnavailable:
                fill.redis_fallback = True
        if value is None:
            value, _ = await self._from_build(constraint, fill)
        self._put_l1(key, value)
        return value, fill

    async def _decode_record(self, key: str, data: bytes) -> Record | None:
        try:
            return Record.decode(data)
        except (ValueError, KeyError) as exc:  # a foreign or corrupt value: drop it
            await self._discard(key, exc)
            return None

    async def _discard(self, key: str, exc: Exception) -> None:
        log.warning("grammar_record_unreadable", model=self.model, key=key[:16],
                    error=type(exc).__name__)
        if not self.config.read_only and self.store is not None:
            try:
                await self.store.discard(self.domain.vocab_id, key)
            except StoreUnavailable:
                pass

    async def _from_store(self, key: str, data: bytes | None, constraint: Any,
                          fill: _Fill) -> V | None:
        record = None if data is None else await self._decode_record(key, data)
        if record is None:
            return None
        value = await self._value_of(record, constraint, fill)
        if value is None:
            await self._discard(key, ValueError("blob did not load"))
        return value

    async def _fill_shared(self, key: str, constraint: Any, fill: _Fill) -> V | None:
        """A Redis record, or a build under the key's lock. Raises StoreUnavailable only before
        building; returns None when the caller should build in process (read-only mode)."""
        store, vocab = self.store, self.domain.vocab_id
        assert store is not None
        delay, deadline = self.config.poll_s, time.monotonic() + self.config.max_wait_s
        while True:
            value = await self._from_store(key, await store.get(vocab, key), constraint, fill)
            if value is not None:
                return value
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
                    value = await self._from_store(key, await store.get(vocab, key), constraint,
                                                   fill)
                    if value is not None:
                        return value
            value, outcome = await self._from_build(constraint, fill)
            # The requester gets its value now; serialising and storing the record (longer
            # than many compiles) happens in the background, still under the key's lock so that
            # other replicas wait for it instead of building again.
            task = asyncio.get_running_loop().create_task(
                self._publish(key, outcome, token, keepalive))
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)
            store.track(task)
            published = True
            return value
        finally:
            if not published:
                await self._release(key, token, keepalive)

    async def _publish(self, key: str, outcome: BuildOutcome, token: str | None,
                       keepalive: asyncio.Task | None) -> None:
        try:
            record = await outcome.record()
            await self.store.put(self.domain.vocab_id, key, record.encode())
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

    async def _keep_lock(self, key: str, token: str) -> None:
        ttl = self.config.lock_ttl_ms
        while True:
            await asyncio.sleep(ttl / 3000.0)
            try:
                if not await self.store.renew_lock(self.domain.vocab_id, key, token, ttl):
                    return
            except StoreUnavailable:
                return

    def _put_l1(self, key: str, value: V) -> None:
        self._l1.put(key, value)
        self.metrics.l1_bytes.labels(model=self.model).set(self._l1.bytes)

    async def drain(self) -> None:
        """Wait until every record built here is stored in Redis (or failed to be)."""
        while self._publishing:
            await asyncio.gather(*list(self._publishing), return_exceptions=True)

    async def aclose(self) -> None:
        """Stop every fill in flight and the compile children (a runaway compile included)."""
        for task in list(self._flights.values()):
            task.cancel()
        await asyncio.gather(*self._flights.values(), return_exceptions=True)
        await self.builder.aclose()


class GrammarCache(_KeyCache[Any]):
    """Compiled grammars for matchers (workers, embedded mode). Use from one event loop."""

    def _size(self, value: Any) -> int:
        return records.footprint(value)

    async def compile(self, constraint: Any, *, framing: str | None = None,
                      upstream: Upstream | None = None) -> Cached[Any]:
        """`fetch`: the compiled grammar of `constraint` as `.grammar` (see `fetch`)."""
        return await self.fetch(constraint, framing=framing, upstream=upstream)

    async def _value_of(self, record: Record, constraint: Any, fill: _Fill) -> Any | None:
        if record.blob is None:  # a verdict: cheaper to compile here than to load
            if constraint is None:
                return None
            grammar, _ = await self._from_build(constraint, fill, trusted=True)
            return grammar
        start = time.perf_counter()
        try:
            grammar = await asyncio.to_thread(records.deserialize, record.blob, self.compiler)
        except Exception as exc:  # noqa: BLE001 - a corrupt or foreign blob: build instead
            log.warning("grammar_blob_unreadable", model=self.model, error=type(exc).__name__)
            return None
        fill.hit, fill.load_ms = "redis", _ms_since(start)
        return grammar

    async def _from_build(self, constraint: Any, fill: _Fill, *,
                          trusted: bool = False) -> tuple[Any, BuildOutcome]:
        outcome = await self.builder.build(constraint, want="always", trusted=trusted)
        fill.built, fill.local_build, fill.hit = True, True, None
        fill.compile_ms, fill.queue_ms = outcome.info.compile_ms, outcome.queue_ms
        fill.load_ms = outcome.load_ms
        return outcome.grammar, outcome


class RecordCache(_KeyCache[Record]):
    """Records for the grammar service: verdicts and the blobs it ships. Use from one loop."""

    def _size(self, value: Record) -> int:
        return value.nbytes

    async def compile(self, constraint: Any, *, framing: str | None = None) -> Cached[Record]:
        """`fetch`: the Record of `constraint` as `.record` (see `fetch`)."""
        return await self.fetch(constraint, framing=framing)

    async def _value_of(self, record: Record, constraint: Any, fill: _Fill) -> Record | None:
        fill.hit = "redis"
        return record

    async def _from_build(self, constraint: Any, fill: _Fill) -> tuple[Record, BuildOutcome]:
        outcome = await self.builder.build(constraint, want="stored", trusted=False)
        fill.built, fill.local_build, fill.hit = True, True, None
        fill.compile_ms, fill.queue_ms = outcome.info.compile_ms, outcome.queue_ms
        return await outcome.record(), outcome


class ModelCaches:
    """One cache per served model, sharing one Redis store (or none: in-process only)."""

    def __init__(self, caches: Mapping[str, _KeyCache], store: RedisStore | None = None) -> None:
        self._caches = dict(caches)
        self.store = store

    @classmethod
    def open(cls, domains: Mapping[str, TokenDomain], *, redis_url: str | None = None,
             config: CacheConfig = CacheConfig(), redis_budget_bytes: int | None = None,
             metrics: GrammarMetrics | None = None,
             cache_type: type[_KeyCache] = GrammarCache) -> "ModelCaches":
        """Caches of `cache_type` for `domains` (model name -> token domain). Without
        `redis_url` nothing is shared; `redis_budget_bytes` defaults to `config.cache_bytes`."""
        metrics = metrics if metrics is not None else GrammarMetrics()
        store = None
        if redis_url:
            store = RedisStore(StoreConfig(redis_url, redis_budget_bytes or config.cache_bytes))
        caches = {name: cache_type(ModelCompiler(domain), model=name, store=store, config=config,
                                   metrics=metrics) for name, domain in domains.items()}
        return cls(caches, store)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._caches)

    def __getitem__(self, model: str) -> Any:
        """The cache of `model`; raises InvalidRequest(field="model") for a model not served."""
        cache = self._caches.get(model)
        if cache is None:
            raise InvalidRequest(f"model {model!r} is not served here; expected one of "
                                 f"{', '.join(self._caches) or '(none)'}", field="model")
        return cache

    def values(self) -> list[_KeyCache]:
        return list(self._caches.values())

    async def shutdown(self) -> None:
        """Stop compiles in flight now (their children are killed); keep Redis writes."""
        for cache in self._caches.values():
            await cache.aclose()

    async def aclose(self) -> None:
        """Finish storing what was built, stop the compile children, close the Redis client."""
        for cache in self._caches.values():
            await cache.drain()
        await self.shutdown()
        if self.store is not None:
            await self.store.aclose()


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
