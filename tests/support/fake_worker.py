"""A scripted in-process `WorkerClient` for gateway tests.

It records every request, then streams a script: a `Started` event with the prompt counts, text
deltas, tool calls (start + argument fragments) and one Finished whose content and calls are the
concatenation of what was streamed. It can instead raise a typed error before the first event,
end with Finished(ERROR), or die mid-stream after a given number of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import shared.generation
from shared.errors import InfernixError
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    GenerationEvent,
    PromptInput,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    Usage,
    WorkerClient,
)

HAS_STARTED = hasattr(shared.generation, "Started")
if HAS_STARTED:
    Started = shared.generation.Started
else:
    @dataclass(frozen=True)
    class Started:  # type: ignore[no-redef]
        """Stand-in for the worker's first event until shared/generation.py defines it (the
        lead adds it; the gateway matches it by name)."""

        prompt_tokens: int
        cached_tokens: int = 0


@dataclass(frozen=True)
class ScriptedCall:
    id: str
    name: str
    fragments: tuple[str, ...]  # argument fragments; their concatenation is the arguments JSON


@dataclass
class Script:
    text: tuple[str, ...] = ()
    reasoning: tuple[str, ...] = ()  # reasoning deltas, streamed before the text
    calls: tuple[ScriptedCall, ...] = ()
    finish_reason: FinishReason | None = None  # default: TOOL_CALLS with calls, else STOP
    usage: Usage = Usage(prompt_tokens=7, completion_tokens=5)
    constraint: dict[str, Any] | None = None
    stop_sequence: str | None = None
    # Begin with Started(usage.prompt_tokens, cached_tokens). Off by default while the stand-in is
    # used: the gRPC codec cannot carry it.
    started: bool = HAS_STARTED
    cached_tokens: int = 0
    texts: tuple[tuple[str, ...], ...] = ()  # per-request text scripts, cycled (n > 1 tests)
    raise_before: InfernixError | None = None  # raised from generate before the first event
    error: dict[str, Any] | None = None  # Finished(ERROR, error=...) after the streamed events
    die_after: int | None = None  # raise ConnectionError after this many events
    delay_s: float = 0.0  # pause before each event


class WorkerDied(ConnectionError):
    pass


@dataclass
class FakeWorker(WorkerClient):
    script: Script = field(default_factory=Script)
    served: tuple[str, ...] = ("smollm2",)
    requests: list[GenerateRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # ids whose Finished was yielded
    healthy: bool = True

    def reset(self, script: Script | None = None) -> None:
        """Forget recorded requests and cancellations; use `script` (default: a plain one)."""
        self.script = script or Script()
        self.requests.clear()
        self.cancelled.clear()
        self.finished.clear()
        self.healthy = True

    @property
    def last(self) -> GenerateRequest:
        return self.requests[-1]

    async def models(self) -> list[str]:
        return list(self.served)

    def _events(self, number: int) -> list[GenerationEvent]:
        s = self.script
        text = s.texts[number % len(s.texts)] if s.texts else s.text
        events: list[GenerationEvent] = [ReasoningDelta(t) for t in s.reasoning]
        events += [TextDelta(t) for t in text]
        for i, call in enumerate(s.calls):
            events.append(ToolCallStart(i, call.id, call.name))
            events += [ToolCallArgumentsDelta(i, frag) for frag in call.fragments]
        if s.error is not None:
            reason = FinishReason.ERROR
        else:
            reason = s.finish_reason or (FinishReason.TOOL_CALLS if s.calls else FinishReason.STOP)
        events.append(Finished(
            reason, s.usage, content="".join(text), reasoning="".join(s.reasoning),
            tool_calls=tuple(ToolCall(c.id, c.name, "".join(c.fragments)) for c in s.calls),
            constraint=s.constraint, error=s.error, timings={"prepare": 0.001, "ttft": 0.002},
            stop_sequence=s.stop_sequence))
        return events

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationEvent]:
        self.requests.append(request)
        number = len(self.requests) - 1  # before any await: concurrent requests append too
        if self.script.raise_before is not None:
            raise self.script.raise_before
        if self.script.started:
            yield Started(self.script.usage.prompt_tokens, self.script.cached_tokens)
        for n, event in enumerate(self._events(number)):
            if self.script.die_after is not None and n == self.script.die_after:
                raise WorkerDied("the worker process went away")
            if self.script.delay_s:
                await asyncio.sleep(self.script.delay_s)
            if isinstance(event, Finished):
                self.finished.append(request.request_id)
            yield event

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def count_tokens(self, prompt: PromptInput, model: str) -> int:
        return sum(len((m.content or "").split()) for m in prompt.messages or ())

    async def health(self) -> dict[str, Any]:
        if not self.healthy:
            raise ConnectionError("worker unreachable")
        return {"models": list(self.served)}


@contextlib.asynccontextmanager
async def running_gateway(worker: WorkerClient, **app_options: Any) -> AsyncIterator[str]:
    """A real gateway server on a free 127.0.0.1 port in this event loop; yields its base URL
    (`http://127.0.0.1:PORT`)."""
    from aiohttp import web

    from services.gateway import create_app
    from services.gateway.app import RUNNER_OPTIONS

    runner = web.AppRunner(create_app(worker, **app_options), shutdown_timeout=1.0,
                           **RUNNER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class GatewayThread:
    """A real gateway on a loopback port, served by its own event loop in a thread, so that
    synchronous code (hypothesis, the docs' SDK examples) can drive it."""

    def __init__(self, worker: FakeWorker, **app_options: Any) -> None:
        self.worker = worker
        self.app_options = app_options
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.url = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self.stop = asyncio.Event()
        async with running_gateway(self.worker, **self.app_options) as url:
            self.url = url
            self.ready.set()
            await self.stop.wait()

    def __enter__(self) -> "GatewayThread":
        self.thread.start()
        assert self.ready.wait(30), "the gateway did not start"
        host, port = self.url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.conn.close()
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
        self.loop.close()

    def post(self, route: str, data: bytes) -> tuple[int, bytes]:
        try:
            self.conn.request("POST", route, body=data, headers={
                "Content-Type": "application/json"})
            reply = self.conn.getresponse()
            return reply.status, reply.read()
        except (http.client.HTTPException, ConnectionError):
            self.conn.close()  # reconnect on the next request
            raise


class InProcessGateway(GatewayThread):
    """GatewayThread over a real in-process worker that `open_worker()` builds in the gateway's
    own loop (closed there too); use it as a context manager (`url` once entered)."""

    def __init__(self, open_worker: Callable[[], WorkerClient], **app_options: Any) -> None:
        super().__init__(None, **app_options)  # type: ignore[arg-type]
        self.open_worker = open_worker

    async def _serve(self) -> None:
        self.stop = asyncio.Event()
        self.worker = self.open_worker()
        try:
            async with running_gateway(self.worker, **self.app_options) as url:
                self.url = url
                self.ready.set()
                await self.stop.wait()
        finally:
            await self.worker.aclose()

    def __enter__(self) -> "InProcessGateway":
        self.thread.start()
        assert self.ready.wait(180), "the in-process worker did not start"
        host, port = self.url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        return self
