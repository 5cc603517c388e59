"""One worker generation seen from the gateway: its event stream, timings and cancellation, and
the `request_done` record (log line and metrics) that every generation request ends with."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from services.gateway.cut_calls import CallTracker
from services.gateway.metrics import GatewayMetrics
from shared.errors import InternalError
from shared.generation import (
    Finished,
    GenerateRequest,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    TokenLogprobs,
    ToolCallArgumentsDelta,
    ToolCallStart,
    WorkerClient,
)
from shared.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class PromptCounts:
    """What the worker's first event, `Started(prompt_tokens, cached_tokens)`, says about the
    prompt. Absent (None) when the worker sends no such event."""

    prompt_tokens: int = 0
    cached_tokens: int = 0


def prompt_counts(event: Any) -> PromptCounts | None:
    """The counts of a `Started` event, None for any other event. Matched by the type's name so
    that the gateway also reads a worker whose events carry no `shared.generation.Started`."""
    if type(event).__name__ != "Started":
        return None
    return PromptCounts(int(getattr(event, "prompt_tokens", 0) or 0),
                        int(getattr(event, "cached_tokens", 0) or 0))


class Generation:
    """Drives `worker.generate(request)`. `start()` waits for the first event, so that typed
    request errors raised before generation surface before any response byte is sent."""

    def __init__(self, worker: WorkerClient, request: GenerateRequest) -> None:
        self.worker = worker
        self.request = request
        self.finished: Finished | None = None
        self.first_output_at: float | None = None
        self.counts: PromptCounts | None = None  # from the worker's Started event, if any
        self._stream: Any = None
        self._first: GenerationEvent | None = None
        self._refused = False  # generate raised before its first event: nothing to cancel
        self._calls = CallTracker()
        self._logprobs: list[TokenLogprob] = []  # every TokenLogprobs entry so far, for Finished

    async def start(self) -> None:
        """Submit and wait for the first event (raises what `generate` raises)."""
        self._stream = self.worker.generate(self.request).__aiter__()
        try:
            self._first = await self._stream.__anext__()
        except StopAsyncIteration:
            self._refused = True
            raise InternalError("the worker ended the stream without a Finished event") from None
        except Exception:
            self._refused = True
            raise
        self.counts = prompt_counts(self._first)

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """The events up to and including Finished (a Started event is read into `counts`, not
        yielded; a call the token limit cut is added to Finished's calls, as a CutCall, since its
        events have been yielded; the TokenLogprobs entries are gathered into Finished's
        `logprobs` when the request asked for them); raises InternalError if the stream ends
        early, and whatever the worker raises if it fails mid-stream."""
        assert self._first is not None, "start() first"
        event: GenerationEvent | None = self._first
        while event is not None:
            counts = prompt_counts(event)
            if counts is not None:
                self.counts = counts
                event = await self._next()
                continue
            if isinstance(event, (TextDelta, ReasoningDelta, ToolCallStart,
                                  ToolCallArgumentsDelta)):
                if self.first_output_at is None:
                    self.first_output_at = time.perf_counter()
                self._calls.see(event)
            if isinstance(event, TokenLogprobs):
                self._logprobs.extend(event.tokens)
            if isinstance(event, Finished):
                event = self._calls.complete(event)
                if self.request.options.logprobs is not None:
                    event = dataclasses.replace(event, logprobs=tuple(self._logprobs))
                self.finished = event
                yield event
                return
            yield event
            event = await self._next()

    async def _next(self) -> GenerationEvent:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            raise InternalError("the worker ended the stream without a Finished event") from None

    async def collect(self) -> Finished:
        """Consume every event and return Finished (aggregate responses use its content)."""
        async for event in self.events():
            if isinstance(event, Finished):
                return event
        raise InternalError("unreachable: events() ends with Finished or raises")

    async def close(self) -> None:
        """Release the stream; cancel the request at the worker if it has not finished."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        # Also when start() was interrupted (a client gone while the prompt was prefilled): the
        # worker may hold the request already; cancelling an unknown id is a no-op.
        if self.finished is None and not self._refused:
            try:
                await asyncio.shield(self.worker.cancel(self.request.request_id))
            except Exception:  # noqa: BLE001 - a failed cancel must not hide the original outcome
                log.warning("worker_cancel_failed", request_id=self.request.request_id,
                            exc_info=True)
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:  # noqa: BLE001
                log.warning("worker_stream_close_failed", request_id=self.request.request_id,
                            exc_info=True)


def constraint_label(request: GenerateRequest | None) -> str:
    """The fixed-enum constraint label of a request."""
    if request is None:
        return "none"
    if request.options.constraint is not None:
        return request.options.constraint.kind.value
    return "tools" if request.prompt.tools else "none"


@dataclass
class RequestRecord:
    """What one generation request did, for the `request_done` log line and the metrics.
    Holds ids, counts, timings and the constraint report; never prompt, schema or output text."""

    request_id: str
    protocol: str
    started_at: float = field(default_factory=time.perf_counter)
    model: str | None = None
    stream: bool = False
    status: int = 200
    outcome: str = "error"
    constraint_kind: str = "none"
    error_type: str | None = None
    error_param: str | None = None
    finished: Finished | None = None
    first_output_at: float | None = None

    def done(self, metrics: GatewayMetrics) -> None:
        """Emit `request_done` and settle the metrics (call exactly once)."""
        total = time.perf_counter() - self.started_at
        ttft = None if self.first_output_at is None else self.first_output_at - self.started_at
        fin = self.finished
        metrics.count(self.protocol, self.outcome, self.constraint_kind)
        metrics.request_seconds.labels(protocol=self.protocol).observe(total)
        if ttft is not None:
            metrics.ttft_seconds.labels(protocol=self.protocol).observe(ttft)
        if fin is not None:
            metrics.tokens.labels(protocol=self.protocol, kind="prompt").inc(
                fin.usage.prompt_tokens
            )
            metrics.tokens.labels(protocol=self.protocol, kind="completion").inc(
                fin.usage.completion_tokens)
        log.info(
            "request_done",
            request_id=self.request_id,
            protocol=self.protocol,
            model=self.model,
            stream=self.stream,
            status=self.status,
            outcome=self.outcome,
            constraint_kind=self.constraint_kind,
            finish_reason=None if fin is None else fin.finish_reason.value,
            prompt_tokens=None if fin is None else fin.usage.prompt_tokens,
            completion_tokens=None if fin is None else fin.usage.completion_tokens,
            tool_calls=None if fin is None else len(fin.tool_calls),
            total_s=round(total, 6),
            ttft_s=None if ttft is None else round(ttft, 6),
            worker_timings=None if fin is None else dict(fin.timings),
            constraint=None if fin is None else fin.constraint,
            error_type=self.error_type,
            error_param=self.error_param,
        )
