"""`GrpcWorkerClient`: the WorkerClient interface over a worker service's gRPC channel.

`generate` yields the same events the remote worker's own `generate` yields. Before the first
event, a typed error comes back as the same exception type, and a worker that cannot be reached
(refused connection, connection lost, UNAVAILABLE while it shuts down) raises `WorkerUnavailable`,
a `ConnectionError`, which a pool may retry elsewhere. After the first event, a lost connection
ends the stream with `Finished(ERROR)` carrying `ServiceUnavailable(service="worker")` (a
dependency failure, not a bug), so the gateway still sends the protocol's terminal error event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from shared.errors import InfernixError, InternalError, ServiceUnavailable
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    GenerationEvent,
    PromptInput,
    ReasoningDelta,
    TextDelta,
    Usage,
    WorkerClient,
)
from shared.proto import worker_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, typed_error
from shared.proto.generation_codec import (
    event_from_proto,
    prompt_to_proto,
    request_to_proto,
)
from shared.proto.worker_grpc import WorkerStub

# Failures of the transport rather than of the call: the worker is gone or going.
_TRANSPORT_ERRORS = (OSError, StreamTerminatedError, ProtocolError)


class WorkerUnavailable(ConnectionError):
    """The worker could not be reached, or was shutting down, before the request started."""


def _is_unavailable(exc: GRPCError) -> bool:
    return exc.status is Status.UNAVAILABLE and not exc.details


class GrpcWorkerClient(WorkerClient):
    """A WorkerClient for the worker service at `host:port`.

    `timeout_s` (default 10 s) bounds the unary calls (models, cancel, count_tokens, health);
    a generation has no transport deadline: the request's own `timeout_s` governs it."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 10.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._channel = Channel(host, port, status_details_codec=ErrorStatusCodec())
        self._stub = WorkerStub(self._channel)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"GrpcWorkerClient({self.address})"

    async def _unary(self, method: Any, message: Any) -> Any:
        try:
            return await method(message, timeout=self.timeout_s)
        except GRPCError as exc:
            if _is_unavailable(exc):
                raise WorkerUnavailable(f"worker {self.address} is unavailable: "
                                        f"{exc.message or 'no message'}") from None
            raise typed_error(exc) from None
        except _TRANSPORT_ERRORS as exc:
            raise WorkerUnavailable(f"worker {self.address} unreachable: "
                                    f"{type(exc).__name__}: {exc}") from None

    async def models(self) -> list[str]:
        """The models the worker serves. Raises WorkerUnavailable when it cannot be reached."""
        reply = await self._unary(self._stub.Models, pb.ModelsRequest())
        return list(reply.models)

    async def cancel(self, request_id: str) -> None:
        """Cancel a running request (no-op for an unknown id). Raises WorkerUnavailable."""
        await self._unary(self._stub.Cancel, pb.CancelRequest(request_id=request_id))

    async def count_tokens(self, prompt: PromptInput, model: str) -> int:
        """Prompt tokens as the worker renders them; raises its typed errors, WorkerUnavailable."""
        reply = await self._unary(
            self._stub.CountTokens,
            pb.CountTokensRequest(prompt=prompt_to_proto(prompt), model=model),
        )
        return reply.tokens

    async def health(self) -> dict[str, Any]:
        """The worker's health dictionary. Raises WorkerUnavailable when unreachable or closing."""
        reply = await self._unary(self._stub.Health, pb.HealthRequest())
        return json.loads(reply.health_json)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationEvent]:
        """The worker's events for `request`, ending with one Finished.

        Raises before the first event: the worker's typed RequestError (same type and fields),
        InvalidRequest for an integer option outside 64 bits, WorkerUnavailable when the worker
        cannot be reached. Closing the iteration early resets the call, which cancels the request
        on the worker."""
        message = request_to_proto(request)
        content: list[str] = []
        reasoning: list[str] = []
        started = False
        final: Finished | None = None
        try:
            async with self._stub.Generate.open() as stream:
                await stream.send_message(message, end=True)
                while final is None:
                    reply = await stream.recv_message()
                    if reply is None:  # the status first: a non-OK one raises GRPCError
                        await stream.recv_trailing_metadata()
                        raise InternalError("the worker ended the stream without a Finished event")
                    event = event_from_proto(reply)
                    started = True
                    if isinstance(event, Finished):
                        final = event
                        break
                    if isinstance(event, TextDelta):
                        content.append(event.text)
                    elif isinstance(event, ReasoningDelta):
                        reasoning.append(event.text)
                    yield event
                await stream.recv_message()  # the trailers, so that the call ends cleanly
        except GRPCError as exc:
            if final is None and not started:
                if _is_unavailable(exc):
                    raise WorkerUnavailable(f"worker {self.address} is unavailable: "
                                            f"{exc.message or 'no message'}") from None
                raise typed_error(exc) from None
            final = final or self._lost(request, content, reasoning,
                                        f"{exc.status.name}: {exc.message or ''}")
        except _TRANSPORT_ERRORS as exc:
            if final is None and not started:
                raise WorkerUnavailable(f"worker {self.address} unreachable: "
                                        f"{type(exc).__name__}: {exc}") from None
            final = final or self._lost(request, content, reasoning,
                                        f"{type(exc).__name__}: {exc}")
        except InfernixError as exc:
            if not started:
                raise
            final = Finished(FinishReason.ERROR, Usage(), content="".join(content),
                             reasoning="".join(reasoning), error=exc.to_dict())
        assert final is not None
        yield final

    def _lost(self, request: GenerateRequest, content: list[str], reasoning: list[str],
              why: str) -> Finished:
        error = ServiceUnavailable(f"worker connection lost mid-stream ({self.address}, request "
                                   f"{request.request_id}): {why}", service="worker",
                                   retry_after_s=1.0)
        return Finished(FinishReason.ERROR, Usage(), content="".join(content),
                        reasoning="".join(reasoning), error=error.to_dict())

    async def aclose(self) -> None:
        """Close the channel (in-flight calls fail)."""
        self._channel.close()
