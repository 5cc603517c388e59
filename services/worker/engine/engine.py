"""The Engine: request lifecycle and continuous batching of the worker.

Two sides, one boundary:

- `submit` runs on the caller's event loop: `prepare` (prepare.py) checks the options, renders the
  prompt, compiles the constraint through the GrammarClient and builds the OutputSession, off the
  worker thread and never blocking the loop; only then does the request join the worker's inbox.
  Request errors raise from `submit`, before any event.
- One worker thread runs `step()` in a loop and does all torch work. It never waits on the event
  loop: events go out through each request's thread-safe sink, requests and cancels come in through
  a `queue.Queue`.

One step (`step`):

    retire cancelled / expired -> advance the pipeline (chain onto the held decode step, or
    commit it: pipeline.py) -> admit waiting into free lanes (a thinking budget already spent
    forces its close) -> batch = schedule() -> draft (the proposer, services/worker/spec)
    -> run the Program's step -> hold (the pipeline) or commit (postprocess.py)

where the commit path (postprocess.py) previews every row, commits the Program's device state,
confirms the sessions and ledgers, and only then publishes. Published events are delivered to the
event loop in one batch: on CUDA once the next step's forward is launched (or before the worker
idles), so the loop's share of the host tail overlaps the device; on the CPU at the end of the step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time

from services.grammar.client import GrammarClient
from services.worker.engine.admission import Admission, check_serving
from services.worker.engine.config import EngineConfig
from services.worker.engine.health import (
    engine_health,
    refuse_while_unavailable,
    unavailable_boundary,
)
from services.worker.engine.pipeline import Pipeline
from services.worker.engine.postprocess import Postprocessor
from services.worker.engine.prepare import prepare
from services.worker.engine.scheduler import Scheduler
from services.worker.engine.stream import RequestStream
from services.worker.integrity import IntegrityError, check_membership, step_failure
from services.worker.program import PendingBatch, Program, StepBatch
from services.worker.program.warmup import WarmupReport, warm_up_logged
from services.worker.request import Request
from services.worker.spec import (
    SpecCounters,
    captures_graphs,
    check_backend,
    check_model,
    context_bytes_per_position,
    load_draft,
    make_proposer,
)
from shared.errors import DeadlineExceeded
from shared.generation import FinishReason, GenerateRequest, PromptInput, Started
from shared.logging import get_logger
from shared.metrics import WorkerMetrics

log = get_logger(__name__)

_STOP = object()  # inbox sentinel: leave the loop
_WAKE = object()  # inbox sentinel: look at the queues again (a cancel arrived)


class Engine:
    """Continuous batching over a fixed number of lanes (see the module docstring).

    `runtime`: the served model bundle. `grammar`: where constraints compile. Call `start()` before
    submitting and `stop()` at the end (unfinished requests finish as cancelled). Raises
    Unsupported(field="speculative" | "draft_model") for a speculative backend this build does
    not run or a draft model that does not fit, InvalidRequest(field="draft_model") for a draft
    directory that does not load."""

    def __init__(self, runtime, grammar: GrammarClient, config: EngineConfig = EngineConfig(),
                 metrics: WorkerMetrics | None = None) -> None:
        self.runtime = runtime
        self.grammar = grammar
        self.config = config
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        check_backend(config.speculative, config.draft_model, config.draft_vocab)
        check_model(config.speculative, runtime.model)
        self.speculation = SpecCounters()
        self.finish_listeners: list = []  # fn(request) on the worker thread as each one ends
        self._draft_wait_seen = 0.0  # Program.draft_wait_seconds already in the metrics
        self.steps = 0
        self.build()
        self._inbox: queue.Queue = queue.Queue()
        self.admission = Admission(config.waiting_limit, self.metrics)  # the live requests
        self._thread: threading.Thread | None = None
        self.running = False
        self.unavailable: str | None = None  # an integrity failure, until the Program is rebuilt
        self.warmup: WarmupReport | None = None  # the start-up warm-up's report, once it ended
        self.warming = False  # health says "warming" (not ready) while it runs

    def build(self) -> None:
        """The Program and what holds it (at start, and to recover from an integrity failure)."""
        config, runtime = self.config, self.runtime
        # A DFlash draft loads first: its per-lane context cache is paid from the KV budget.
        draft = load_draft(config.speculative, config.draft_model, runtime)
        self.program = Program(runtime, max_batch=config.max_batch, max_len=config.max_len,
                               kv_budget_bytes=config.kv_budget_bytes,
                               max_drafts=config.num_draft_tokens if config.speculative else 0,
                               cuda_graphs=config.cuda_graphs
                               and captures_graphs(config.speculative),
                               prefix_cache=config.prefix_cache,
                               kv_cache_tokens=config.kv_cache_tokens,
                               logprobs_mode=config.logprobs_mode,
                               context_bytes_per_position=context_bytes_per_position(
                                   draft, runtime.dtype))
        # The speculative proposer (None: ordinary decoding), built once over the Program's state;
        # setting Engine.proposer to None later stops drafting (the Program's copy still aligns).
        self.proposer = make_proposer(config, runtime, self.program.state, draft)
        if self.proposer is not None:
            self.program.use(self.proposer)
        self.scheduler = Scheduler(config.prefill_chunk, config.preempt_after_s,
                                   on_admit=self.metrics.queue_seconds.observe)
        self.post = Postprocessor(self.program, self.scheduler, self.metrics, self._forget,
                                  self.speculation)
        want = config.pipeline if config.pipeline is not None else self.program.cuda
        self.pipeline = Pipeline(self.program, self.scheduler, self.post,
                                 enabled=bool(want) and self.proposer is None)

    # ---------------------------------------------------------------- caller side

    def start(self) -> None:
        if self._thread is not None:
            return
        self.running = True
        self.warming = self.config.warmup  # before the thread: health is never ok ahead of it
        self._thread = threading.Thread(target=self._run, name="infernix-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker thread; unfinished requests finish as cancelled."""
        self.running = False
        if self._thread is not None:
            self._inbox.put(_STOP)
            self._thread.join(timeout)
            self._thread = None

    async def submit(self, request: GenerateRequest) -> RequestStream:
        """Prepare `request` and queue it; returns its event stream, whose first event is
        `Started` with the prompt's token count.

        Raises (before any event) what `prepare` raises, InvalidRequest(field="request_id") for
        an id already running, Overloaded(resource="waiting_queue") when `max_waiting` requests
        already wait for a lane, ServiceUnavailable(service="worker") when the engine is not
        running."""
        submitted = time.monotonic()
        check_serving(self.running, self.unavailable)
        self.admission.admit(self.program.max_batch)  # from here it counts as live
        try:
            stream = RequestStream(asyncio.get_running_loop(), request.request_id)
            job = await prepare(request, runtime=self.runtime, grammar=self.grammar,
                                max_len=self.program.max_len, submitted=submitted, sink=stream)
            check_serving(self.running, self.unavailable)  # compilation may outlive the engine
            if job.expired(time.monotonic()):  # the seed: "after the library call returns and
                # before queueing, the deadline and Engine state are checked again"
                self.metrics.rejected.labels(reason="deadline").inc()
                raise DeadlineExceeded(f"the request did not finish within {job.timeout_s} s "
                                       "(its preparation took the time)", timeout_s=job.timeout_s)
            self.admission.register(job)
        finally:
            self.admission.prepared()
        job.enqueued_at = time.monotonic()  # an expired deadline is retired by the next step
        stream.push(Started(job.num_prompt_tokens))
        self._inbox.put(job)
        return stream

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request from any thread; False when it is not live."""
        job = self.admission.get(request_id)
        if job is None:
            return False
        job.cancel_requested = True
        self._inbox.put(_WAKE)
        return True

    def live_requests(self) -> list[str]:
        """Ids of the requests queued or running (any thread)."""
        return self.admission.ids()

    def count_tokens(self, prompt: PromptInput) -> int:
        """Prompt tokens after rendering (compiles nothing)."""
        return len(self.runtime.prepare(prompt).token_ids)

    def health(self) -> dict:
        """The worker's health report (health.py)."""
        return engine_health(self)

    def _forget(self, job: Request) -> None:
        self.admission.forget(job)
        for listener in self.finish_listeners:  # e.g. the benchmark's oracle recording
            listener(job)

    # ---------------------------------------------------------------- worker thread

    def step(self) -> bool:
        """One engine step on the worker thread; False when there was nothing to run."""
        self._retire(time.monotonic())
        if self.pipeline.advance():  # step n+1 chained onto the held step n, which committed
            self.steps += 1
            self._gauges()
            return True
        self._admit()
        if self.pipeline.holding and not self.scheduler.prefill_next():
            self.pipeline.commit_held()  # the next step reads what the held one produced
        batch = self.scheduler.schedule()
        if batch is None:
            self.post.flush()
            return False
        batch = self._draft(batch)
        pending = self._run_step(batch)
        if pending is not None:
            self.pipeline.hold_or_commit(pending)
        self._gauges()
        return True

    def _admit(self) -> None:
        """Waiting requests into free lanes (or preempting); a thinking budget of 0 is closed
        before any sample."""
        preempted = self.scheduler.admit(self.program)
        if preempted:
            self.metrics.preemptions.inc(preempted)
        blocks = self.program.blocks
        self.metrics.prefix_cache(blocks.stats, free_blocks=blocks.free_blocks,
                                  cached_blocks=blocks.cached_blocks)
        held = self.pipeline.held_requests()  # a step behind: their commit forces any close
        for job in list(self.scheduler.resident):
            if id(job) not in held and job.thinking_due:
                self.post.force_close(job)

    def _draft(self, batch: StepBatch) -> StepBatch:
        """The proposer's drafts (or, on the device route, draft limits) for a decode batch,
        before the verify forward; the time the rows waited for them is exposed."""
        if self.proposer is None or not batch.is_decode:
            return batch
        start = time.perf_counter()
        batch = self.proposer.attach(batch, self.program.max_len)
        seconds = time.perf_counter() - start
        self.speculation.draft_seconds += seconds
        self.metrics.spec_draft_wait_seconds.inc(seconds)
        for row in batch.rows:
            row.request.session.counters.add_draft_wait(seconds)
        return batch

    def _run_step(self, batch: StepBatch) -> PendingBatch | None:
        """The Program's step. The previous step's events go out once this step's forward is
        launched (on CUDA the device is busy then), after a verify round otherwise. A step that
        fails as a whole fails its rows and commits nothing: None."""
        self.steps += 1
        if batch.is_decode or batch.has_drafts:
            self.pipeline.commit_held()  # held only for a prefill step to launch first
        if self.pipeline.holding:
            assert not self.pipeline.held_requests() & {id(r.request) for r in batch.rows}, \
                "a prefill step overlapping the held commit feeds other requests only"
        try:
            check_membership(batch, self.scheduler.resident)
            if batch.has_drafts:
                pending = self.program.step(batch)
                self.post.flush()
            else:
                try:
                    launched = self.program.launch(batch)
                except BaseException:
                    self.pipeline.commit_held()
                    raise
                # a held decode step commits while the prefill runs (pipeline.py)
                self.pipeline.commit_held(overlapped=True)
                self.post.flush()
                pending = self.program.finish(launched)
        except IntegrityError:
            raise  # the unavailable boundary (_run)
        except Exception as exc:
            log.exception("program_step_failed")
            self.post.fail_batch(batch, step_failure(exc))
            self.post.flush()
            return None
        return pending

    def _gauges(self) -> None:
        self.metrics.lanes_in_use.set(len(self.scheduler.resident))
        self.metrics.queue_depth.set(len(self.scheduler.waiting))
        waited = self.program.draft_wait_seconds  # a draft model's waits, counted by the Program
        if waited > self._draft_wait_seen:
            self.metrics.spec_draft_wait_seconds.inc(waited - self._draft_wait_seen)
            self._draft_wait_seen = waited

    def _retire(self, now: float) -> None:
        for job in self.scheduler.live():
            if job.cancel_requested:
                self.post.finish(job, FinishReason.CANCELLED)
            elif job.expired(now):
                self.post.finish(job, FinishReason.ERROR, DeadlineExceeded(
                    f"the request did not finish within {job.timeout_s} s",
                    timeout_s=job.timeout_s))

    def _warm_up(self) -> None:
        """The start-up warm-up on the worker thread, before the first step; requests submitted
        meanwhile wait in the inbox (program/warmup.py)."""
        if self.warming:
            try:
                self.warmup = warm_up_logged(self.program, self.config.prefill_chunk, self.metrics)
            finally:
                self.warming = False

    def _run(self) -> None:
        try:
            self._warm_up()
            while self._take_inbox(block=self.scheduler.idle):
                if self.unavailable is not None:  # its rebuild failed: nothing runs
                    refuse_while_unavailable(self)
                    continue
                try:
                    self.step()
                except IntegrityError as exc:
                    unavailable_boundary(self, exc)
                except Exception as exc:  # a bug, or the device failing outside the Program
                    log.exception("engine_step_failed")  # step (it reports at the next wait)
                    self.pipeline.drop()
                    try:
                        error = step_failure(exc, "engine failure")
                    except IntegrityError as lost:  # the device's state is unknown
                        unavailable_boundary(self, lost)
                        continue
                    for job in list(self.scheduler.resident):  # fail what is resident, serve on
                        self.post.finish(job, FinishReason.ERROR, error)
                    self.post.flush()
        finally:
            self.running = False
            self._take_inbox(block=False)
            try:  # the held step is published before the rest is cancelled
                self.pipeline.drain()
            except Exception:
                log.exception("engine_step_failed")
            for job in self.scheduler.live():
                self.post.finish(job, FinishReason.CANCELLED)
            self.post.flush()
            self.program.close()

    def _take_inbox(self, *, block: bool) -> bool:
        """Move new requests into the waiting queue; False when asked to stop. Held events are
        delivered before the worker blocks."""
        if block:
            self.post.flush()
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is _STOP:
                    return False
                if isinstance(item, Request):
                    self.scheduler.add(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

