"""Bounds on cold compiles: the compile limits, the store policy and the cold-compile slots.

- `CompileLimits`: every compile gets a deadline and a memory budget. They are enforced where a
  compile can be stopped, a child process (`services.grammar.cache.isolation`); a compile that goes
  past either is killed and the request gets `ConstraintTooComplex` naming the limit.
- `StorePolicy`: a compiled grammar is kept (Redis, the service's L1) and shipped to workers only
  when loading it is predicted to be at least `min_speedup` times faster than compiling it
  (default 4: a hit costs under a quarter of a cold compile); otherwise whoever needs it compiles
  it. A load's cost follows the size of the serialisation (`load_ms_fixed` + `load_ms_per_mb` per
  MB of serialised JSON, measured by `infernix bench grammar-store`, docs/benchmarks.md), which is
  never smaller than the grammar's in-memory footprint: a grammar whose compile is not
  `min_speedup` times the predicted load of its footprint is never even serialised.
- `ColdSlots`: at most N cold compiles at once per model; a request waits at most `wait_s` for a
  slot and then gets `Overloaded` with a `retry_after_s`. Cache hits never take a slot.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from services.settings import default
from shared.errors import Overloaded

# The defaults are services/settings.py's. Decompress + deserialise per MB of serialised JSON: the
# bench measured 21 to 52 ms/MB over both vocabularies (docs/benchmarks.md, "Grammar store
# policy"); the default load_ms_per_mb sits at the top of that.
DEFAULT_DEADLINE_S = default("compile_deadline_s")
DEFAULT_MEMORY_BYTES = default("compile_memory_bytes")
DEFAULT_LOAD_MS_PER_MB = default("grammar_load_ms_per_mb")
DEFAULT_LOAD_MS_FIXED = default("grammar_load_ms_fixed")
DEFAULT_MIN_SPEEDUP = default("grammar_store_min_speedup")


@dataclass(frozen=True)
class CompileLimits:
    """What one compile (validation, conversion, vocabulary compilation) may take."""

    deadline_s: float = DEFAULT_DEADLINE_S  # wall time from the start of the compile
    memory_bytes: int = DEFAULT_MEMORY_BYTES  # growth of the compiling process's resident memory

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"CompileLimits.deadline_s must be > 0, got {self.deadline_s}")
        if self.memory_bytes <= 0:
            raise ValueError(f"CompileLimits.memory_bytes must be > 0, got {self.memory_bytes}")


@dataclass(frozen=True)
class StorePolicy:
    """Store (and ship) a compiled grammar only when it loads `min_speedup` times faster than it
    compiles. `min_speedup` 0 stores everything."""

    load_ms_per_mb: float = DEFAULT_LOAD_MS_PER_MB  # per MB of serialised JSON
    min_speedup: float = DEFAULT_MIN_SPEEDUP
    load_ms_fixed: float = DEFAULT_LOAD_MS_FIXED  # per load, whatever the size

    def __post_init__(self) -> None:
        if self.load_ms_per_mb <= 0 or self.min_speedup < 0 or self.load_ms_fixed < 0:
            raise ValueError("StorePolicy.load_ms_per_mb must be > 0, min_speedup and "
                             "load_ms_fixed >= 0")

    def predicted_load_ms(self, serialized_bytes: int) -> float:
        """Decompress + deserialise of a grammar whose serialisation has this many bytes."""
        return self.load_ms_fixed + self.load_ms_per_mb * serialized_bytes / 1e6

    def worth_serializing(self, compile_ms: float, footprint_bytes: int) -> bool:
        """False when even the smallest serialisation possible (the footprint) would load too
        slowly to be stored: the verdict is then known without serialising."""
        return self.should_store(compile_ms, footprint_bytes)

    def should_store(self, compile_ms: float, serialized_bytes: int) -> bool:
        return compile_ms >= self.min_speedup * self.predicted_load_ms(serialized_bytes)


class ColdSlots:
    """`size` cold-compile slots of one model, handed out first come, first served.

    `hold()` waits at most `wait_s` for a slot, else raises Overloaded(resource=
    "cold_compile_slots", retry_after_s=...): when compiles are bounded by `bound_s` (their
    deadline), the time until the oldest running one must end, else `wait_s`. Use from one loop."""

    def __init__(self, size: int, wait_s: float, bound_s: float | None = None) -> None:
        if size <= 0 or not wait_s > 0:
            raise ValueError("ColdSlots needs size > 0 and wait_s > 0")
        self.size = size
        self.wait_s = wait_s
        self.bound_s = bound_s
        self._free = size
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._started: dict[int, float] = {}  # running holders: id -> monotonic start

    @property
    def in_use(self) -> int:
        return self.size - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def retry_after_s(self) -> float:
        if self.bound_s is None or not self._started:
            return float(math.ceil(self.wait_s))
        oldest = min(self._started.values())
        return float(max(1, math.ceil(self.bound_s - (time.monotonic() - oldest))))

    async def acquire(self) -> object:
        """Take a slot (waiting at most `wait_s`); the token to `release` it with. Raises
        Overloaded when none frees in time."""
        await self._wait()
        token = object()
        self._started[id(token)] = time.monotonic()
        return token

    def release(self, token: object) -> None:
        del self._started[id(token)]
        self._hand_over()

    async def _wait(self) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.wait_s)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if fut.done() and not fut.cancelled():  # handed a slot just as we gave up
                if isinstance(exc, asyncio.TimeoutError):
                    return
                self._hand_over()
            else:
                fut.cancel()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise Overloaded(
                f"all {self.size} cold-compile slots stayed busy for {self.wait_s:g} s;"
                " retry later",
                resource="cold_compile_slots",
                retry_after_s=self.retry_after_s(),
            ) from None
        finally:
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass

    def _hand_over(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """One slot for the body. Raises Overloaded when none frees within `wait_s`."""
        token = await self.acquire()
        try:
            yield
        finally:
            self.release(token)
