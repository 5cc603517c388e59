"""WorkerPool: least-outstanding balancing, health checks, failover; in process and over gRPC."""

from __future__ import annotations

import asyncio
import random
import time

import openai
import pytest

from services.gateway.pool import WorkerPool
from services.worker.remote import GrpcWorkerClient
from services.worker.service import create_server
from shared.errors import InvalidSchema, SchemaSource, ServiceUnavailable
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    Started,
    TextDelta,
)
from tests.conftest import free_port
from tests.support.fake_worker import FakeWorker, Script, running_gateway

SLOW = Script(text=tuple("abcdefghijklmnopqrst"), delay_s=0.02)


def request(rid: str, model: str = "smollm2") -> GenerateRequest:
    return GenerateRequest(rid, PromptInput(text="x"), model=model)


def owner(fakes: list[FakeWorker], rid: str) -> int:
    """Which fake received request `rid` (exactly one must have)."""
    found = [i for i, f in enumerate(fakes) if rid in {r.request_id for r in f.requests}]
    assert len(found) == 1, f"{rid} reached workers {found}"
    return found[0]


async def _eventually(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_least_outstanding_balancing():
    """'The gateway spreads requests over workers (least outstanding requests)': with streams
    held open and closed in a random order, each new request lands on a worker whose open-stream
    count (tracked here, independently of the pool) is the minimum."""
    fakes = [FakeWorker(script=Script(text=tuple("abc"))), FakeWorker(script=Script(text=("z",)))]
    pool = WorkerPool(fakes, health_interval_s=60)
    rng = random.Random(7)
    open_streams: dict[str, object] = {}
    counts = [0, 0]
    try:
        for step in range(40):
            if open_streams and rng.random() < 0.4:
                rid = rng.choice(sorted(open_streams))
                stream = open_streams.pop(rid)
                if rng.random() < 0.5:
                    rest = [e async for e in stream]  # run to the end
                    assert isinstance(rest[-1], Finished)
                else:
                    await stream.aclose()  # the client went away
                counts[owner(fakes, rid)] -= 1
            else:
                rid = f"r{step}"
                stream = pool.generate(request(rid))
                first = await anext(stream)  # the worker's Started, then its first output
                assert isinstance(first, Started) and isinstance(await anext(stream), TextDelta)
                got = owner(fakes, rid)
                assert counts[got] == min(counts), (step, counts, got)
                counts[got] += 1
                open_streams[rid] = stream
            assert [m.outstanding for m in pool.members] == counts
        assert all(fakes[i].requests for i in (0, 1))
    finally:
        for stream in open_streams.values():
            await stream.aclose()
        await pool.aclose()
    assert [m.outstanding for m in pool.members] == [0, 0]


@pytest.mark.asyncio
async def test_unhealthy_worker_is_skipped_and_readded():
    """'removes a worker that fails health checks ... and adds it back when it recovers':
    failure_threshold failed checks take it out (requests and models() skip it), one good check
    brings it back."""
    a, b = FakeWorker(served=("smollm2", "qwen3.5")), FakeWorker(served=("smollm2",))
    pool = WorkerPool([a, b], health_interval_s=60, failure_threshold=2)
    try:
        assert await pool.models() == ["smollm2", "qwen3.5"]
        a.healthy = False
        await pool.check_health()
        assert pool.members[0].healthy  # one failure is below the threshold
        await pool.check_health()
        assert not pool.members[0].healthy
        assert await pool.models() == ["smollm2"]
        for i in range(4):
            _ = [e async for e in pool.generate(request(f"skip{i}"))]
            assert owner([a, b], f"skip{i}") == 1
        b.healthy = False
        await pool.check_health()
        await pool.check_health()
        with pytest.raises(ServiceUnavailable, match="no healthy worker"):
            await pool.health()
        with pytest.raises(ServiceUnavailable, match="no healthy worker"):
            await anext(pool.generate(request("none")))
        with pytest.raises(ServiceUnavailable, match="no healthy worker"):
            await pool.models()
        a.healthy = b.healthy = True
        await pool.check_health()
        assert (await pool.health())["healthy"] == 2
        # Back in rotation: with b busy, the next request goes to a.
        b.script = SLOW
        held = pool.generate(request("hold-b"))
        await anext(held)
        assert owner([a, b], "hold-b") in (0, 1)
        other = pool.generate(request("next"))
        await anext(other)
        assert {owner([a, b], "hold-b"), owner([a, b], "next")} == {0, 1}
        await held.aclose()
        await other.aclose()
        # A model only `a` serves goes to `a` even when `a` is busier.
        a.script = SLOW
        busy = [pool.generate(request(f"busy{i}")) for i in range(2)]
        for s in busy:
            await anext(s)
        q = pool.generate(request("qwen", model="qwen3.5"))
        await anext(q)
        assert owner([a, b], "qwen") == 0
        for s in (*busy, q):
            await s.aclose()
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_background_health_checks_remove_and_readd():
    """The pool checks health by itself every health_interval_s."""
    a, b = FakeWorker(), FakeWorker()
    pool = WorkerPool([a, b], health_interval_s=0.02, failure_threshold=2)
    try:
        await pool.models()  # first use starts the checks
        a.healthy = False
        await _eventually(lambda: not pool.members[0].healthy)
        a.healthy = True
        await _eventually(lambda: pool.members[0].healthy)
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_connection_error_before_first_event_retries_once():
    """'whose generate fails with a connection error before the first event: then retry the
    request once on another worker'; the failed worker is taken out at once."""
    a, b = FakeWorker(script=Script(die_after=0)), FakeWorker(script=SLOW)
    pool = WorkerPool([a, b], health_interval_s=60, failure_threshold=1)
    try:
        a.healthy = False
        await pool.check_health()  # `a` out, so that the held stream lands on `b`
        hold = pool.generate(request("hold"))
        await anext(hold)
        a.healthy = True
        await pool.check_health()  # `a` back, and now the least loaded
        assert owner([a, b], "hold") == 1 and pool.members[0].healthy
        b.script = Script(text=("o", "k"))
        events = [e async for e in pool.generate(request("retry"))]
        assert [r.request_id for r in a.requests] == ["retry"]
        assert [r.request_id for r in b.requests] == ["hold", "retry"]
        assert events == [e async for e in FakeWorker(script=Script(text=("o", "k"))).generate(
            request("retry"))]
        assert not pool.members[0].healthy
        await hold.aclose()
        # Both dead: one retry, then an internal error before any event.
        await pool.check_health()
        assert pool.members[0].healthy
        b.reset(Script(die_after=0))
        with pytest.raises(ServiceUnavailable, match="could not be reached"):
            await anext(pool.generate(request("both")))
        assert [r.request_id for r in a.requests] == ["retry", "both"]
        assert [r.request_id for r in b.requests] == ["both"]
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_worker_dying_mid_stream_and_cancel_routing():
    """A worker dying mid-stream gives its client Finished(ERROR, ServiceUnavailable naming
    the worker: a dependency failure, issue 12 §8) and is taken out, while the request on the
    other worker continues to its normal end; cancel routes to the worker holding the request."""
    a = FakeWorker(script=Script(text=tuple("abcdef"), die_after=3, delay_s=0.01))
    b = FakeWorker(script=Script(text=tuple("uvwxyz"), delay_s=0.01))
    pool = WorkerPool([a, b], health_interval_s=60)
    try:
        s1, s2 = pool.generate(request("s1")), pool.generate(request("s2"))
        await anext(s1)  # Started (held by the pool until the first output event arrived)
        await anext(s2)
        on_a = "s1" if owner([a, b], "s1") == 0 else "s2"
        on_b = "s2" if on_a == "s1" else "s1"
        streams = {"s1": s1, "s2": s2}
        await pool.cancel(on_b)
        assert b.cancelled == [on_b] and a.cancelled == []
        dead = [e async for e in streams[on_a]]
        assert isinstance(dead[-1], Finished) and dead[-1].finish_reason is FinishReason.ERROR
        assert dead[-1].error["type"] == "ServiceUnavailable"
        assert dead[-1].error["service"] == "worker" and dead[-1].error["retry_after_s"] >= 1
        assert "connection lost" in dead[-1].error["message"]
        assert not pool.members[0].healthy
        alive = [e async for e in streams[on_b]]
        assert "".join(e.text for e in alive if isinstance(e, TextDelta)) == "uvwxyz"
        assert alive[-1].finish_reason is FinishReason.STOP
        _ = [e async for e in pool.generate(request("after"))]
        assert owner([a, b], "after") == 1
        prompt = PromptInput(messages=(ChatMessage("user", "a b c"),))
        assert await pool.count_tokens(prompt, "smollm2") == await b.count_tokens(prompt, "smollm2")
        # A typed request error before the first event passes through unchanged, never retried.
        error = InvalidSchema("bad minimum", pointer="/properties/x/minimum",
                              source=SchemaSource.TOOL_ARGUMENTS, tool_index=0, tool_name="f")
        b.reset(Script(raise_before=error))
        with pytest.raises(InvalidSchema) as caught:
            await anext(pool.generate(request("typed")))
        assert caught.value is error and [r.request_id for r in b.requests] == ["typed"]
        assert pool.members[1].healthy and pool.members[1].outstanding == 0
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_gateway_over_grpc_pool_survives_a_worker_stopping_mid_stream():
    """'SSE streams end with the protocol's own terminal event': two gRPC workers behind the
    pool; the one serving a stream is stopped mid-stream, the openai SDK sees the terminal error
    chunk (APIError), and the next request succeeds on the other worker."""
    fakes = [FakeWorker(script=SLOW), FakeWorker(script=SLOW)]
    servers, clients = [], []
    for fake in fakes:
        server = create_server(fake)
        port = free_port()
        await server.start("127.0.0.1", port)
        servers.append(server)
        clients.append(GrpcWorkerClient("127.0.0.1", port, timeout_s=2.0))
    pool = WorkerPool(clients, health_interval_s=60)
    try:
        async with running_gateway(pool) as url, \
                openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as sdk:
            stream = await sdk.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], stream=True)
            seen = []
            with pytest.raises(openai.APIError) as info:
                async for chunk in stream:
                    seen.append(chunk)
                    if len(seen) == 3:
                        rid = next(f.last.request_id for f in fakes if f.requests)
                        victim = owner(fakes, rid)
                        servers[victim].close()
            assert info.value.body["type"] == "server_error"
            assert info.value.body["code"] == "service_unavailable"  # typed, not internal_error
            text = "".join(c.choices[0].delta.content or "" for c in seen)
            assert text and "abcdefghijklmnopqrst".startswith(text)
            assert text != "abcdefghijklmnopqrst"
            await _eventually(lambda: fakes[victim].cancelled == [rid])
            survivor = 1 - victim
            fakes[survivor].reset(Script(text=("fine",)))
            reply = await sdk.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "again"}])
            assert reply.choices[0].message.content == "fine"
            assert len(fakes[survivor].requests) == 1
            assert len(fakes[victim].requests) == 1
    finally:
        await pool.aclose()
        for server in servers:
            server.close()
            await server.wait_closed()
