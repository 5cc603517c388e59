"""Integrity failures take the Engine to its unavailable boundary; deadlines are checked before
queueing.

Design document: "Runtime integrity errors are never wrapped as user schema errors. A broken row
membership, a matcher that cannot roll back or a GPU physical commit that cannot complete keeps
the Engine's existing unavailable boundary." Issue: "... takes the Engine to its unavailable
boundary (drain, typed errors, health unhealthy until recovered) instead of serving on; a request
whose deadline passed during a cold compile is refused before it is queued, not after `Started`."
The seed: "after the library call returns and before queueing, the deadline and Engine state are
checked again."
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.grammar.engines import engine_llguidance
from services.worker.engine import engine as engine_module
from services.worker.program import Program, StepBatch
from shared.contract import OutputConstraint
from shared.errors import DeadlineExceeded, ServiceUnavailable
from shared.generation import FinishReason, Started
from tests.support.worker_support import (
    collect,
    greedy,
    open_client,
    oracle_greedy,
    text_of,
    text_request,
    tiny_runtime,
)


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


def _expect(runtime, prompt: str, n: int) -> str:
    return text_of(runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(prompt), n))


class _HeldRebuild:
    """Engine.build blocked until `release()` after its first call (the constructor's), so the
    test sees the engine while it is unavailable."""

    def __init__(self, monkeypatch) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        original = engine_module.Engine.build
        calls = {"n": 0}

        def build(engine):
            calls["n"] += 1
            if calls["n"] > 1:
                self.entered.set()
                assert self.go.wait(30)
            original(engine)

        monkeypatch.setattr(engine_module.Engine, "build", build)
        self.calls = calls

    def release(self) -> None:
        self.go.set()


async def _while_unavailable(client, runtime, held: _HeldRebuild) -> None:
    """Health is unavailable and new requests are refused typed until the rebuild ends; then the
    engine serves again, exactly (the new Program's output is the oracle's)."""
    assert await asyncio.to_thread(held.entered.wait, 30)
    health = await client.health()
    assert health["status"] == "unavailable" and not health["ready"], health
    with pytest.raises(ServiceUnavailable):
        await collect(client, text_request("refused", "x", greedy(3), runtime.name))
    held.release()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (await client.health())["status"] != "ok":
        assert loop.time() < deadline, "the engine never recovered"
        await asyncio.sleep(0.02)
    deltas, done = await collect(client, text_request("after", "again", greedy(6), runtime.name))
    assert done.error is None and "".join(deltas) == _expect(runtime, "again", 6)


async def _two_running(client, runtime, n: int = 30):
    jobs = [asyncio.ensure_future(collect(client, text_request(name, name, greedy(n),
                                                                runtime.name)))
            for name in ("left", "right")]
    return jobs


def _unavailable_end(results) -> None:
    for _, done in results:
        assert done.finish_reason is FinishReason.ERROR
        assert done.error["type"] == "ServiceUnavailable", done.error


@pytest.mark.asyncio
async def test_a_failed_program_commit_takes_the_engine_to_its_unavailable_boundary(
        runtime, monkeypatch):
    original = Program.commit
    calls = {"n": 0}

    def failing(self, pending, kept):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("injected: the physical commit did not complete")
        return original(self, pending, kept)

    monkeypatch.setattr(Program, "commit", failing)
    held = _HeldRebuild(monkeypatch)
    client = open_client(runtime, max_batch=2, max_len=96)
    try:
        jobs = await _two_running(client, runtime)
        await _while_unavailable(client, runtime, held)
        results = await asyncio.gather(*jobs)
        _unavailable_end(results)
        assert "the Program commit failed" in results[0][1].error["message"]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_a_matcher_that_cannot_roll_back_takes_the_engine_to_its_unavailable_boundary(
        runtime, monkeypatch):
    """A constrained request's lookahead (any mask fill with drafts or a preview discard rolls
    back); here the preview of a round that aborts is discarded: every preview's rollback runs."""

    def rollback(self, n):
        raise RuntimeError("injected: rollback lost the state")

    monkeypatch.setattr(engine_llguidance.LlguidanceMatcher, "rollback", rollback)
    from services.worker.output.session import OutputSession

    original = OutputSession.preview
    calls = {"n": 0}

    def preview(self, tokens, **kw):
        result = original(self, tokens, **kw)
        if self.constrained:
            calls["n"] += 1
            if calls["n"] == 3:
                self.discard()  # the rollback of a pending preview
        return result

    monkeypatch.setattr(OutputSession, "preview", preview)
    held = _HeldRebuild(monkeypatch)
    client = open_client(runtime, max_batch=2, max_len=96)
    try:
        schema = OutputConstraint.json_schema({"type": "object"})
        job = asyncio.ensure_future(collect(client, text_request(
            "json", "j", greedy(20, constraint=schema), runtime.name)))
        await _while_unavailable(client, runtime, held)
        _unavailable_end([await job])
        assert "could not roll back" in (await job)[1].error["message"]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_a_broken_batch_membership_takes_the_engine_to_its_unavailable_boundary(
        runtime, monkeypatch):
    from services.worker.engine.scheduler import Scheduler

    original = Scheduler.schedule
    calls = {"n": 0}

    def schedule(self):
        batch = original(self)
        if batch is not None and len(batch.rows) == 2:
            calls["n"] += 1
            if calls["n"] == 4:  # one row twice: two rows of one lane
                return StepBatch((batch.rows[0], batch.rows[0]))
        return batch

    monkeypatch.setattr(Scheduler, "schedule", schedule)
    held = _HeldRebuild(monkeypatch)
    client = open_client(runtime, max_batch=2, max_len=96)
    try:
        jobs = await _two_running(client, runtime)
        await _while_unavailable(client, runtime, held)
        results = await asyncio.gather(*jobs)
        _unavailable_end(results)
        assert "broken batch membership" in results[0][1].error["message"]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_a_deadline_spent_in_a_cold_compile_is_refused_before_queueing(runtime):
    client = open_client(runtime, max_batch=2, max_len=96)
    grammar = client.engine.grammar
    original = grammar.compile

    async def slow(*args, **kwargs):  # a cold compile outlasting the request's deadline
        await asyncio.sleep(0.6)
        return await original(*args, **kwargs)

    grammar.compile = slow
    try:
        queued: list = []
        client.engine.finish_listeners.append(queued.append)
        stream = client.generate(text_request("late", "x", greedy(
            4, constraint=OutputConstraint.regex("[a-z]+"), timeout_s=0.3), runtime.name))
        events = []
        with pytest.raises(DeadlineExceeded):
            async for event in stream:
                events.append(event)
        assert not any(isinstance(e, Started) for e in events)
        assert not queued and not client.engine.live_requests()
        assert client.engine.steps == 0
    finally:
        grammar.compile = original
        await client.aclose()
