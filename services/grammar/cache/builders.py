"""One model's cold builds: a cold-compile slot, then a compile where the config says.

- trusted builds (a verdict Record says the grammar compiled within the limits and faster than it
  loads) run in a thread of this process: the cheapest way to get the grammar itself;
- other builds run with `CacheConfig.isolation`: "process", in a killable child within
  `CompileLimits` (`cache/isolation.py`), or "thread", in a daemon thread of this process,
  where only the deadline holds and only for the waiter: the request gets ConstraintTooComplex
  while the compile runs on, still holding its slot, and its result is dropped.

Compile threads are daemon threads, so a process that is told to stop never waits for one. An
interpreter that finalises while one is still inside xgrammar's C++ may abort ("terminate called
without an active exception"): a main that returns with `running_compile_threads()` > 0 should
end with `os._exit` after flushing its logs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from services.grammar.cache import records
from services.grammar.cache.isolation import CompilePool, Want
from services.grammar.cache.limits import ColdSlots, StorePolicy
from services.grammar.cache.records import BuildInfo, Record
from shared.errors import ConstraintTooComplex
from shared.logging import get_logger
from shared.metrics import GrammarMetrics

log = get_logger(__name__)

if TYPE_CHECKING:
    from services.grammar.cache.cache_types import CacheConfig
    from services.grammar.compiler import ModelCompiler


@dataclass
class BuildOutcome:
    info: BuildInfo  # final when `_decided`, else the footprint's verdict only
    grammar: Any | None  # the compiled grammar, when the build was asked for it
    queue_ms: float  # waiting for the cold slot
    load_ms: float = 0.0  # deserialising a child's blob into `grammar`
    _blob: bytes | None = None
    _decided: bool = True
    policy: StorePolicy | None = None

    async def record(self) -> Record:
        """The key's Record: the verdict and, when the store policy keeps it, the blob (an
        in-process grammar that might be kept is serialised here, in a thread, to decide)."""
        if not self._decided:
            assert self.grammar is not None and self.policy is not None
            blob, serialized = await asyncio.to_thread(records.serialize_sized, self.grammar)
            self.info = BuildInfo(self.info.compile_ms, self.info.memory_bytes,
                                  self.policy.should_store(self.info.compile_ms, serialized),
                                  serialized)
            self._blob, self._decided = blob, True
        return Record(self.info, self._blob if self.info.stored else None)


_THREAD_NAME = "grammar-compile"


def running_compile_threads() -> int:
    """Compile threads still running in this process."""
    return sum(1 for t in threading.enumerate() if t.name == _THREAD_NAME and t.is_alive())


def run_in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """`fn(*args)` in a new daemon thread; a future of its result on the running loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def target() -> None:
        try:
            result, ok = fn(*args), True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=target, name=_THREAD_NAME, daemon=True).start()
    return future


class Builder:
    """Cold builds of one model under its `ColdSlots`."""

    def __init__(self, compiler: "ModelCompiler", config: "CacheConfig", metrics: GrammarMetrics,
                 model: str) -> None:
        self.compiler = compiler
        self.config = config
        self.metrics = metrics
        self.model = model
        bound = config.limits.deadline_s if config.isolation == "process" else None
        self.slots = ColdSlots(config.max_cold_compiles, config.slot_wait_s, bound)
        self._pool: CompilePool | None = None

    @property
    def pool(self) -> CompilePool:
        if self._pool is None:
            self._pool = CompilePool(self.compiler.domain, size=self.config.max_cold_compiles,
                                     limits=self.config.limits, policy=self.config.policy)
        return self._pool

    async def warm(self) -> None:
        """Start the compile children now (process isolation), not on the first cold compile."""
        if self.config.isolation == "process":
            try:
                await self.pool.start()
            except Exception as exc:  # noqa: BLE001 - each compile retries the start itself
                log.error("grammar_compile_children_failed_to_start", model=self.model,
                          error=f"{type(exc).__name__}: {exc}"[:300])

    async def build(self, constraint: Any, *, want: Want, trusted: bool) -> BuildOutcome:
        """A cold build of `constraint`. `want` "always" returns the grammar itself, "stored"
        only what the store policy keeps. Raises Overloaded (no slot in time), the constraint's
        RequestError, ConstraintTooComplex (a limit), InternalError (a crashed child)."""
        queued = time.perf_counter()
        token = await self.slots.acquire()
        queue_ms = (time.perf_counter() - queued) * 1000.0
        in_flight = self.metrics.cold_compiles_in_flight.labels(model=self.model)
        in_flight.inc()
        held = True

        def release(_: Any = None) -> None:
            in_flight.dec()
            self.slots.release(token)

        try:
            if trusted or self.config.isolation == "thread":
                future = run_in_daemon_thread(self.compiler.compile, constraint)
                try:
                    if trusted:
                        compiled = await future
                    else:
                        compiled = await asyncio.wait_for(asyncio.shield(future),
                                                          self.config.limits.deadline_s)
                except asyncio.TimeoutError:
                    held = False  # the thread keeps its slot until it ends
                    future.add_done_callback(release)
                    self._stopped("compile_deadline_s")
                    raise ConstraintTooComplex(
                        f"the constraint is too complex: its compile did not finish within the "
                        f"compile deadline of {self.config.limits.deadline_s:g} s; simplify it",
                        limit="compile_deadline_s", value=self.config.limits.deadline_s) from None
                size = records.footprint(compiled.grammar)
                maybe = self.config.policy.worth_serializing(compiled.compile_ms, size)
                outcome = BuildOutcome(BuildInfo(compiled.compile_ms, size, False),
                                       compiled.grammar, queue_ms, _decided=not maybe,
                                       policy=self.config.policy)
            else:
                try:
                    built = await self.pool.compile(constraint, want=want)
                except ConstraintTooComplex as exc:
                    self._stopped(str(exc.limit))
                    raise
                outcome = BuildOutcome(built.info, None, queue_ms, _blob=built.blob)
                if want == "always":
                    assert built.blob is not None
                    start = time.perf_counter()
                    outcome.grammar = await asyncio.to_thread(records.deserialize, built.blob,
                                                              self.compiler)
                    outcome.load_ms = (time.perf_counter() - start) * 1000.0
        finally:
            if held:
                release()
        self.metrics.compile_seconds.labels(model=self.model).observe(
            outcome.info.compile_ms / 1000.0)
        return outcome

    def _stopped(self, limit: str) -> None:
        self.metrics.compile_limit_stops.labels(model=self.model, limit=limit).inc()

    async def aclose(self) -> None:
        """Kill the compile children (a runaway compile included)."""
        if self._pool is not None:
            await self._pool.aclose()
