"""Admission: the engine's live requests and the bound on how many may wait for a lane.

A request counts as live from `admit` (before `prepare` runs, so that a burst cannot all pass
at once) until `forget`: first as one of `preparing` (tokenizing, compiling), then by its id once
`register`ed for the worker's queue. Beyond the lanes plus the waiting limit a caller is told to
come back (Overloaded) with a Retry-After estimated from the mean time recent requests spent in
the engine. Both sides call it (the caller's event loop and the worker thread): every method
takes the one lock.
"""

from __future__ import annotations

import threading
import time

from services.worker.request import Request
from shared.errors import InvalidRequest, Overloaded, ServiceUnavailable
from shared.metrics import WorkerMetrics


def check_serving(running: bool, unavailable: str | None) -> None:
    """Raise ServiceUnavailable(service="worker") unless the engine runs and is not recovering
    from an integrity failure (`unavailable`: what failed)."""
    if not running:  # stopped (or its thread failed): another worker may serve it
        raise ServiceUnavailable("the engine is not running", service="worker",
                                 retry_after_s=1.0)
    if unavailable is not None:  # recovering from an integrity failure
        raise ServiceUnavailable(f"the engine is recovering from an integrity failure "
                                 f"({unavailable})", service="worker", retry_after_s=5.0)


class Admission:
    """The live requests of one engine (see the module docstring). `waiting_limit`: requests
    admitted beyond the lanes; `metrics`: where a refusal is counted."""

    def __init__(self, waiting_limit: int, metrics: WorkerMetrics) -> None:
        self.waiting_limit = waiting_limit
        self.metrics = metrics
        self.preparing = 0  # admitted requests still in prepare (tokenizing, compiling)
        self.mean_duration_s = 1.0  # of recent requests in the engine (the Retry-After estimate)
        self._lock = threading.Lock()  # guards _live and preparing across threads
        self._live: dict[str, Request] = {}

    def admit(self, lanes: int) -> None:
        """Count one more request as preparing, or raise Overloaded(resource="waiting_queue")
        when `lanes` lanes and the waiting limit are all taken."""
        with self._lock:
            live = len(self._live) + self.preparing  # queued, running and being prepared
            if live < lanes + self.waiting_limit:
                self.preparing += 1
                return
        waiting = max(0, live - lanes)
        self.metrics.rejected.labels(reason="queue_full").inc()
        retry = min(60.0, max(1.0, self.mean_duration_s * (waiting + 1) / lanes))
        raise Overloaded(f"{waiting} requests already wait for one of {lanes} lanes; retry in "
                         f"{retry:.0f} s", resource="waiting_queue", retry_after_s=round(retry, 1))

    def register(self, job: Request) -> None:
        """The prepared `job` is live by its id. Raises InvalidRequest(field="request_id") for an
        id already live."""
        with self._lock:
            if job.request_id in self._live:
                raise InvalidRequest(f"request id {job.request_id!r} is already running",
                                     field="request_id")
            self._live[job.request_id] = job

    def prepared(self) -> None:
        """An admitted request left prepare (registered or refused)."""
        with self._lock:
            self.preparing -= 1

    def get(self, request_id: str) -> Request | None:
        with self._lock:
            return self._live.get(request_id)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._live)

    def forget(self, job: Request) -> None:
        """`job` finished: it is no longer live, and its time in the engine enters the mean."""
        with self._lock:
            self._live.pop(job.request_id, None)
        duration = time.monotonic() - (job.enqueued_at or job.submitted_at)
        self.mean_duration_s += 0.1 * (duration - self.mean_duration_s)
