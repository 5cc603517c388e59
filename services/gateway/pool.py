"""`WorkerPool`: several workers behind one WorkerClient, for the gateway.

A request goes to the healthy worker, among those serving its model, with the fewest outstanding
requests (ties rotate). A background task checks every worker's health each `health_interval_s`;
`failure_threshold` failures in a row take a worker out, and one success puts it back. A worker
whose `generate` fails with a connection error (`ConnectionError`) before the first event is taken
out at once and the request is retried once on another worker. A worker that fails mid-stream
ends that request with `Finished(ERROR)` (the gateway sends the protocol's terminal error event),
is taken out when the failure is a connection error, and is probed at once otherwise. A worker that
cannot be reached (no healthy worker, both tries refused, a connection lost mid-stream) is a
dependency failure: `ServiceUnavailable(service="worker")`, a 503 with a Retry-After, never a 500;
a stream cut that way is logged (`worker_stream_cut`) with what it had streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import InfernixError, InternalError, Overloaded, ServiceUnavailable
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    GenerationEvent,
    PromptInput,
    Started,
    TextDelta,
    Usage,
    WorkerClient,
)
from shared.logging import get_logger

log = get_logger(__name__)

RETRY_AFTER_S = 1.0  # the retry hint when no worker can be reached: health checks run every 2 s
# Terminal errors that say the worker (not the request) failed: the worker is probed at once.
_WORKER_FAULTS = frozenset({InternalError.__name__, ServiceUnavailable.__name__})


def _log_cut(member: "PoolMember", request: GenerateRequest, content: list[str],
             error: dict[str, Any] | None) -> None:
    """A stream cut by a lost worker, with what it had streamed (counts, never the text)."""
    log.warning("worker_stream_cut", worker=member.name, request_id=request.request_id,
                streamed_deltas=len(content), streamed_chars=sum(map(len, content)),
                error=(error or {}).get("message"))


@dataclass(eq=False)
class PoolMember:
    """One worker as the pool sees it."""

    client: WorkerClient
    name: str
    healthy: bool = True
    failures: int = 0  # consecutive failed health checks
    outstanding: int = 0  # requests started here and not yet finished or closed
    reported_load: int = 0  # resident, waiting, preparing requests the worker reports (all callers)
    models: tuple[str, ...] | None = None  # None: not asked yet
    # From the worker's last health: its dependencies that are down ("grammar_service",
    # "redis"), and whether it can serve constrained requests now.
    missing: tuple[str, ...] = ()
    ready: bool = True

    @property
    def load(self) -> int:
        """What the balancer minimises: this gateway's requests there, or the worker's own count
        of running and queued requests (other gateways' included) when that is larger."""
        return max(self.outstanding, self.reported_load)

    def snapshot(self) -> dict[str, Any]:
        return {"name": self.name, "healthy": self.healthy, "outstanding": self.outstanding,
                "reported_load": self.reported_load, "failures": self.failures,
                "models": list(self.models or ()), "missing": list(self.missing),
                "ready": self.ready}


class WorkerPool(WorkerClient):
    """Least-outstanding balancing over `clients` with health checks.

    `health_interval_s` (default 2 s): period of the background health checks, which start on
    first use. `failure_threshold` (default 2): consecutive failed checks that take a worker out.
    `health_timeout_s` (default 1 s): the deadline of one check. Raises ValueError for an empty
    client list or a non-positive setting."""

    def __init__(self, clients: Sequence[WorkerClient], *, health_interval_s: float = 2.0,
                 failure_threshold: int = 2, health_timeout_s: float = 1.0) -> None:
        if not clients:
            raise ValueError("a worker pool needs at least one worker")
        if health_interval_s <= 0 or health_timeout_s <= 0:
            raise ValueError("health_interval_s and health_timeout_s must be positive")
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        self.members = [PoolMember(c, getattr(c, "address", f"worker[{i}]"))
                        for i, c in enumerate(clients)]
        self.health_interval_s = health_interval_s
        self.failure_threshold = failure_threshold
        self.health_timeout_s = health_timeout_s
        self._holders: dict[str, PoolMember] = {}
        self._turn = 0
        self._checker: asyncio.Task[None] | None = None
        self._probes: set[asyncio.Task[None]] = set()

    # ---- health ------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._checker is None or self._checker.done():
            self._checker = asyncio.get_running_loop().create_task(self._check_forever())

    async def _check_forever(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.health_interval_s)

    async def check_health(self) -> None:
        """Check every worker once now (the background task calls this each interval)."""
        await asyncio.gather(*(self._check(m) for m in self.members))

    async def _check(self, member: PoolMember, *, suspect: bool = False) -> None:
        try:
            health = await asyncio.wait_for(member.client.health(), self.health_timeout_s)
            if isinstance(health, dict) and health.get("status", "ok") != "ok":
                # It answers, but cannot serve (e.g. its engine stopped): out of rotation.
                raise RuntimeError(f"the worker reports status {health['status']!r}")
            if isinstance(health, dict):
                member.reported_load = sum(int(health.get(key, 0) or 0)
                                           for key in ("resident", "waiting", "preparing"))
                member.missing = tuple(str(m) for m in health.get("missing", ()) or ())
                member.ready = bool(health.get("ready", True))
            if member.models is None or not member.healthy:
                member.models = tuple(await asyncio.wait_for(member.client.models(),
                                                             self.health_timeout_s))
        except Exception as exc:  # noqa: BLE001 - any failure of a check is the worker's
            member.failures += 1
            if member.healthy and (suspect or member.failures >= self.failure_threshold):
                self._take_out(member, f"health check failed: {type(exc).__name__}: {exc}")
            return
        member.failures = 0
        if not member.healthy:
            member.healthy = True
            log.info("worker_recovered", worker=member.name)

    def _take_out(self, member: PoolMember, why: str) -> None:
        if member.healthy:
            member.healthy = False
            log.warning("worker_removed", worker=member.name, reason=why)

    def _probe(self, member: PoolMember) -> None:
        task = asyncio.get_running_loop().create_task(self._check(member, suspect=True))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    # ---- routing -----------------------------------------------------------------------------

    def _pick(self, model: str, exclude: set[int]) -> PoolMember | None:
        healthy = [(i, m) for i, m in enumerate(self.members) if m.healthy and i not in exclude]
        serving = [(i, m) for i, m in healthy if m.models is None or model in m.models]
        candidates = serving or healthy  # nobody serves it: let a worker give its typed error
        if not candidates:
            return None
        n = len(self.members)
        i, member = min(candidates, key=lambda im: (im[1].load, (im[0] - self._turn) % n))
        self._turn = (i + 1) % n
        return member

    def _no_worker(self, model: str, why: str) -> ServiceUnavailable:
        return ServiceUnavailable(f"no worker can take a request for model {model!r}: {why}",
                                  service="worker", retry_after_s=RETRY_AFTER_S)

    # ---- WorkerClient ------------------------------------------------------------------------

    async def models(self) -> list[str]:
        """The union of the healthy workers' models, in worker order. Raises ServiceUnavailable
        when no worker is healthy (rather than claiming that no model is served)."""
        self._start()
        await asyncio.gather(*(self._check(m) for m in self.members
                               if m.healthy and m.models is None))
        out: dict[str, None] = {}
        for member in self.members:
            if member.healthy:
                out.update(dict.fromkeys(member.models or ()))
        if not any(m.healthy for m in self.members):
            raise ServiceUnavailable("no healthy worker", service="worker",
                                     retry_after_s=RETRY_AFTER_S)
        return list(out)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationEvent]:
        """Events from the chosen worker. Raises before the first event what the worker raises,
        or ServiceUnavailable when no healthy worker is left (after one retry on a connection
        error).
        A worker whose queue is full (Overloaded) passes the request to the next one; when every
        worker tried is full, its Overloaded (with Retry-After) is what the caller gets."""
        self._start()
        tried: set[int] = set()
        overloaded: Overloaded | None = None
        while True:
            member = self._pick(request.model, tried)
            if member is None:
                if overloaded is not None:
                    raise overloaded
                raise self._no_worker(request.model, "no healthy worker" if not tried else
                                      "the workers tried could not be reached")
            tried.add(self.members.index(member))
            member.outstanding += 1
            self._holders[request.request_id] = member
            stream = member.client.generate(request).__aiter__()
            try:
                try:
                    # A request counts as started at its first output event: a worker lost while
                    # the request was only queued there (its Started event) is retried elsewhere.
                    held = []
                    first = await stream.__anext__()
                    while isinstance(first, Started):
                        held.append(first)
                        first = await stream.__anext__()
                except ConnectionError as exc:
                    self._take_out(member, f"generate failed: {type(exc).__name__}: {exc}")
                    if len(tried) >= 2:
                        raise self._no_worker(request.model, "the workers tried could not be "
                                              f"reached (last {member.name}: {exc})") from None
                    log.info("worker_retry", request_id=request.request_id, worker=member.name)
                    continue
                except Overloaded as exc:
                    overloaded = exc
                    log.info("worker_full", request_id=request.request_id, worker=member.name)
                    continue
                except ServiceUnavailable as exc:
                    if exc.service != "worker":  # a dependency of the request, not the worker
                        raise
                    self._take_out(member, f"it cannot serve: {exc.message}")
                    log.info("worker_retry", request_id=request.request_id, worker=member.name)
                    continue
                except StopAsyncIteration:
                    raise InternalError("the worker ended the stream without a Finished "
                                        "event") from None
                for event in held:
                    yield event
                async for event in self._follow(member, request, stream, first):
                    yield event
                return
            finally:
                member.outstanding -= 1
                if self._holders.get(request.request_id) is member:
                    del self._holders[request.request_id]
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()

    async def _follow(self, member: PoolMember, request: GenerateRequest, stream: Any,
                      first: GenerationEvent) -> AsyncIterator[GenerationEvent]:
        """The started stream up to its Finished; failures become Finished(ERROR)."""
        content: list[str] = []
        event: GenerationEvent = first
        while True:
            if isinstance(event, TextDelta):
                content.append(event.text)
            if isinstance(event, Finished):
                kind = (event.error or {}).get("type")
                if event.finish_reason is FinishReason.ERROR and kind in _WORKER_FAULTS:
                    if (event.error or {}).get("service") == "worker":  # its connection lost
                        _log_cut(member, request, content, event.error)
                    self._probe(member)
                yield event
                return
            yield event
            try:
                event = await stream.__anext__()
            except StopAsyncIteration:
                error = InternalError(f"worker {member.name} ended the stream without a Finished "
                                      "event")
            except ConnectionError as exc:
                self._take_out(member, f"connection lost mid-stream: {exc}")
                error = ServiceUnavailable(
                    f"worker connection lost mid-stream ({member.name}, request "
                    f"{request.request_id}): {type(exc).__name__}: {exc}", service="worker",
                    retry_after_s=RETRY_AFTER_S)
                _log_cut(member, request, content, error.to_dict())
            except InfernixError as exc:
                error = exc
            except Exception as exc:  # a worker bug: logged with its traceback, probed
                log.exception("worker_stream_failed", worker=member.name,
                              request_id=request.request_id)
                error = InternalError(f"worker {member.name} failed mid-stream: "
                                      f"{type(exc).__name__}")
            else:
                continue
            if isinstance(error, InternalError) and member.healthy:
                self._probe(member)
            yield Finished(FinishReason.ERROR, Usage(), content="".join(content),
                           error=error.to_dict())
            return

    async def cancel(self, request_id: str) -> None:
        """Cancel on the worker that holds the request (no-op for an unknown id)."""
        member = self._holders.get(request_id)
        if member is not None:
            await member.client.cancel(request_id)

    async def count_tokens(self, prompt: PromptInput, model: str) -> int:
        """Counted by a healthy worker serving `model` (retried once on a connection error)."""
        self._start()
        tried: set[int] = set()
        while True:
            member = self._pick(model, tried)
            if member is None:
                raise self._no_worker(model, "no healthy worker")
            tried.add(self.members.index(member))
            try:
                return await member.client.count_tokens(prompt, model)
            except ConnectionError as exc:
                self._take_out(member, f"count_tokens failed: {exc}")
                if len(tried) >= 2:
                    raise self._no_worker(model, "the workers tried could not be reached "
                                          f"(last {member.name}: {exc})") from None

    async def health(self) -> dict[str, Any]:
        """Every worker's state, and the pool's: `degraded` (a worker out, or a dependency of a
        healthy worker down), `missing` (those dependencies, and "worker" while one is out),
        `ready` (some healthy worker can serve constrained requests now). Raises
        ServiceUnavailable when no worker is healthy."""
        self._start()
        workers = [m.snapshot() for m in self.members]
        serving = [m for m in self.members if m.healthy]
        if not serving:
            raise ServiceUnavailable("no healthy worker", service="worker",
                                     retry_after_s=RETRY_AFTER_S)
        missing = sorted({name for m in serving for name in m.missing} |
                         ({"worker"} if len(serving) < len(self.members) else set()))
        return {"healthy": len(serving), "workers": workers, "degraded": bool(missing),
                "missing": missing, "ready": any(m.ready for m in serving)}

    async def aclose(self) -> None:
        """Stop the health checks and close the clients."""
        tasks = [t for t in (self._checker, *self._probes) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for member in self.members:
            with contextlib.suppress(Exception):
                await member.client.aclose()
