"""The one commit path of a step, and how requests finish.

`commit(pending)` walks the PendingBatch's rows in the design document's order:

    preview every row  ->  Program commit (device state)  ->  per row: confirm (matcher,
    decoder, ledgers)  ->  publish  ->  finish it if it ended

Published events are held in an Outbox (stream.py) and delivered by `flush()`, one event-loop
wake-up for all of them: on CUDA the Engine flushes right after the next step's forward is
launched, so the event loop's work on them overlaps the device instead of the host tail, and
before the worker idles; on the CPU at the end of each step. Each stream's order is kept; the events
are published (confirmed) before they are held.

Failure rules (design document, section 5):
- a row whose request was cancelled commits nothing of the round and finishes as cancelled;
- a row whose result is a constraint dead end or non-finite logits, or whose matcher raised
  (filling its mask or accepting its tokens), commits zero tokens and finishes with its error,
  while the other rows commit (in a verification round too, however many drafts it verified);
- a verification row commits the model state of its anchor and accepted prefix only (`_kept`);
- when a preview fails (the matcher refuses a token its own mask allowed), every preview of the
  batch is restored and the round aborts: nothing commits, the failing row finishes with the
  internal error, the others run the same step again;
- a row whose publication fails (the tool decoder raises reading committed tokens) finishes
  with the typed error; the other rows publish as usual;
- when the Program commit fails, no matcher state is confirmed and nothing of the round is
  published; the device state is unknown, so it raises IntegrityError: the Engine's
  unavailable boundary fails every live request typed and rebuilds the Program.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.worker.engine.scheduler import Scheduler
from services.worker.engine.stream import Outbox
from services.worker.integrity import IntegrityError
from services.worker.output.preview import PreviewResult
from services.worker.program import PendingBatch, Program, RowOutcome, StepBatch
from services.worker.request import Request
from services.worker.spec.counters import SpecCounters
from shared.errors import InfernixError, InternalError
from shared.generation import Finished, FinishReason, TokenLogprobs, Usage
from shared.logging import get_logger
from shared.metrics import WorkerMetrics

log = get_logger(__name__)


class _Preview:
    """One row's preview. A slotted class, not a dataclass: one is made per row and step."""

    __slots__ = ("result", "tokens", "stop_id")

    def __init__(self, result: PreviewResult, tokens: Sequence[int], stop_id: bool) -> None:
        self.result = result
        self.tokens = tokens  # the accepted output tokens (a matched stop id included, last)
        self.stop_id = stop_id  # the output ended at one of the request's stop token ids


@dataclass
class _Round:
    """Per batch index: the previews and the failed rows of one round."""

    previews: dict[int, _Preview]
    failures: dict[int, InfernixError]
    kept: dict[int, int]  # the rows the Program commits: fed tokens whose model state it keeps
    aborted_by: int | None = None  # the row whose preview failed


class Postprocessor:
    """Commits steps and finishes requests. `on_terminal(job)` runs once per finished request
    (the Engine forgets it there)."""

    def __init__(self, program: Program, scheduler: Scheduler, metrics: WorkerMetrics,
                 on_terminal: Callable[[Request], None],
                 speculation: SpecCounters | None = None) -> None:
        self.program = program
        self.scheduler = scheduler
        self.metrics = metrics
        self._on_terminal = on_terminal
        self._outbox = Outbox()  # published events until the next flush()
        self.speculation = speculation if speculation is not None else SpecCounters()

    # ---------------------------------------------------------------- the commit path

    def commit(self, pending: PendingBatch) -> None:
        rows = pending.batch.rows
        round_ = self._preview(pending)
        if round_.aborted_by is not None:
            for preview_row in round_.previews:
                rows[preview_row].request.session.discard()
            i = round_.aborted_by
            self.finish(rows[i].request, FinishReason.ERROR, round_.failures[i])
            return
        failures, previews, kept = round_.failures, round_.previews, round_.kept
        try:
            self.program.commit(pending, kept)
        except Exception as exc:  # nothing confirmed, nothing published; the device state of
            log.exception("program_commit_failed")  # the rows is unknown: an integrity failure
            for i in round_.previews:
                rows[i].request.session.discard()
            raise IntegrityError(f"the Program commit failed: {type(exc).__name__}: {exc}") \
                from exc
        # One pass confirms each row and publishes it: a row's publication reads only its own
        # confirmed state, so this is the order "confirm -> publish" per request
        results = pending.results
        verified = [0, 0, 0]  # this step's verification rows: rounds, drafts, accepted drafts
        now = time.monotonic()
        for i, row in enumerate(rows):
            job = row.request
            n = kept.get(i)
            close = preview = None
            if n is not None:
                if job.held_close is not None:
                    close = job.take_appended(row.start + n)
                    if close:  # the lane holds the forced close now: confirmed before this
                        job.session.confirm_held()  # step's tokens
                        self.metrics.forced_closes.inc()
                preview = previews.get(i)
                if preview is None:
                    job.commit(row.start + n, [])
                else:
                    job.session.confirm()
                    result = results[i]
                    if result.mask_bytes:
                        job.session.counters.add_upload_bytes(result.mask_bytes)
                    if row.num_drafts:
                        self._count_verify(job, row, result, preview, verified)
                    job.commit(row.start + n, preview.tokens)
            if job.cancel_requested:
                self.finish(job, FinishReason.CANCELLED)
            elif i in failures:
                self.finish(job, FinishReason.ERROR, failures[i])
            elif close and not self._emit(job, list(close)):
                continue  # the forced close this step appended goes out before its tokens
            elif preview is not None:
                if job.first_token_at is None:
                    job.first_token_at = now
                if not self._emit(job, preview.tokens[:-1] if preview.stop_id else preview.tokens,
                                  results[i].logprobs):
                    continue  # its publication failed: that request alone ended with the error
                result, output = preview.result, job.output
                if result.terminated or preview.stop_id or \
                        (output.stop is not None and output.stopped):
                    self.finish(job, FinishReason.STOP)
                elif result.length_cut:
                    self.finish(job, FinishReason.LENGTH)
                elif job.thinking_budget is not None and job.thinking_due:
                    self.force_close(job)
        if verified[0]:  # the metrics once per step
            rounds, drafts, accepted = verified
            self.metrics.spec_rounds.inc(rounds)
            self.metrics.spec_drafts.labels(result="proposed").inc(drafts)
            self.metrics.spec_drafts.labels(result="accepted").inc(accepted)
            self.metrics.spec_drafts.labels(result="rolled_back").inc(drafts - accepted)

    def flush(self) -> None:
        """Deliver every held event; a request whose consumer is gone stops generating."""
        for job in self._outbox.flush():
            job.cancel_requested = True

    def fail_batch(self, batch: StepBatch, error: InfernixError) -> None:
        for row in batch.rows:
            self.finish(row.request, FinishReason.ERROR, error)

    def _preview(self, pending: PendingBatch) -> _Round:
        round_ = _Round({}, {}, {})
        previews, failures, kept = round_.previews, round_.failures, round_.kept
        for i, (row, res) in enumerate(zip(pending.batch.rows, pending.results)):
            job = row.request
            if job.cancel_requested:
                continue
            outcome = res.outcome
            if outcome is RowOutcome.NO_OUTPUT:
                kept[i] = _kept(row, None)
                continue
            if outcome is not RowOutcome.TOKENS:
                failures[i] = res.error or InternalError("row failed")
                continue
            tokens = res.tokens
            stop_ids = job.stop_token_ids
            cut = next((k for k, t in enumerate(tokens) if t in stop_ids), None) \
                if stop_ids else None
            fed = tokens if cut is None else tokens[:cut]
            result = job.session.preview(fed, limit=job.remaining,
                                         position=job.num_output_tokens)
            if row.num_drafts and result.failure is None and job.output.stop is not None \
                    and result.accepted > 1 and job.output.would_stop(tokens[:result.accepted]):
                result = self._shortest_stop(job, fed)
            if result.failure is not None:
                failures[i] = result.failure
                if result.row_only:  # the matcher itself failed: its row alone, zero tokens
                    continue
                round_.aborted_by = i
                return round_
            stop_id = cut is not None and result.accepted == cut
            accepted = result.accepted + (1 if stop_id else 0)
            preview = previews[i] = _Preview(result, tokens if accepted == len(tokens) else
                                             tokens[:accepted], stop_id)
            kept[i] = _kept(row, preview) if row.num_drafts else len(row.tokens)
        return round_

    @staticmethod
    def _shortest_stop(job: Request, tokens: list[int]) -> PreviewResult:
        """A verify row whose round completes a stop string: the shortest prefix that does, so
        the ledger ends where ordinary decoding's would (one token at a time)."""
        job.session.discard()
        for n in range(1, len(tokens) + 1):
            result = job.session.preview(tokens[:n], limit=job.remaining,
                                         position=job.num_output_tokens)
            if result.failure is not None or n == len(tokens) or job.output.would_stop(tokens[:n]):
                return result
            job.session.discard()
        raise AssertionError("unreachable: the last prefix returns")

    def _count_verify(self, job: Request, row, result, preview: _Preview,
                      verified: list[int]) -> None:
        """A confirmed verification row's counts: the request's report, the engine's totals, and
        the step's tally for the metrics (`verified`: rounds, drafts, accepted drafts)."""
        accepted = min(result.accepted_drafts, len(preview.tokens))
        job.session.counters.add_verify_round(row.num_drafts, accepted)
        spec = self.speculation
        spec.rounds, spec.drafts = spec.rounds + 1, spec.drafts + row.num_drafts
        spec.accepted, spec.tokens = (
            spec.accepted + accepted,
            spec.tokens + len(preview.tokens),
        )
        verified[0] += 1
        verified[1] += row.num_drafts
        verified[2] += accepted

    def force_close(self, job: Request) -> None:
        """The thinking budget ran out: force the close sequence (design document: "the control
        string is injected after a committed round"; "Control strings call no sampler and consume
        no sampling RNG; they count toward the output budget as before"; "the control string and
        closing boundary are checked first, and matcher and decoder state are confirmed only
        after the Program's append succeeds"). The matcher's forced-control preview checks the
        whole sequence first and is held; the tokens join the ledger, the next step feeds them to
        the lane (its masks and sample build on the held preview), and the commit of that step
        confirms the close and publishes it before the step's own tokens (`commit`). A cancel or
        failure before then ends the output without it (`finish`). A close that uses up the
        output budget ends the output: nothing is fed after it, so it is confirmed and published
        at once."""
        forced = list(job.output.forced_close())
        if len(forced) > job.remaining:  # the output budget cannot hold the close
            self.finish(job, FinishReason.LENGTH)
            return
        result = job.session.preview_forced(forced, limit=job.remaining,
                                            position=job.num_output_tokens)
        if result.failure is not None:
            self.finish(job, FinishReason.ERROR, result.failure)
            return
        if not result.length_cut:
            job.session.hold()
            job.append_forced(forced)
            return
        job.append_forced(forced, held=False)
        job.session.confirm()
        self.metrics.forced_closes.inc()
        if self._emit(job, forced):
            self.finish(job, FinishReason.LENGTH)

    # ---------------------------------------------------------------- publication

    def _emit(self, job: Request, tokens: list[int], logprobs: tuple = ()) -> bool:
        """Publish committed tokens; False when reading them failed (a decoder bug, a tool stream
        that cannot read a call): that request ends with the typed error, never the batch.
        `logprobs`: the tokens' entries when the request asked (absent for forced controls): the
        content tokens' ones go out first, as one TokenLogprobs event."""
        try:
            if logprobs:
                listed, events = [], []
                eos = job.session.domain.eos_ids
                for t, entry in zip(tokens, logprobs):  # a token's phase is read before it
                    if not job.output.in_reasoning and t not in eos:
                        listed.append(entry)
                    events += job.output.feed((t,))
                if listed:
                    events.insert(0, TokenLogprobs(tuple(listed)))
            else:
                events = job.output.feed(tokens)
        except Exception as exc:
            log.exception("publication_failed", request_id=job.request_id)
            self.finish(job, FinishReason.ERROR, exc if isinstance(exc, InternalError) else
                        InternalError(f"publishing the output failed: {type(exc).__name__}: {exc}"))
            return False
        if events:
            self._send_all(job, events)
        return True

    def _send_all(self, job: Request, events) -> None:
        for gone in self._outbox.add_all(job.sink, events, job):  # held until flush()
            gone.cancel_requested = True  # the consumer is gone: stop generating for it

    # ---------------------------------------------------------------- finishing

    def finish(
        self, job: Request, reason: FinishReason, error: InfernixError | None = None
    ) -> None:
        """End `job` once: flush its held text, read its tool calls, free its lane and publish
        its Finished event with usage, constraint report and timings."""
        if job.is_terminal:
            return
        job.drop_held()  # a forced close the lane never received is not part of the output
        session = job.session
        if not session.finished:
            session.finish_incomplete()  # the publication decoder flushes the held text
        output = job.output
        try:
            self._send_all(job, output.finish(complete=session.ended_normally))
        except InternalError as exc:  # the grammar confirmed a call the decoder cannot read
            reason, error = FinishReason.ERROR, error or exc
        except Exception as exc:  # a decoder bug fails this request, never the engine thread
            log.exception("tool_stream_finish_failed", request_id=job.request_id)
            reason, error = FinishReason.ERROR, error or InternalError(
                f"reading the tool calls failed: {type(exc).__name__}: {exc}")
        calls = output.tool_calls()
        if calls and reason is FinishReason.STOP:
            reason = FinishReason.TOOL_CALLS
        if job.lane is not None:
            self.program.release_lane(job.lane)
        self.scheduler.remove(job)
        job.finish()
        self._on_terminal(job)
        report = session.report()
        if report is not None and output.branch is not None:
            report = dataclasses.replace(report, branch=output.branch)
        constraint = report.to_dict() if report is not None else None
        timings = _timings(job)
        stop_sequence = output.stop.matched if output.stop is not None else None
        usage = Usage(job.num_prompt_tokens, job.num_output_tokens,
                      cached_tokens=job.num_cached_prompt, reasoning_tokens=output.reasoning_tokens)
        self._send_all(job, [Finished(reason, usage,
                                      content=output.content(), reasoning=output.reasoning(),
                                      tool_calls=calls, constraint=constraint,
                                      error=error.to_dict() if error is not None else None,
                                      timings=timings, stop_sequence=stop_sequence)])
        decode_tokens = job.num_output_tokens - 1
        self.metrics.finished(
            job.constraint_kind,
            reason.value,
            ttft=timings.get("ttft"),
            tpot=timings["decode"] / decode_tokens
            if "decode" in timings and decode_tokens > 0
            else None,
            mask_seconds=report.mask_seconds + report.rollback_seconds
            if report is not None
            else 0.0,
            prompt_tokens=job.num_prompt_tokens,
            completion_tokens=job.num_output_tokens,
            mask_positions=report.mask_positions if report is not None else 0,
            mask_upload_bytes=report.mask_upload_bytes if report is not None else 0,
            input_seconds=job.input_seconds,
            constraint_seconds=job.constraint_seconds,
        )
        log.info("request_done", request_id=job.request_id, finish_reason=reason.value,
                 prompt_tokens=job.num_prompt_tokens, cached_tokens=job.num_cached_prompt,
                 completion_tokens=job.num_output_tokens,
                 error=error.type_name if error is not None else None, constraint=constraint)


def _kept(row, preview: _Preview | None) -> int:
    """Fed tokens whose model state the commit keeps. An ordinary row keeps all it fed; a
    verification row the anchor and the drafts before its last committed token: for m committed
    tokens (accepted drafts, then the correction or bonus) the first m fed ones, so the lane stays
    one token behind the ledger."""
    if not row.num_drafts:
        return len(row.tokens)
    committed = len(preview.tokens) if preview is not None else 0
    return max(1, min(len(row.tokens), committed))


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
