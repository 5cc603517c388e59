"""Which requests run next: the waiting queue, the resident rows, and the batch of one step.

Requests join `waiting` in arrival order and become resident when the Program has a free lane.
A step runs either prefill chunks or one decode token for every decoding row; when both kinds
exist they alternate. A prefill step reads at most `prefill_chunk` tokens in all, shared by the
prefilling rows in arrival order, so a long prompt delays the decoding rows by at most one
bounded chunk per token they produce (a step's padding is bounded by the same budget).

Preemption (`preempt_after_s`, off by default): when a request has waited that long and no lane is
free, the most recently admitted decoding request is paused at this commit boundary (its matcher,
output and ledgers stay with it, its lane is freed) and goes back to the end of the queue; it
resumes by Replay (request.py). Its committed full KV blocks stay in the prefix cache, so the
Replay starts from what of them survived (program/blocks.py).

Admission starts each lane from the prefix cache: `num_cached` begins at the cached prefix, so
prefill feeds only the rest of the prompt (always its last token, whose logits give the first
sampled token under this request's own mask and sampling parameters).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque

from services.worker.engine.stream import RequestStream
from services.worker.program import BatchRow, Program, StepBatch
from services.worker.request import Request
from shared.generation import Started


class Scheduler:
    def __init__(self, prefill_chunk: int, preempt_after_s: float | None = None,
                 on_admit=None) -> None:
        self.prefill_chunk = prefill_chunk
        self.preempt_after_s = preempt_after_s
        self.on_admit = on_admit  # on_admit(seconds waited): queue-time metrics
        self.waiting: deque[Request] = deque()
        self.resident: list[Request] = []
        self._last_was_prefill = False

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.resident)

    def live(self) -> list[Request]:
        return list(self.waiting) + list(self.resident)

    def add(self, job: Request) -> None:
        job.waiting_since = time.monotonic()
        self.waiting.append(job)

    def remove(self, job: Request) -> None:
        if job in self.resident:
            self.resident.remove(job)
        elif job in self.waiting:
            self.waiting.remove(job)

    def admit(self, program: Program) -> int:
        """Waiting requests into free lanes, in arrival order, after preempting one resident
        request if the oldest waiting one has waited longer than `preempt_after_s`. Returns the
        number of requests preempted (0 or 1)."""
        now = time.monotonic()
        preempted = self._preempt(program, now)
        while self.waiting and program.free_lanes:
            job = self.waiting.popleft()
            if self.on_admit is not None:
                self.on_admit(now - job.waiting_since)
            lane = program.acquire_lane()
            first = job.admitted_at is None
            try:  # attaching writes the lane's block table to the device, which may fail there
                cached = self._cached_prefix(program, lane, job)
            except BaseException:
                self.waiting.appendleft(job)  # it waits again: a failed admission orphans none
                with contextlib.suppress(Exception):  # (a lost device fails this too)
                    program.release_lane(lane)
                raise
            job.admit(lane, cached, now)
            if first:
                _announce(job)
            self.resident.append(job)
        return preempted

    @staticmethod
    def _cached_prefix(program: Program, lane: int, job: Request) -> int:
        # A fresh request recomputes at least its last prompt token, whose logits it samples its
        # first token from under its own mask and parameters; a Replay samples nothing at its
        # end, so all it must hold (prompt and output but the newest token) may come cached.
        limit = job.prefill_end if job.output_ids else job.prefill_end - 1
        return program.attach_prefix(lane, job.prompt_ids + tuple(job.output_ids), limit)

    def _preempt(self, program: Program, now: float) -> int:
        if self.preempt_after_s is None or not self.waiting or program.free_lanes:
            return 0
        if now - self.waiting[0].waiting_since < self.preempt_after_s:
            return 0
        # Only a request that produced a token since it took its lane can be paused: every
        # admission makes progress, so requests taking the lane from each other never livelock.
        decoding = [j for j in self.resident
                    if not j.in_prefill and j.num_output_tokens > j.output_at_admission]
        if not decoding:
            return 0
        self.pause(max(decoding, key=lambda j: j.resident_since), program)
        return 1

    def pause(self, job: Request, program: Program) -> None:
        """Take a resident request off its lane at a commit boundary and queue it again: it
        resumes by Replay (request.py), from what of its blocks the prefix cache kept."""
        program.release_lane(job.lane)
        self.resident.remove(job)
        job.pause()
        self.add(job)

    def prefill_next(self) -> bool:
        """Whether `schedule` would now return a prefill step."""
        return _prefill_turn(any(j.in_prefill for j in self.resident),
                             any(not j.in_prefill for j in self.resident), self._last_was_prefill)

    def schedule(self) -> StepBatch | None:
        """The next step's rows, or None when nothing is resident."""
        # Shortest remaining prompt first: a short request admitted beside a long prompt is
        # prefilled in the next prefill step instead of after the long one's last chunk (a long
        # prompt delays others by at most one chunk). Resident rows are bounded by
        # the lanes, so the long prompt still gets the rest of every step's budget.
        prefill = sorted((j for j in self.resident if j.in_prefill),
                         key=lambda j: j.prefill_end - j.num_cached)
        decode = [j for j in self.resident if not j.in_prefill]
        if _prefill_turn(bool(prefill), bool(decode), self._last_was_prefill):
            self._last_was_prefill = True
            rows, budget = [], self.prefill_chunk
            for j in prefill:
                if budget <= 0:
                    break
                chunk = tuple(j.next_input(budget))
                budget -= len(chunk)
                end = j.num_cached + len(chunk)
                rows.append(BatchRow(j, chunk, j.num_cached,
                                     sample=end == j.prefill_end and not j.output_ids))
            return StepBatch(tuple(rows))
        if decode:
            self._last_was_prefill = False
            return StepBatch(tuple(BatchRow(j, (j.output_ids[-1],), j.num_cached, True)
                                   for j in decode))
        return None


def _prefill_turn(prefill: bool, decode: bool, last_was_prefill: bool) -> bool:
    # Prefill and decode steps alternate when both kinds of rows are resident.
    return prefill and (not decode or not last_was_prefill)


def _announce(job: Request) -> None:
    """A second `Started` at first admission, now with the prompt tokens the prefix cache held
    (the first, at submission, precedes the lookup), before any output event of the request."""
    sink = job.sink  # a RequestStream (the in-process client's) or a function of the event
    try:
        (sink.push if isinstance(sink, RequestStream) else sink)(
            Started(job.num_prompt_tokens, job.num_cached_prompt))
    except RuntimeError:  # the consumer's loop is closed: it is gone
        job.cancel_requested = True
