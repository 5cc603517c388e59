"""One flight per key: L1, upstream, Redis records, build locks and publishing, for both caches.

`KeyCache` is the logic that `GrammarCache` and `RecordCache` (`cache/grammar_cache.py`, whose
docstring describes the lookup order) share; they say what a value is.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Generic

from services.grammar.cache.builders import Builder, BuildOutcome
from services.grammar.cache.cache_types import (
    LRU,
    CacheConfig,
    Cached,
    CompileStats,
    Fill,
    Upstream,
    UpstreamUnavailable,
    V,
)
from services.grammar.cache.records import Record
from services.grammar.cache.store import RedisStore, StoreUnavailable
from services.grammar.compiler import Framed, ModelCompiler, cache_key, framed, framing_of
from shared.errors import ConstraintTooComplex, Overloaded, RequestError, ServiceUnavailable
from shared.frontends.token_domain import TokenDomain
from shared.logging import get_logger
from shared.metrics import GrammarMetrics

log = get_logger(__name__)


class KeyCache(Generic[V]):
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
        self._l1: LRU[V] = LRU(config.cache_bytes, self._size)
        self._flights: dict[str, asyncio.Task] = {}
        self._publishing: set[asyncio.Task] = set()  # records being written to Redis
        self._rejected: OrderedDict[str, tuple[ConstraintTooComplex, float]] = OrderedDict()

    # -- what a value is (subclasses) --------------------------------------------------------

    verdicts_are_values = False  # a Record without a blob is a value by itself (RecordCache)

    def _size(self, value: V) -> int:
        raise NotImplementedError

    async def _value_of(self, record: Record, constraint: Any, fill: Fill) -> V | None:
        """The value of a Record found in Redis or upstream; None when unusable."""
        raise NotImplementedError

    async def _from_build(self, constraint: Any, fill: Fill) -> tuple[V, BuildOutcome]:
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

        `framing` defaults to the source's own framing; one that does not fit the source raises
        Unsupported (services/grammar/framing.py). Raises the build's typed RequestError
        (ConstraintTooComplex when a limit stopped it), Overloaded when no cold slot freed in
        time, InternalError when a compile process crashed."""
        from services.grammar.framing import check_framing

        start = time.perf_counter()
        framing = framing or framing_of(constraint)
        check_framing(constraint, framing)
        key = self.key(constraint, framing=framing)
        value = self._l1.get(key)
        if value is not None:
            self.metrics.count_compile(self.model, "l1")
            return Cached(key, value, CompileStats("l1", False, False, 0.0,
                                                   total_ms=ms_since(start)))
        self._check_rejected(key)
        task = self._flights.get(key)
        owner = task is None
        if task is None:
            task = self._start_flight(key, framed(constraint, framing), framing, upstream)
        try:
            value, fill = await asyncio.shield(task)
        except ConstraintTooComplex as exc:
            self._remember_rejection(key, exc)
            self.metrics.count_compile(self.model, "too_complex")
            raise
        except Overloaded:
            self.metrics.count_compile(self.model, "overloaded")
            raise
        except (RequestError, ServiceUnavailable):
            self.metrics.count_compile(self.model, "error")
            raise
        total = ms_since(start)
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
        if record is None or (record.blob is None and not self.verdicts_are_values):
            return None
        value = await self._value_of(record, None, Fill())
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
                    upstream: Upstream | None) -> tuple[V, Fill]:
        fill = Fill()
        value = None
        if upstream is not None:
            try:
                source = constraint.source if isinstance(constraint, Framed) else constraint
                remote = await upstream(key, source, framing)
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
                          fill: Fill) -> V | None:
        record = None if data is None else await self._decode_record(key, data)
        if record is None:
            return None
        value = await self._value_of(record, constraint, fill)
        if value is None:
            await self._discard(key, ValueError("blob did not load"))
        return value

    async def _fill_shared(self, key: str, constraint: Any, fill: Fill) -> V | None:
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



def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
