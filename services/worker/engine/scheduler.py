"""Which requests run next: the waiting queue, the resident rows, and the batch of one step.

Requests join `waiting` in arrival order and become resident when the Program has a free lane.
Each step runs either the prefill chunks of the rows still reading their prompt (`prefill_chunk`
prompt tokens per row) or one decode token for every decoding row; when both kinds exist they
alternate, so a long prompt joining never stalls the resident rows for more than one step.
"""

from __future__ import annotations

import time
from collections import deque

from services.worker.program import BatchRow, Program, StepBatch
from services.worker.request import Request, RequestState


class Scheduler:
    def __init__(self, prefill_chunk: int) -> None:
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.resident: list[Request] = []
        self._last_was_prefill = False

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.resident)

    def live(self) -> list[Request]:
        return list(self.waiting) + list(self.resident)

    def add(self, job: Request) -> None:
        self.waiting.append(job)

    def remove(self, job: Request) -> None:
        if job in self.resident:
            self.resident.remove(job)
        elif job in self.waiting:
            self.waiting.remove(job)

    def admit(self, program: Program) -> None:
        """Waiting requests into free lanes, in arrival order."""
        while self.waiting and program.free_lanes:
            job = self.waiting.popleft()
            job.lane = program.acquire_lane()
            job.state = RequestState.RESIDENT
            job.admitted_at = time.monotonic()
            job.num_cached = 0
            self.resident.append(job)

    def schedule(self) -> StepBatch | None:
        """The next step's rows, or None when nothing is resident."""
        prefill = [j for j in self.resident if j.in_prefill]
        decode = [j for j in self.resident if not j.in_prefill]
        if prefill and (not decode or not self._last_was_prefill):
            self._last_was_prefill = True
            rows = []
            for j in prefill:
                chunk = tuple(j.next_input(self.prefill_chunk))
                rows.append(BatchRow(j, chunk, j.num_cached,
                                     sample=j.num_cached + len(chunk) == j.num_prompt_tokens))
            return StepBatch(tuple(rows))
        if decode:
            self._last_was_prefill = False
            return StepBatch(tuple(BatchRow(j, (j.output_ids[-1],), j.num_cached, True)
                                   for j in decode))
        return None
