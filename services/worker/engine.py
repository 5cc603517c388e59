"""The Engine: request lifecycle, continuous batching and the batch commit of the worker.

Two sides, one boundary:

- `submit` runs on the caller's event loop: it validates the options, prepares the prompt (render,
  tokenize), compiles the constraint through the GrammarClient (cold compiles happen here, off the
  worker thread, never blocking the loop), builds the request's OutputSession, and only then puts
  the request into the worker's inbox. Request errors raise from `submit`, before any event.
- One worker thread runs `step()` in a loop and does all torch work. It never waits on the event
  loop: events go out through each request's thread-safe sink, requests and cancels come in through
  a `queue.Queue`.

One step: retire cancelled / expired requests, admit waiting requests into free lanes, then

    batch = schedule()  ->  pending = program.step(batch)  ->  commit(pending)  ->  publish

where commit follows the design document's order for the whole batch: every row previews its
output through its OutputSession (fixing the accepted prefix), the Program commits those prefixes,
the sessions confirm, and only then are events published. A cancelled row commits nothing of the
round and frees its lane; a dead-end or non-finite row fails alone while the others commit.
Prefill is chunked (`prefill_chunk` prompt tokens per row and step) and alternates with decode
steps, so a long prompt joining never stalls the resident rows for more than one step at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass

from services.grammar.client import GrammarClient
from services.worker.prepare import (
    build_output_session, check_options, constraint_kind, tool_stream_for,
)
from services.worker.program import (
    BatchRow,
    PendingBatch,
    Program,
    RowOutcome,
    StepBatch,
)
from services.worker.request import Request, RequestState
from services.worker.runtime import resolve_sampling
from services.worker.stop_strings import StopStrings
from shared.errors import (
    DeadlineExceeded,
    InfernixError,
    InternalError,
    InvalidRequest,
)
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    GenerationEvent,
    PromptInput,
    TextDelta,
    Usage,
)
from shared.logging import get_logger
from shared.metrics import WorkerMetrics

log = get_logger(__name__)

_STOP = object()  # inbox sentinel: leave the loop
_WAKE = object()  # inbox sentinel: look at the queues again (a cancel arrived)


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 4  # resident lanes B, >= 1
    max_len: int | None = None  # positions per lane (prompt + output); None: from the KV budget
    kv_budget_bytes: int = 256 << 20  # KV cache bytes when max_len is None, > 0
    prefill_chunk: int = 512  # prompt tokens per row per prefill step, >= 1
    cuda_graphs: bool = True  # capture decode graphs per batch size on CUDA

    def __post_init__(self) -> None:
        for name in ("max_batch", "kv_budget_bytes", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"EngineConfig.max_len must be >= 2, got {self.max_len}")


class RequestStream:
    """The events of one request as an async iterator; fed from the worker thread through
    `loop.call_soon_threadsafe`. Ends after the `Finished` event."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        self._loop = loop
        self._queue: asyncio.Queue[GenerationEvent] = asyncio.Queue()

    def push(self, event: GenerationEvent) -> None:
        """Thread-safe; raises RuntimeError when the consumer's loop is closed."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self.finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        if isinstance(event, Finished):
            self.finished = True
        return event


class Engine:
    """Continuous batching over a fixed number of lanes (see the module docstring).

    `runtime`: the served model bundle. `grammar`: where constraints compile. Call `start()` before
    submitting and `stop()` at the end (unfinished requests finish as cancelled)."""

    def __init__(self, runtime, grammar: GrammarClient, config: EngineConfig = EngineConfig(),
                 metrics: WorkerMetrics | None = None) -> None:
        self.runtime = runtime
        self.grammar = grammar
        self.config = config
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.program = Program(runtime, max_batch=config.max_batch, max_len=config.max_len,
                               kv_budget_bytes=config.kv_budget_bytes,
                               cuda_graphs=config.cuda_graphs)
        self.steps = 0
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: deque[Request] = deque()
        self._resident: list[Request] = []
        self._live: dict[str, Request] = {}
        self._lock = threading.Lock()  # guards _live across threads
        self._thread: threading.Thread | None = None
        self._running = False
        self._last_was_prefill = False

    # ---------------------------------------------------------------- caller side

    def start(self) -> None:
        if self._thread is not None:
            return
        self._running = True
        self._thread = threading.Thread(target=self._run, name="infernix-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker thread; unfinished requests finish as cancelled."""
        self._running = False
        if self._thread is not None:
            self._inbox.put(_STOP)
            self._thread.join(timeout)
            self._thread = None

    async def submit(self, request: GenerateRequest) -> RequestStream:
        """Prepare `request` and queue it; returns its event stream.

        Raises (before any event) the typed RequestError of a bad request: InvalidRequest (model,
        prompt, request_id, stop_token_ids), ConflictingConstraint (`stop` / `stop_token_ids` with
        a constraint), Unsupported (tools with a raw text prompt), the grammar service's InvalidSchema /
        InvalidGrammar / ..., ConstraintDeadEnd (nothing legal at the first position);
        InternalError when the engine is not running."""
        submitted = time.monotonic()
        options = request.options
        deadline = submitted + options.timeout_s if options.timeout_s else None
        if request.model != self.runtime.name:
            raise InvalidRequest(f"model {request.model!r} is not served here; expected "
                                 f"{self.runtime.name!r}", field="model")
        self._check_running()
        tool_spec = check_options(request, self.runtime.domain)
        prepared = await asyncio.to_thread(self.runtime.prepare, request.prompt)
        room = self.program.max_len - len(prepared.token_ids) + 1
        if room < 1:
            raise InvalidRequest(f"the prompt has {len(prepared.token_ids)} tokens; a lane holds "
                                 f"{self.program.max_len}", field="prompt")
        budget = min(options.max_tokens or room, room)
        session = await build_output_session(request, prepared, budget, tool_spec,
                                             runtime=self.runtime, grammar=self.grammar)
        stream = RequestStream(asyncio.get_running_loop(), request.request_id)
        constrained = session.constrained
        job = Request(
            request_id=request.request_id, prompt_ids=prepared.token_ids,
            sampling=resolve_sampling(options.sampling, self.runtime.defaults, constrained),
            seed=options.sampling.seed if options.sampling.seed is not None else secrets.randbits(63),
            session=session, sink=stream.push, max_new_tokens=budget,
            stop=StopStrings(options.stop) if options.stop else None,
            stop_token_ids=frozenset(options.stop_token_ids), deadline=deadline,
            timeout_s=options.timeout_s, submitted_at=submitted,
            tool_stream=tool_stream_for(request, tool_spec),
            constraint_kind=constraint_kind(request, tool_spec))
        self._check_running()  # compilation may have outlived the engine
        with self._lock:
            if request.request_id in self._live:
                raise InvalidRequest(f"request id {request.request_id!r} is already running",
                                     field="request_id")
            self._live[request.request_id] = job
        job.enqueued_at = time.monotonic()  # an expired deadline is retired by the next step
        self._inbox.put(job)
        return stream

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request from any thread; False when it is not live."""
        with self._lock:
            job = self._live.get(request_id)
        if job is None:
            return False
        job.cancel_requested = True
        self._inbox.put(_WAKE)
        return True

    def count_tokens(self, prompt: PromptInput) -> int:
        """Prompt tokens after rendering (compiles nothing)."""
        return len(self.runtime.prepare(prompt).token_ids)

    def health(self) -> dict:
        return {"status": "ok" if self._running else "stopped", "model": self.runtime.name,
                "device": str(self.program.device), "max_batch": self.program.max_batch,
                "max_len": self.program.max_len, "resident": len(self._resident),
                "waiting": len(self._waiting), "steps": self.steps}

    def _check_running(self) -> None:
        if not self._running:
            raise InternalError("the engine is not running")

    # ---------------------------------------------------------------- worker thread

    def _run(self) -> None:
        try:
            while self._take_inbox(block=not (self._waiting or self._resident)):
                try:
                    self.step()
                except Exception as exc:  # a bug: fail what is resident, keep serving
                    log.exception("engine_step_failed")
                    for job in list(self._resident):
                        self._finish(job, FinishReason.ERROR, InternalError(f"engine failure: {exc}"))
        finally:
            self._running = False
            self._take_inbox(block=False)
            for job in list(self._waiting) + list(self._resident):
                self._finish(job, FinishReason.CANCELLED)
            self.program.close()

    def _take_inbox(self, *, block: bool) -> bool:
        """Move new requests into the waiting queue; False when asked to stop."""
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is _STOP:
                    return False
                if isinstance(item, Request):
                    self._waiting.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def step(self) -> bool:
        """One engine step on the worker thread; False when there was nothing to run."""
        self._retire(time.monotonic())
        self._admit()
        batch = self._schedule()
        if batch is None:
            return False
        self.steps += 1
        try:
            pending = self.program.step(batch)
        except Exception as exc:  # the round failed as a whole: its rows fail, nothing commits
            log.exception("program_step_failed")
            for row in batch.rows:
                self._finish(row.request, FinishReason.ERROR,
                             InternalError(f"the batch step failed: {exc}"))
            return True
        self._commit(pending)
        self.metrics.lanes_in_use.set(len(self._resident))
        self.metrics.queue_depth.set(len(self._waiting))
        return True

    def _retire(self, now: float) -> None:
        for job in list(self._waiting) + list(self._resident):
            if job.cancel_requested:
                self._finish(job, FinishReason.CANCELLED)
            elif job.expired(now):
                self._finish(job, FinishReason.ERROR, DeadlineExceeded(
                    f"the request did not finish within {job.timeout_s} s",
                    timeout_s=job.timeout_s))

    def _admit(self) -> None:
        while self._waiting and self.program.free_lanes:
            job = self._waiting.popleft()
            job.lane = self.program.acquire_lane()
            job.state = RequestState.RESIDENT
            job.admitted_at = time.monotonic()
            job.num_cached = 0
            self._resident.append(job)

    def _schedule(self) -> StepBatch | None:
        prefill = [j for j in self._resident if j.in_prefill]
        decode = [j for j in self._resident if not j.in_prefill]
        if prefill and (not decode or not self._last_was_prefill):
            self._last_was_prefill = True
            rows = []
            for j in prefill:
                chunk = tuple(j.next_input(self.config.prefill_chunk))
                rows.append(BatchRow(j, chunk, j.num_cached,
                                     sample=j.num_cached + len(chunk) == j.num_prompt_tokens))
            return StepBatch(tuple(rows))
        if decode:
            self._last_was_prefill = False
            return StepBatch(tuple(BatchRow(j, (j.output_ids[-1],), j.num_cached, True)
                                   for j in decode))
        return None

    def _commit(self, pending: PendingBatch) -> None:
        rows, results = pending.batch.rows, pending.results
        accepted: dict[int, list[int]] = {}
        previews: dict[int, tuple] = {}
        failures: dict[int, InfernixError] = {}
        for i, (row, res) in enumerate(zip(rows, results)):
            job = row.request
            if job.cancel_requested:
                continue  # commits nothing of this round
            if res.outcome is RowOutcome.NO_OUTPUT:
                accepted[i] = []
            elif res.outcome is not RowOutcome.TOKENS:
                failures[i] = res.error or InternalError("row failed")
            else:
                tokens = list(res.tokens)
                cut = next((k for k, t in enumerate(tokens) if t in job.stop_token_ids), None)
                preview = job.session.preview(tokens if cut is None else tokens[:cut])
                if preview.failure is not None:
                    failures[i] = preview.failure
                    continue
                stop_id = cut is not None and preview.accepted == cut
                accepted[i] = tokens[:preview.accepted + (1 if stop_id else 0)]
                previews[i] = (preview, stop_id)
        try:
            self.program.commit(pending, accepted)
        except Exception as exc:  # nothing confirmed, nothing published
            log.exception("program_commit_failed")
            for i in previews:
                rows[i].request.session.discard()
            for row in rows:
                self._finish(row.request, FinishReason.ERROR, InternalError(f"commit failed: {exc}"))
            return
        for i in previews:
            rows[i].request.session.confirm()
        self._publish(rows, previews, failures)

    def _publish(self, rows: tuple[BatchRow, ...], previews: dict[int, tuple],
                 failures: dict[int, InfernixError]) -> None:
        now = time.monotonic()
        for i, row in enumerate(rows):
            job = row.request
            if job.cancel_requested:
                self._finish(job, FinishReason.CANCELLED)
            elif i in failures:
                self._finish(job, FinishReason.ERROR, failures[i])
            elif i in previews:
                preview, stop_id = previews[i]
                if job.first_token_at is None:
                    job.first_token_at = now
                self._emit_text(job, preview.text)
                if preview.terminated or stop_id or (job.stop is not None and job.stop.stopped):
                    self._finish(job, FinishReason.STOP)
                elif preview.length_cut:
                    self._finish(job, FinishReason.LENGTH)

    def _emit_text(self, job: Request, text: str) -> None:
        if job.stop is not None:
            text = job.stop.feed(text)
        if not text:
            return
        if job.tool_stream is None:
            job.published.append(text)
            self._send(job, TextDelta(text))
            return
        self._send_tool_events(job, job.tool_stream.feed(text))

    def _send_tool_events(self, job: Request, events: list) -> None:
        for event in events:
            if isinstance(event, TextDelta):
                job.published.append(event.text)
            self._send(job, event)

    def _send(self, job: Request, event: GenerationEvent) -> None:
        try:
            job.sink(event)
        except Exception:  # the consumer is gone (closed loop): stop generating for it
            job.cancel_requested = True

    def _finish(self, job: Request, reason: FinishReason, error: InfernixError | None = None) -> None:
        if job.is_terminal:
            return
        session = job.session
        if not session.finished:
            self._emit_text(job, session.finish_incomplete())
        if job.stop is not None:
            tail = job.stop.flush()
            if tail:
                job.published.append(tail)
                self._send(job, TextDelta(tail))
        calls: tuple = ()
        if job.tool_stream is not None:
            try:
                self._send_tool_events(job, job.tool_stream.finish(complete=session.ended_normally))
            except InternalError as exc:  # the grammar confirmed a call the decoder cannot read
                reason, error = FinishReason.ERROR, exc
            calls = job.tool_stream.tool_calls()
            if calls and reason is FinishReason.STOP:
                reason = FinishReason.TOOL_CALLS
        if job.lane is not None:
            self.program.release_lane(job.lane)
            job.lane = None
        if job in self._resident:
            self._resident.remove(job)
        elif job in self._waiting:
            self._waiting.remove(job)
        job.state = RequestState.TERMINAL
        with self._lock:
            self._live.pop(job.request_id, None)
        report = session.report()
        if report is not None and job.tool_stream is not None:
            report = dataclasses.replace(report, branch=job.tool_stream.branch)
        constraint = report.to_dict() if report is not None else None
        timings = self._timings(job)
        self._send(job, Finished(reason, Usage(job.num_prompt_tokens, job.num_output_tokens),
                                 content=job.content(), tool_calls=calls, constraint=constraint,
                                 error=error.to_dict() if error is not None else None,
                                 timings=timings))
        decode_tokens = job.num_output_tokens - 1
        self.metrics.finished(
            job.constraint_kind, reason.value, ttft=timings.get("ttft"),
            tpot=timings["decode"] / decode_tokens if "decode" in timings and decode_tokens > 0 else None,
            mask_seconds=report.mask_seconds + report.rollback_seconds if report is not None else 0.0,
            prompt_tokens=job.num_prompt_tokens, completion_tokens=job.num_output_tokens)
        log.info("request_done", request_id=job.request_id, finish_reason=reason.value,
                 prompt_tokens=job.num_prompt_tokens, completion_tokens=job.num_output_tokens,
                 error=error.type_name if error is not None else None, constraint=constraint)

    @staticmethod
    def _timings(job: Request) -> dict[str, float]:
        now = time.monotonic()
        out = {}
        if job.enqueued_at is not None:
            out["prepare"] = job.enqueued_at - job.submitted_at
            out["queue"] = (job.admitted_at or now) - job.enqueued_at
        if job.first_token_at is not None:
            out["ttft"] = job.first_token_at - job.submitted_at
            out["decode"] = now - job.first_token_at
        return out
