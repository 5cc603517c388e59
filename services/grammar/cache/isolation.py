"""Cold compiles where they can be stopped: a pool of child processes per model.

xgrammar's compile is C++ that Python cannot interrupt, and a legal schema can make it run for
minutes or grow to gigabytes. Each cold-compile slot of a model has one long-lived child
(`services.grammar.cache.compile_child`) holding the model's vocabulary index. The parent sends it a
constraint and watches it: past `CompileLimits.deadline_s` (from the moment the constraint is sent
until the blob is back), or with its resident memory grown by more than
`CompileLimits.memory_bytes` since the compile began, the child is killed (SIGKILL) and the request
gets `ConstraintTooComplex` naming the limit; the next compile starts a fresh child. A compile
waiting for a busy child is not stopped by another one's deadline (each slot has its child).

The child answers with the `BuildInfo` and, as asked, the compressed blob: the grammar service
never needs the grammar itself (it ships blobs), so a grammar that compiles faster than it loads
costs the service the compile alone. A caller that needs the grammar (`want="always"`) pays the
serialisation on top. Memory is read from /proc (Linux); elsewhere only the deadline holds.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from services.grammar.cache.limits import CompileLimits, StorePolicy
from services.grammar.cache.records import BuildInfo
from shared.errors import ConstraintTooComplex, InternalError, error_from_dict
from shared.frontends.token_domain import TokenDomain
from shared.logging import get_logger

log = get_logger(__name__)

_LEN = struct.Struct("<Q")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding `services`
Want = Literal["always", "stored", "never"]


@dataclass(frozen=True)
class Built:
    info: BuildInfo
    blob: bytes | None  # compressed serialisation: with want "always", or when info.stored


class ChildDied(Exception):
    """The compile child ended without answering (killed from outside, crashed)."""


def resident_bytes(pid: int) -> int:
    """Resident memory of process `pid` from /proc, or 0 where /proc is missing."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class _Child:
    """One compile child process and its pipes."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.ready_rss = 0
        self.ready = False  # started and answered init

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, domain: TokenDomain, policy: StorePolicy) -> None:
        await self.kill()  # a start that was interrupted leaves nothing behind
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.grammar.cache.compile_child",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
        await self.send(("init", domain, policy))
        kind, _ = await self.receive()
        if kind != "ready":
            raise InternalError(f"compile child answered {kind!r} to init")
        self.ready_rss = resident_bytes(self.proc.pid)
        self.ready = True

    async def send(self, message: Any) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(_LEN.pack(len(data)) + data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChildDied(f"compile child's pipe closed: {exc}") from None

    async def receive(self) -> Any:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            head = await self.proc.stdout.readexactly(_LEN.size)
            return pickle.loads(await self.proc.stdout.readexactly(_LEN.unpack(head)[0]))
        except asyncio.IncompleteReadError:
            await self.proc.wait()
            raise ChildDied(f"compile child exited with {self.proc.returncode}") from None

    def rss(self) -> int:
        return resident_bytes(self.proc.pid) if self.alive else 0

    async def kill(self) -> None:
        self.ready = False
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        self.proc = None


class CompilePool:
    """`size` compile children for one token domain; at most `size` compiles at once (callers
    hold a cold-compile slot, so a child is always free for them)."""

    def __init__(self, domain: TokenDomain, *, size: int, limits: CompileLimits = CompileLimits(),
                 policy: StorePolicy = StorePolicy(), poll_s: float = 0.02) -> None:
        if size <= 0:
            raise ValueError(f"CompilePool.size must be > 0, got {size}")
        self.domain = domain
        self.limits = limits
        self.policy = policy
        self.poll_s = poll_s
        self._idle: asyncio.LifoQueue[_Child] | None = None  # the last used (warm) child first
        self._children = [_Child() for _ in range(size)]
        self._starting: dict[int, asyncio.Task] = {}
        self.kills: dict[str, int] = {"compile_deadline_s": 0, "compile_memory_bytes": 0}
        if resident_bytes(os.getpid()) == 0:
            log.warning("grammar_compile_memory_unbounded", reason="no /proc on this system")

    def _queue(self) -> asyncio.LifoQueue[_Child]:
        if self._idle is None:
            self._idle = asyncio.LifoQueue()
            for child in reversed(self._children):
                self._idle.put_nowait(child)
        return self._idle

    async def start(self) -> None:
        """Start every child now (otherwise each starts on its first compile)."""
        await asyncio.gather(*(self._ensure(c) for c in self._children))

    async def _ensure(self, child: _Child) -> None:
        if child.ready and child.alive:
            return
        task = self._starting.get(id(child))
        if task is None:
            task = asyncio.get_running_loop().create_task(child.start(self.domain, self.policy))
            self._starting[id(child)] = task
            task.add_done_callback(lambda _: self._starting.pop(id(child), None))
        await asyncio.shield(task)

    async def compile(self, constraint: Any, *, want: Want = "stored") -> Built:
        """Compile `constraint` in a child within the limits.

        Raises the constraint's typed RequestError, ConstraintTooComplex(limit=...) when a limit
        stopped it, InternalError when the child crashed."""
        queue = self._queue()
        child = await queue.get()
        try:
            return await self._run(child, constraint, want)
        finally:
            queue.put_nowait(child)

    async def _run(self, child: _Child, constraint: Any, want: Want) -> Built:
        try:
            await self._ensure(child)
            start_rss = child.rss()
            await child.send(("compile", constraint, want))
            deadline = time.monotonic() + self.limits.deadline_s
            kind, payload = await self._watch(child, start_rss, deadline)
            if kind == "error":
                raise error_from_dict(payload)
            # Serialising runs within the same deadline: the caller's wait for a cold compile
            # (validation, conversion, vocabulary compilation and the blob) never exceeds it.
            _, (info, blob) = await self._watch(child, start_rss, deadline)
        except ChildDied as exc:
            log.error("grammar_compile_child_died", detail=str(exc))
            await child.kill()
            raise InternalError(f"the grammar compile process died: {exc}") from None
        except asyncio.CancelledError:
            await asyncio.shield(child.kill())  # nothing may keep compiling for nobody
            raise
        if self.limits.memory_bytes < child.rss() - child.ready_rss:
            log.info("grammar_compile_child_recycled", rss=child.rss())
            await child.kill()
        return Built(info, blob)

    async def _watch(self, child: _Child, start_rss: int, deadline: float) -> Any:
        reply = asyncio.get_running_loop().create_task(child.receive())
        try:
            while True:
                done, _ = await asyncio.wait({reply}, timeout=self.poll_s)
                if done:
                    return reply.result()
                grown = child.rss() - start_rss
                if start_rss and grown > self.limits.memory_bytes:
                    await self._stop(child, "compile_memory_bytes", self.limits.memory_bytes,
                                     f"grew the compiling process by {grown} bytes, over the "
                                     f"compile memory budget of {self.limits.memory_bytes} bytes")
                if time.monotonic() > deadline:
                    await self._stop(child, "compile_deadline_s", self.limits.deadline_s,
                                     f"did not finish within the compile deadline of "
                                     f"{self.limits.deadline_s:g} s")
        finally:
            if not reply.done():
                reply.cancel()
            await asyncio.gather(reply, return_exceptions=True)  # retrieved, whatever it ended with

    async def _stop(self, child: _Child, limit: str, value: float, what: str) -> None:
        self.kills[limit] += 1
        log.warning("grammar_compile_stopped", limit=limit, value=value)
        await child.kill()
        raise ConstraintTooComplex(f"the constraint is too complex: its compile {what}; simplify "
                                   "it (fewer properties, alternatives or bounded repetitions)",
                                   limit=limit, value=value)

    async def aclose(self) -> None:
        """Kill every child now (a compile in flight ends with InternalError or is cancelled)."""
        for task in list(self._starting.values()):
            task.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        await asyncio.gather(*(c.kill() for c in self._children), return_exceptions=True)
