"""The compile cache's configuration and the values it hands out (see
`services.grammar.cache.grammar_cache`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, Literal, TypeVar

from services.grammar.cache.limits import CompileLimits, StorePolicy
from services.grammar.cache.records import Record
from services.settings import default

DEFAULT_CACHE_BYTES = default("grammar_cache_bytes")
Hit = Literal["l1", "redis", "service"]
V = TypeVar("V")


@dataclass(frozen=True)
class CacheConfig:
    cache_bytes: int = DEFAULT_CACHE_BYTES  # L1 budget (grammar_cache_bytes), in bytes
    max_cold_compiles: int = default("max_cold_compiles")  # concurrent builds per model
    lock_ttl_ms: int = 10_000  # Redis build lock; renewed every third of it while building
    poll_s: float = 0.02  # first wait between polls for another replica's build (x1.5, max 0.25)
    max_wait_s: float = 120.0  # after waiting this long on a live lock, build anyway
    read_only: bool = False  # never write Redis or take locks (a worker's cache)
    slot_wait_s: float = default("cold_slot_wait_s")  # wait for a cold slot, then Overloaded
    limits: CompileLimits = CompileLimits()
    isolation: Literal["thread", "process"] = default("compile_isolation")  # where builds run
    policy: StorePolicy = StorePolicy()
    reject_ttl_s: float = default("compile_reject_ttl_s")  # a key a limit stopped stays refused

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
class Fill:  # what the task that fills one key found out
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


class LRU(Generic[V]):
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


