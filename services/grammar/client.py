"""How a worker reaches the grammar service: in process (embedded mode) or over gRPC.

Both clients have one interface: `compile` returns the key, the compiled grammar itself and how
it was obtained (`CompileResult`); `health` says whether constrained requests are served as
designed or degraded.

The gRPC client is not a single point of failure. It looks in the worker's own L1 first (no call
at all for a grammar it holds); otherwise one Compile call returns the key's build verdict and,
when the store policy keeps the grammar, its blob (one cold compile is paid once; a grammar that
compiles faster than it loads is compiled here instead, within the limits the service proved).
When the service cannot be reached the client serves without it (`degraded`): from Redis, else
an in-process build under the worker's own cold slots and limits; the first time the service is
found unreachable, the worker's compile children start in the background, so that fallback builds
do not pay their start-up. It retries the service every `retry_s` seconds; grpclib reconnects by
itself.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from services.grammar.cache.grammar_cache import (
    CompileStats,
    ModelCaches,
    Remote,
    UpstreamUnavailable,
)
from services.grammar.service import constraint_to_request, record_from_reply, stats_from_proto
from services.settings import default
from shared.contract import OutputConstraint
from shared.errors import GrammarServiceUnavailable, InternalError
from shared.logging import get_logger
from shared.metrics import GrammarClientMetrics
from shared.proto import grammar_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, typed_error
from shared.proto.grammar_grpc import GrammarStub

log = get_logger(__name__)

# Statuses a dead, restarting or overwhelmed-at-transport-level service answers with, without
# typed details: the request is served without the service.
_TRANSPORT_STATUSES = frozenset({Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.CANCELLED,
                                 Status.UNKNOWN})


@dataclass(frozen=True)
class CompileResult:
    key: str
    grammar: Any  # the compiled grammar (opaque outside services.grammar)
    stats: CompileStats


class GrammarClient(abc.ABC):
    """The worker's view of the grammar service."""

    @abc.abstractmethod
    async def compile(self, constraint: OutputConstraint, *, model: str,
                      framing: str | None = None) -> CompileResult:
        """Validate and compile `constraint` for `model` (or find it cached); the compiled
        grammar itself, its key and how it was obtained.

        Raises the typed RequestError of an invalid constraint or unknown model
        (InvalidRequest(field="model")), ConstraintTooComplex (a compile limit stopped it),
        Overloaded (no cold-compile slot freed in time: retry after `retry_after_s`),
        InternalError when a compile crashed."""

    @abc.abstractmethod
    async def health(self) -> dict[str, Any]:
        """{"grammar_service": "ok" | "unreachable" | "in_process", "degraded": bool,
        "ready": bool, "redis": "ok" | "unreachable" | "not_configured", "missing": [names],
        ...}: `degraded` is True while a dependency is missing; `ready` is False only when
        constrained requests cannot be served now (the service is unreachable and the fallback
        is off)."""

    async def close(self) -> None:
        """Release connections and compile children (the caches' Redis client included)."""


async def _redis_state(caches: ModelCaches) -> str:
    if caches.store is None:
        return "not_configured"
    return "ok" if await caches.store.ping() else "unreachable"


class InProcessGrammarClient(GrammarClient):
    """Calls the caches directly: embedded mode, one process, one cache per model."""

    def __init__(self, caches: ModelCaches) -> None:
        self.caches = caches

    async def compile(self, constraint: OutputConstraint, *, model: str,
                      framing: str | None = None) -> CompileResult:
        result = await self.caches[model].compile(constraint, framing=framing)
        return CompileResult(result.key, result.grammar, result.stats)

    async def health(self) -> dict[str, Any]:
        redis = await _redis_state(self.caches)
        missing = ["redis"] if redis == "unreachable" else []
        return {"grammar_service": "in_process", "degraded": bool(missing), "ready": True,
                "redis": redis, "missing": missing}

    async def close(self) -> None:
        await self.caches.aclose()


class GrpcGrammarClient(GrammarClient):
    """Compiles through the grammar service; serves without it while it is unreachable.

    `caches` should be opened with `CacheConfig(read_only=True)` on the same Redis as the
    service (they never write Redis) and, for builds of unknown cost while the service is down,
    `isolation="process"`. The key the service returns must equal the key they compute (same
    vocabulary), which `compile` checks. `timeout_s` bounds one Compile call (keep it above the
    service's slot wait plus twice its compile deadline: compile, then serialise); `retry_s` is
    how long, after a failure, requests
    go straight to the fallback before the service is tried again; `probe_timeout_s` bounds the
    Health call `health()` makes. `fallback` False forbids serving without the service: while
    it is unreachable, a grammar not in L1 fails with GrammarServiceUnavailable (503)."""

    def __init__(self, host: str, port: int, caches: ModelCaches, *,
                 timeout_s: float = default("grammar_timeout_s"),
                 retry_s: float = default("grammar_retry_s"), probe_timeout_s: float = 1.0,
                 fallback: bool = default("grammar_fallback") == "on") -> None:
        if timeout_s <= 0 or retry_s < 0 or probe_timeout_s <= 0:
            raise ValueError("GrpcGrammarClient needs timeout_s > 0, retry_s >= 0, "
                             "probe_timeout_s > 0")
        self.caches = caches
        self.address = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.probe_timeout_s = probe_timeout_s
        self.fallback = fallback
        self._channel = Channel(host, port, status_details_codec=ErrorStatusCodec())
        self._stub = GrammarStub(self._channel)
        self._up: bool | None = None  # None until the first call
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._last_ok = 0.0
        self._last_error: str | None = None
        self._warming: list[asyncio.Task] = []  # compile children started for the fallback
        registry = caches.values()[0].metrics.registry if caches.values() else None
        self._metrics = GrammarClientMetrics(registry)  # beside the caches' own metrics

    # -- compile -----------------------------------------------------------------------------

    async def compile(self, constraint: OutputConstraint, *, model: str,
                      framing: str | None = None) -> CompileResult:
        cache = self.caches[model]

        async def upstream(key: str, constraint: Any, framing: str) -> Remote:
            return await self._ask(model, key, constraint, framing)

        result = await cache.compile(constraint, framing=framing, upstream=upstream)
        return CompileResult(result.key, result.grammar, result.stats)

    async def _ask(self, model: str, key: str, constraint: Any, framing: str) -> Remote:
        try:
            return await self._call(model, key, constraint, framing)
        except UpstreamUnavailable as exc:
            if self.fallback:
                raise
            raise GrammarServiceUnavailable(
                f"the grammar service at {self.address} is unreachable ({exc}) and this worker "
                "may not compile by itself", service="grammar",
                retry_after_s=max(1.0, self.retry_s)) from None

    async def _call(self, model: str, key: str, constraint: Any, framing: str) -> Remote:
        if self._up is False and time.monotonic() < self._retry_at:
            raise UpstreamUnavailable(self._last_error or "grammar service unreachable")
        request = constraint_to_request(constraint, model=model, framing=framing, want_blob=True)
        try:
            reply = await self._stub.Compile(request, timeout=self.timeout_s)
        except GRPCError as exc:
            error = typed_error(exc)
            if _carries_typed_error(exc):
                self._mark_up()  # it answered: typed errors are the request's own
                raise error from None
            if exc.status in _TRANSPORT_STATUSES:
                self._mark_down(f"{exc.status.name}: {exc.message or ''}".strip())
                raise UpstreamUnavailable(str(exc)) from None
            raise error from None
        except (OSError, StreamTerminatedError, asyncio.TimeoutError, ConnectionError) as exc:
            self._mark_down(type(exc).__name__)
            raise UpstreamUnavailable(type(exc).__name__) from None
        self._mark_up()
        if reply.key != key:
            raise InternalError(f"the grammar service and this worker disagree on model {model!r}:"
                                " different vocabularies or converter versions")
        try:
            record = record_from_reply(reply)
        except ValueError as exc:
            raise InternalError(f"the grammar service sent an inconsistent reply: {exc}") from None
        return Remote(record, stats_from_proto(reply.stats))

    # -- health ------------------------------------------------------------------------------

    def _mark_up(self) -> None:
        if self._up is False:
            log.info("grammar_service_reconnected", address=self.address,
                     down_s=round(time.monotonic() - (self._down_since or time.monotonic()), 3))
        self._up, self._down_since, self._last_ok = True, None, time.monotonic()
        self._metrics.service_up.set(1)

    def _mark_down(self, reason: str) -> None:
        now = time.monotonic()
        if self._up is not False:
            log.warning("grammar_service_unreachable", address=self.address, error=reason,
                        fallback="redis, then in-process builds")
            self._down_since = now
            if self.fallback and not self._warming:
                loop = asyncio.get_running_loop()
                self._warming = [loop.create_task(cache.builder.warm())
                                 for cache in self.caches.values()]
        self._up, self._retry_at, self._last_error = False, now + self.retry_s, reason
        self._metrics.service_up.set(0)
        self._metrics.service_failures.inc()

    async def probe(self) -> bool:
        """Ask the service's Health now (bounded by `probe_timeout_s`); True when it answers
        SERVING. Updates the state `health()` reports."""
        try:
            reply = await self._stub.Health(pb.HealthRequest(), timeout=self.probe_timeout_s)
        except (GRPCError, OSError, StreamTerminatedError, asyncio.TimeoutError,
                ConnectionError) as exc:
            self._mark_down(type(exc).__name__)
            return False
        if reply.status != "SERVING":
            self._mark_down(f"status {reply.status}")
            return False
        self._mark_up()
        return True

    async def health(self) -> dict[str, Any]:
        """The state of the grammar service and Redis as this worker sees them.

        Probes the service (Health, `probe_timeout_s`) unless a call succeeded within the last
        `retry_s` seconds. Keys: grammar_service ("ok" | "unreachable"), degraded (bool),
        redis ("ok" | "unreachable" | "not_configured"), missing (names of unreachable
        dependencies), fallback (what stands in: "redis, in-process builds"), address,
        down_s (seconds since the service became unreachable, else None), last_error, ready
        (False only while the service is unreachable and the fallback is off)."""
        if not (self._up and time.monotonic() - self._last_ok < self.retry_s):
            await self.probe()
        redis = await _redis_state(self.caches)
        missing = [
            name
            for name, ok in (("grammar_service", self._up), ("redis", redis != "unreachable"))
            if not ok
        ]
        down_s = None if self._down_since is None else round(time.monotonic() - self._down_since, 3)
        return {"grammar_service": "ok" if self._up else "unreachable",
                "degraded": bool(missing), "ready": bool(self._up or self.fallback),
                "redis": redis, "missing": missing,
                "fallback": ("redis, in-process builds" if self.fallback else "none")
                            if not self._up else None,
                "address": self.address, "down_s": down_s, "last_error": self._last_error}

    async def close(self) -> None:
        self._channel.close()
        for task in self._warming:
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        await self.caches.aclose()


def _carries_typed_error(exc: GRPCError) -> bool:
    return any(getattr(d, "type", None) for d in exc.details or ())


# ---------------------------------------------------------------- what the worker may use
# The worker reaches the grammar service only through this module: the clients above, the
# factory below, and the two facts about an output language it needs while preparing a request.

from services.grammar.engines.batch import MaskFiller, fill_masks  # noqa: E402,F401 - re-exported
from services.grammar.engines.engine import (  # noqa: E402,F401 - re-exported: the interface
    CompiledConstraint,
    Matcher,
)
from services.grammar.json_lengths import (  # noqa: E402,F401 - re-exported: the JSON companion
    JsonLengthConstraint,
    json_lengths_for,
)
from services.grammar.json_names import (  # noqa: E402,F401 - re-exported: the JSON companion
    JsonNameConstraint,
    json_names_for,
    tool_json_names_for,
)
from services.grammar.tools.hermes import (  # noqa: E402,F401 - re-exported
    ToolSpec,
    needs_tool_grammar,
)
from services.grammar.tools.param_names import (  # noqa: E402,F401 - re-exported: the XML companion
    NameIndex,
    ParameterNameConstraint,
)
from services.grammar.tools.raw_lengths import (  # noqa: E402,F401 - re-exported: the XML companion
    LengthIndex,
    RawLengthConstraint,
)
from services.grammar.tools.xml_tools import (  # noqa: E402,F401 - the decoder's contract
    argument_codings,
    counted_lengths,
)
from services.grammar.unique_items import (  # noqa: E402,F401 - re-exported: the JSON companion
    UniqueItemsConstraint,
    unique_items_for,
)


def in_process_client(domains: dict, *, redis_url: str | None = None, config=None,
                      registry=None) -> InProcessGrammarClient:
    """An in-process client compiling for `domains` (model name -> TokenDomain) with an in-memory
    cache (and Redis when `redis_url` is given). `config`: a CacheConfig (default CacheConfig())."""
    from services.grammar.cache.grammar_cache import CacheConfig
    from shared.metrics import GrammarMetrics

    caches = ModelCaches.open(domains, redis_url=redis_url, metrics=GrammarMetrics(registry),
                              config=config if config is not None else CacheConfig())
    return InProcessGrammarClient(caches)


def check_constraint(constraint: OutputConstraint, domain) -> None:
    """Validate and convert `constraint` for `domain` without compiling against the vocabulary
    (moments, no model needed); raises the typed errors a compile would raise for the source."""
    from services.grammar.compiler import build_grammar

    build_grammar(constraint, domain)


def build_companion_indices(domain) -> float:
    """Build the per-vocabulary indices of the matcher companions (JSON names and string
    lengths, Qwen XML parameter names and raw value lengths) so that the first request that needs
    one does not pay it (Qwen3.5's vocabulary: ~1.7 s together, SmolLM2's ~0.3 s); each is built
    once per vocabulary and kept. Returns the seconds it took."""
    from services.grammar.json_index import JsonNameIndex
    from services.grammar.json_lengths import JsonLengthIndex

    start = time.perf_counter()
    for index in (JsonNameIndex, JsonLengthIndex, NameIndex, LengthIndex):
        index.of(domain)
    return time.perf_counter() - start
