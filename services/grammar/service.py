"""The grammar-compile gRPC service (grpclib): Compile and Health over the per-model caches.

A Compile request carries the constraint as the public contract's fields (kind, source, choices),
the model name and the framing id; the reply carries the cache key, the compile statistics, the
key's build verdict and, when the store policy keeps the grammar and the caller asks for it, the
compressed blob: a worker gets a cold compile's result in the same call, never by polling Redis.
The service holds `Record`s (`RecordCache`), never compiled grammars; its cold compiles run in
killable child processes within the compile limits. Typed errors travel as structured status
details (`shared.proto.errors`).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Mapping, Sequence

from grpclib.server import Server, Stream

from services.grammar.cache.grammar_cache import (
    DEFAULT_CACHE_BYTES,
    CacheConfig,
    CompileStats,
    ModelCaches,
    RecordCache,
)
from services.grammar.cache.records import BLOB_FORMAT, BuildInfo, Record
from services.grammar.compiler import RAW_FRAMING, framing_of, source_kind
from shared.contract import ConstraintKind, OutputConstraint
from shared.errors import InfernixError, InternalError, InvalidRequest
from shared.frontends import get_domain
from shared.frontends.token_domain import TokenDomain
from shared.logging import get_logger
from shared.metrics import GrammarMetrics, serve_metrics
from shared.proto import grammar_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, grpc_error
from shared.proto.grammar_grpc import GrammarBase

log = get_logger(__name__)

DEFAULT_PORT = 50051

_HIT_TO_PB = {None: pb.CACHE_HIT_NONE, "l1": pb.CACHE_HIT_L1, "redis": pb.CACHE_HIT_REDIS,
              "service": pb.CACHE_HIT_SERVICE}
_HIT_FROM_PB = {v: k for k, v in _HIT_TO_PB.items()}


def constraint_to_request(constraint: OutputConstraint, *, model: str, framing: str | None = None,
                          want_blob: bool = False) -> pb.CompileRequest:
    if not isinstance(constraint, OutputConstraint):  # a tool spec
        return pb.CompileRequest(model=model, kind=source_kind(constraint),
                                 source=constraint.to_json(), want_blob=want_blob,
                                 framing=framing or framing_of(constraint))
    return pb.CompileRequest(model=model, kind=constraint.kind.value, source=constraint.source,
                             choices=list(constraint.choices), framing=framing or RAW_FRAMING,
                             want_blob=want_blob, whitespace=constraint.whitespace or "")


def constraint_from_request(request: pb.CompileRequest) -> OutputConstraint:
    """Rebuild the constraint through the contract's own constructors (same validation).

    Raises InvalidRequest(field="kind") for an unknown kind, and the constructors' typed errors."""
    if request.kind == "tools":
        from services.grammar.tools.hermes import ToolSpec

        return ToolSpec.from_json(request.source)
    try:
        kind = ConstraintKind(request.kind)
    except ValueError:
        raise InvalidRequest(
            f"unknown constraint kind {request.kind!r}; expected one of "
            f"{', '.join(k.value for k in ConstraintKind)}",
            field="kind",
        ) from None
    if kind is ConstraintKind.GRAMMAR:
        return OutputConstraint.grammar(request.source)
    if kind is ConstraintKind.REGEX:
        return OutputConstraint.regex(request.source)
    if kind is ConstraintKind.JSON_OBJECT:
        return OutputConstraint.json_object(whitespace=request.whitespace or None)
    if kind is ConstraintKind.JSON_SCHEMA:
        return OutputConstraint.json_schema(request.source, whitespace=request.whitespace or None)
    return OutputConstraint.choice(list(request.choices))


def stats_to_proto(stats: CompileStats) -> pb.CompileStats:
    return pb.CompileStats(hit=_HIT_TO_PB[stats.hit], built=stats.built, waited=stats.waited,
                           compile_ms=stats.compile_ms, queue_ms=stats.queue_ms,
                           load_ms=stats.load_ms, total_ms=stats.total_ms,
                           redis_fallback=stats.redis_fallback)


def stats_from_proto(msg: pb.CompileStats) -> CompileStats:
    return CompileStats(hit=_HIT_FROM_PB.get(msg.hit), built=msg.built, waited=msg.waited,
                        compile_ms=msg.compile_ms, queue_ms=msg.queue_ms, load_ms=msg.load_ms,
                        total_ms=msg.total_ms, redis_fallback=msg.redis_fallback)


def record_to_reply(key: str, stats: CompileStats, record: Record, *,
                    want_blob: bool) -> pb.CompileReply:
    info = record.info
    reply = pb.CompileReply(key=key, stats=stats_to_proto(stats), build=pb.BuildInfo(
        compile_ms=info.compile_ms, memory_bytes=info.memory_bytes, stored=info.stored,
        serialized_bytes=info.serialized_bytes))
    if want_blob and record.blob is not None:
        reply.blob, reply.blob_format = record.blob, BLOB_FORMAT
    return reply


def record_from_reply(reply: pb.CompileReply) -> Record:
    """The Record a reply carries; a blob of another format (a service on another xgrammar)
    becomes a verdict, which the worker answers by compiling itself. Raises ValueError for a
    reply that says stored without the blob it was asked for."""
    stored = reply.build.stored and bool(reply.blob) and reply.blob_format == BLOB_FORMAT
    if reply.build.stored and not reply.blob:
        raise ValueError("the reply says stored but carries no blob")
    info = BuildInfo(reply.build.compile_ms, reply.build.memory_bytes, stored,
                     reply.build.serialized_bytes)
    return Record(info, bytes(reply.blob) if stored else None)


class GrammarService(GrammarBase):
    """Compile and Health over `caches` (RecordCaches); typed errors become status details."""

    def __init__(self, caches: ModelCaches) -> None:
        self.caches = caches

    async def compile(self, request: pb.CompileRequest) -> pb.CompileReply:
        """One Compile, without the transport. Raises the typed errors of the request."""
        cache = self.caches[request.model]
        constraint = constraint_from_request(request)
        result = await cache.compile(constraint, framing=request.framing or None)
        return record_to_reply(result.key, result.stats, result.record,
                               want_blob=request.want_blob)

    async def Compile(self, stream: Stream[pb.CompileRequest, pb.CompileReply]) -> None:
        request = await stream.recv_message()
        assert request is not None
        try:
            reply = await self.compile(request)
        except InfernixError as exc:
            if exc.fault == "internal":
                log.error("grammar_compile_failed", model=request.model, error=exc.type_name)
            elif exc.fault != "request" or exc.type_name == "ConstraintTooComplex":
                log.warning(
                    "grammar_compile_refused",
                    model=request.model,
                    error=exc.type_name,
                    limit=getattr(exc, "limit", None) or getattr(exc, "resource", None),
                )
            raise grpc_error(exc) from None
        except Exception as exc:  # a bug: logged with its traceback, reported as internal
            log.exception("grammar_compile_crashed", model=request.model)
            raise grpc_error(
                InternalError(f"grammar compile failed: {type(exc).__name__}")
            ) from None
        await stream.send_message(reply)

    async def Health(self, stream: Stream[pb.HealthRequest, pb.HealthReply]) -> None:
        await stream.recv_message()
        store = self.caches.store
        redis_ok = True if store is None else await store.ping()
        slots = [cache.builder.slots for cache in self.caches.values()]
        await stream.send_message(pb.HealthReply(
            status="SERVING", models=list(self.caches.models), redis_ok=redis_ok,
            cold_compiles=sum(s.in_use for s in slots), cold_waiting=sum(s.waiting for s in slots)))


def create_server(caches: ModelCaches) -> Server:
    """A grpclib Server (not started) for the grammar service over `caches`."""
    return Server([GrammarService(caches)], status_details_codec=ErrorStatusCodec())


def resolve_models(models: Sequence[str] | Mapping[str, TokenDomain]) -> dict[str, TokenDomain]:
    """Model names (built-in frontends) or a mapping name -> TokenDomain, as a mapping."""
    if isinstance(models, Mapping):
        return dict(models)
    if isinstance(models, str) or not models:
        raise ValueError("models must be a non-empty list of model names")
    return {name: get_domain(name) for name in models}


async def serve(*, host: str = "127.0.0.1", port: int = DEFAULT_PORT, redis_url: str | None = None,
                cache_bytes: int = DEFAULT_CACHE_BYTES,
                models: Sequence[str] | Mapping[str, TokenDomain] = ("smollm2",),
                metrics_port: int = 0, config: CacheConfig | None = None) -> None:
    """Run the grammar service until the first SIGTERM/SIGINT (the second exits at once).

    `redis_url` None keeps records in process only; `cache_bytes` bounds the L1 and the Redis
    store (default 256 MiB each); `metrics_port` > 0 serves Prometheus /metrics; `config`
    (default: process isolation, the default limits) sets the compile limits and the store
    policy. On the first signal the server stops taking calls and compiles in flight are killed:
    stopping never waits for a runaway compile. Raises InvalidRequest for an unknown model."""
    domains = resolve_models(models)
    metrics = GrammarMetrics()
    serve_metrics(metrics_port, metrics.registry, host)
    config = config or CacheConfig(cache_bytes=cache_bytes, isolation="process")
    caches = ModelCaches.open(domains, redis_url=redis_url, metrics=metrics, config=config,
                              cache_type=RecordCache)
    server = create_server(caches)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)

    def on_signal(signum: int) -> None:
        if stopping.is_set():
            raise SystemExit(128 + signum)
        log.info("grammar_service_stopping", signal=signal.Signals(signum).name)
        stopping.set()

    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)
    warm = [loop.create_task(cache.builder.warm()) for cache in caches.values()]
    try:
        await server.start(host, port)
        log.info("grammar_service_started", host=host, port=port, models=list(domains),
                 redis=bool(redis_url), isolation=config.isolation,
                 deadline_s=config.limits.deadline_s, memory_bytes=config.limits.memory_bytes)
        await stopping.wait()
        server.close()
        await caches.shutdown()  # kills compile children: handlers waiting on them end now
        await server.wait_closed()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        for task in warm:
            task.cancel()
        await asyncio.gather(*warm, return_exceptions=True)
        await caches.aclose()
    log.info("grammar_service_stopped")
