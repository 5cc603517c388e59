"""The worker gRPC service (grpclib): any `WorkerClient` served over the network.

`Generate` streams the wrapped worker's events. A typed error raised before the first event ends
the call with a status whose details carry the error (`shared.proto.errors`), so the remote caller
re-raises the same type; a failure after the first event is sent as `Finished(ERROR)`. When the
caller goes away mid-stream (the call reset, the connection lost) the request is cancelled on the
wrapped worker. Once the server is closing (draining), new calls and health checks answer
UNAVAILABLE, so a gateway's pool moves to another worker, while the streams in flight finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from shared.errors import InfernixError, InternalError
from shared.generation import Finished, FinishReason, Usage, WorkerClient
from shared.logging import get_logger
from shared.proto import worker_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, grpc_error
from shared.proto.generation_codec import (
    event_to_proto,
    prompt_from_proto,
    request_from_proto,
)
from shared.proto.worker_grpc import WorkerBase

log = get_logger(__name__)

DEFAULT_PORT = 50052


def _unavailable() -> GRPCError:
    return GRPCError(Status.UNAVAILABLE, "the worker is shutting down")


def _internal(exc: BaseException, what: str) -> InternalError:
    return (
        exc
        if isinstance(exc, InternalError)
        else InternalError(f"{what}: {type(exc).__name__}: {exc}")
    )


class WorkerService(WorkerBase):
    """The Worker RPCs over `worker`; `closing` (set by the server's close) refuses new work."""

    def __init__(self, worker: WorkerClient) -> None:
        self.worker = worker
        self.closing = False

    async def Generate(self, stream: Stream[pb.GenerateRequest, pb.GenerationEvent]) -> None:
        message = await stream.recv_message()
        assert message is not None
        if self.closing:
            raise _unavailable()
        try:
            request = request_from_proto(message)
        except InfernixError as exc:
            raise grpc_error(exc) from None
        events = self.worker.generate(request).__aiter__()
        started = finished = False
        try:
            while not finished:
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    error = InternalError("the worker ended the stream without a Finished event")
                    if not started:
                        raise grpc_error(error) from None
                    event = Finished(FinishReason.ERROR, Usage(), error=error.to_dict())
                except InfernixError as exc:
                    if not started:
                        if exc.fault != "request":
                            log.error("worker_generate_failed", request_id=request.request_id,
                                      error=exc.type_name)
                        raise grpc_error(exc) from None
                    event = Finished(FinishReason.ERROR, Usage(), error=exc.to_dict())
                except Exception as exc:  # a bug or a dead backend: logged, reported as internal
                    log.exception("worker_generate_crashed", request_id=request.request_id)
                    error = _internal(exc, "the worker failed")
                    if not started:
                        raise grpc_error(error) from None
                    event = Finished(FinishReason.ERROR, Usage(), error=error.to_dict())
                started = True
                finished = isinstance(event, Finished)
                await stream.send_message(event_to_proto(event))
        except asyncio.CancelledError:
            # The caller reset the call or went away, or this server is closing.
            if self.closing:
                with contextlib.suppress(Exception):
                    await stream.send_trailing_metadata(
                        status=Status.UNAVAILABLE, status_message="the worker is shutting down"
                    )
            raise
        finally:
            if started and not finished:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.worker.cancel(request.request_id))
                log.info("worker_request_abandoned", request_id=request.request_id)
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def Cancel(self, stream: Stream[pb.CancelRequest, pb.CancelReply]) -> None:
        message = await stream.recv_message()
        assert message is not None
        await self._call(self.worker.cancel(message.request_id), "cancel")
        await stream.send_message(pb.CancelReply())

    async def CountTokens(self, stream: Stream[pb.CountTokensRequest, pb.CountTokensReply]) -> None:
        message = await stream.recv_message()
        assert message is not None
        if self.closing:
            raise _unavailable()
        try:
            prompt = prompt_from_proto(message.prompt)
        except InfernixError as exc:
            raise grpc_error(exc) from None
        count = await self._call(self.worker.count_tokens(prompt, message.model), "count_tokens")
        await stream.send_message(pb.CountTokensReply(tokens=count))

    async def Health(self, stream: Stream[pb.HealthRequest, pb.HealthReply]) -> None:
        await stream.recv_message()
        if self.closing:
            raise _unavailable()
        health = await self._call(self.worker.health(), "health")
        await stream.send_message(pb.HealthReply(health_json=json.dumps(health, default=str)))

    async def Models(self, stream: Stream[pb.ModelsRequest, pb.ModelsReply]) -> None:
        await stream.recv_message()
        models = await self._call(self.worker.models(), "models")
        await stream.send_message(pb.ModelsReply(models=list(models)))

    @staticmethod
    async def _call(awaitable: Any, what: str) -> Any:
        try:
            return await awaitable
        except InfernixError as exc:
            raise grpc_error(exc) from None
        except Exception as exc:
            log.exception("worker_call_failed", call=what)
            raise grpc_error(_internal(exc, f"worker {what} failed")) from None


class WorkerServer(Server):
    """A grpclib Server whose `close()` first marks the service closing (UNAVAILABLE answers)."""

    def __init__(self, service: WorkerService) -> None:
        super().__init__([service], status_details_codec=ErrorStatusCodec())
        self.service = service

    def close(self) -> None:
        self.service.closing = True
        super().close()


def create_server(worker: WorkerClient) -> WorkerServer:
    """A grpclib Server (not started) serving `worker` (any WorkerClient)."""
    return WorkerServer(WorkerService(worker))


async def serve(*, host: str = "127.0.0.1", port: int = DEFAULT_PORT, worker: WorkerClient,
                drain_seconds: float = 30.0) -> None:
    """Serve `worker` until SIGTERM/SIGINT. The first signal drains: new calls and health checks
    answer UNAVAILABLE at once (a gateway's pool routes elsewhere), the requests in flight finish
    within `drain_seconds` and the rest are cancelled with their terminal event, then the server
    closes. A second signal exits at once. The caller owns `worker`."""
    server = create_server(worker)
    await server.start(host, port)
    log.info("worker_service_started", host=host, port=port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            raise SystemExit(128 + signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await stop.wait()
        server.service.closing = True
        log.info("worker_draining", seconds=drain_seconds)
        await worker.drain(drain_seconds)
        server.close()
        await server.wait_closed()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("worker_service_stopped")
