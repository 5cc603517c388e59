"""How a worker reaches the grammar service: in process (embedded mode) or over gRPC.

Both clients have one interface: `compile` returns the cache key and the compile statistics;
`get_compiled` returns the compiled grammar of a key from the worker's own in-process LRU, then
Redis, and as a last resort rebuilds it in process from the constraint this client compiled under
that key (Redis lost or the blob evicted: a request never fails for it).
"""

from __future__ import annotations

import dataclasses

import abc
from dataclasses import dataclass

import xgrammar as xgr
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from services.grammar.cache import CompileStats, ModelCaches

from services.grammar.service import constraint_to_request, stats_from_proto
from shared.contract import OutputConstraint
from shared.errors import InternalError
from shared.proto import grammar_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, typed_error
from shared.proto.grammar_grpc import GrammarStub


@dataclass(frozen=True)
class CompileResult:
    key: str
    stats: CompileStats


class GrammarClient(abc.ABC):
    """The worker's view of the grammar service."""

    @abc.abstractmethod
    async def compile(self, constraint: OutputConstraint, *, model: str,
                      framing: str | None = None) -> CompileResult:
        """Validate and compile `constraint` for `model` (or find it cached).

        Raises the typed RequestError of an invalid constraint or unknown model
        (InvalidRequest(field="model")), InternalError when the service fails."""

    @abc.abstractmethod
    async def get_compiled(self, key: str, model: str) -> xgr.CompiledGrammar:
        """The compiled grammar of a key `compile` returned. Raises InvalidRequest for a model
        not served, InternalError for a key this client never compiled and no cache holds."""

    async def close(self) -> None:
        """Release connections (the caches' Redis client included)."""


class InProcessGrammarClient(GrammarClient):
    """Calls the caches directly: embedded mode, one process, one cache per model."""

    def __init__(self, caches: ModelCaches) -> None:
        self.caches = caches

    async def compile(self, constraint: OutputConstraint, *, model: str,
                      framing: str | None = None) -> CompileResult:
        result = await self.caches[model].compile(constraint, framing=framing)
        return CompileResult(result.key, result.stats)

    async def get_compiled(self, key: str, model: str) -> xgr.CompiledGrammar:
        return await self.caches[model].get_compiled(key)

    async def close(self) -> None:
        await self.caches.aclose()


class GrpcGrammarClient(GrammarClient):
    """Compiles through the grammar service; reads grammars through the worker's own caches.

    `caches` should be opened with `CacheConfig(read_only=True)` on the same Redis as the service:
    they never write Redis, and the key the service returns must equal the key they compute
    (same vocabulary), which `compile` checks."""

    def __init__(self, host: str, port: int, caches: ModelCaches, *, timeout_s: float = 60.0) -> None:
        self.caches = caches
        self.timeout_s = timeout_s  # deadline of one Compile call
        self._channel = Channel(host, port, status_details_codec=ErrorStatusCodec())
        self._stub = GrammarStub(self._channel)

    async def compile(self, constraint: OutputConstraint, *, model: str,
                      framing: str | None = None) -> CompileResult:
        cache = self.caches[model]
        request = constraint_to_request(constraint, model=model, framing=framing)
        try:
            reply = await self._stub.Compile(request, timeout=self.timeout_s)
        except GRPCError as exc:
            raise typed_error(exc) from None
        except (OSError, StreamTerminatedError, TimeoutError) as exc:
            raise InternalError(f"grammar service unreachable: {type(exc).__name__}") from None
        if reply.key != cache.key(constraint, framing=framing):
            raise InternalError(f"the grammar service and this worker disagree on model {model!r}:"
                                " different vocabularies or converter versions")
        cache.remember(reply.key, constraint, framing)
        # The report describes how this request got its grammar here: from this worker's L1, from
        # Redis, or (rebuilt) neither; built/waited/compile_ms are the service's.
        grammar, found = await cache.lookup(reply.key)
        if grammar is None:
            await cache.get_compiled(reply.key)
        stats = dataclasses.replace(stats_from_proto(reply.stats), hit=found)
        return CompileResult(reply.key, stats)

    async def get_compiled(self, key: str, model: str) -> xgr.CompiledGrammar:
        return await self.caches[model].get_compiled(key)

    async def health(self) -> pb.HealthReply:
        """The service's Health reply."""
        return await self._stub.Health(pb.HealthRequest(), timeout=self.timeout_s)

    async def close(self) -> None:
        self._channel.close()
        await self.caches.aclose()
