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
`services.grammar.cache.isolation`) or "thread" (in process: only the waiter's deadline holds).
A build takes one of `max_cold_compiles` slots (`ColdSlots`); hits never do; a request waits at
most `slot_wait_s` for one and then gets `Overloaded`. Typed errors of a build reach every waiter
unchanged; only `ConstraintTooComplex` is remembered. A writer publishes the key's Record (with
its blob when `StorePolicy` keeps it) after answering, still under the key's lock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

from services.grammar.cache import records
from services.grammar.cache.builders import BuildOutcome
from services.grammar.cache.cache_types import (
    DEFAULT_CACHE_BYTES,
    CacheConfig,
    Cached,
    CompileStats,
    Fill,
    Hit,
    Remote,
    Upstream,
    UpstreamUnavailable,
)
from services.grammar.cache.keycache import KeyCache, ms_since
from services.grammar.cache.records import Record
from services.grammar.cache.store import RedisStore, StoreConfig
from services.grammar.compiler import ModelCompiler
from shared.errors import InvalidRequest
from shared.frontends.token_domain import TokenDomain
from shared.logging import get_logger
from shared.metrics import GrammarMetrics

log = get_logger(__name__)

encode_blob = records.serialize  # the compressed serialisation of a compiled grammar

__all__ = ["DEFAULT_CACHE_BYTES", "CacheConfig", "Cached", "CompileStats", "GrammarCache", "Hit",
           "ModelCaches", "RecordCache", "Remote", "Upstream", "UpstreamUnavailable",
           "encode_blob"]


class GrammarCache(KeyCache[Any]):
    """Compiled grammars for matchers (workers, embedded mode). Use from one event loop."""

    def _size(self, value: Any) -> int:
        return records.footprint(value)

    async def compile(self, constraint: Any, *, framing: str | None = None,
                      upstream: Upstream | None = None) -> Cached[Any]:
        """`fetch`: the compiled grammar of `constraint` as `.grammar` (see `fetch`)."""
        return await self.fetch(constraint, framing=framing, upstream=upstream)

    async def _value_of(self, record: Record, constraint: Any, fill: Fill) -> Any | None:
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
        fill.hit, fill.load_ms = "redis", ms_since(start)
        return grammar

    async def _from_build(self, constraint: Any, fill: Fill, *,
                          trusted: bool = False) -> tuple[Any, BuildOutcome]:
        outcome = await self.builder.build(constraint, want="always", trusted=trusted)
        fill.built, fill.local_build, fill.hit = True, True, None
        fill.compile_ms, fill.queue_ms = outcome.info.compile_ms, outcome.queue_ms
        fill.load_ms = outcome.load_ms
        return outcome.grammar, outcome


class RecordCache(KeyCache[Record]):
    """Records for the grammar service: verdicts and the blobs it ships. Use from one loop."""

    verdicts_are_values = True

    def _size(self, value: Record) -> int:
        return value.nbytes

    async def compile(self, constraint: Any, *, framing: str | None = None) -> Cached[Record]:
        """`fetch`: the Record of `constraint` as `.record` (see `fetch`)."""
        return await self.fetch(constraint, framing=framing)

    async def _value_of(self, record: Record, constraint: Any, fill: Fill) -> Record | None:
        fill.hit = "redis"
        return record

    async def _from_build(self, constraint: Any, fill: Fill) -> tuple[Record, BuildOutcome]:
        outcome = await self.builder.build(constraint, want="stored", trusted=False)
        fill.built, fill.local_build, fill.hit = True, True, None
        fill.compile_ms, fill.queue_ms = outcome.info.compile_ms, outcome.queue_ms
        return await outcome.record(), outcome


class ModelCaches:
    """One cache per served model, sharing one Redis store (or none: in-process only)."""

    def __init__(self, caches: Mapping[str, KeyCache], store: RedisStore | None = None) -> None:
        self._caches = dict(caches)
        self.store = store

    @classmethod
    def open(cls, domains: Mapping[str, TokenDomain], *, redis_url: str | None = None,
             config: CacheConfig = CacheConfig(), redis_budget_bytes: int | None = None,
             metrics: GrammarMetrics | None = None,
             cache_type: type[KeyCache] = GrammarCache) -> "ModelCaches":
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

    def values(self) -> list[KeyCache]:
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

