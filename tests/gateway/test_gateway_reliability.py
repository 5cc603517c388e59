"""Gateway side of issue 12: a non-streaming request whose client went away is cancelled at the
worker (item 4), and the typed overload / unavailable / too-complex errors map to each protocol's
status, error shape and Retry-After (items 2 and 8)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

import aiohttp
import pytest

from services.gateway.errors import status_of
from shared.errors import (
    ConstraintTooComplex,
    GrammarServiceUnavailable,
    InfernixError,
    InternalError,
    Overloaded,
    error_from_dict,
)
from shared.generation import FinishReason
from tests.support.fake_worker import FakeWorker, Script, running_gateway

MODEL = "smollm2"
BODIES = {"/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
          "/v1/messages": {"model": MODEL, "max_tokens": 9,
                           "messages": [{"role": "user", "content": "hi"}]}}


async def _wait_for(predicate, steps: int = 200) -> None:
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
async def test_non_streaming_client_disconnect_cancels_at_the_worker(route):
    """Issue 12 item 4: "Non-streaming requests whose client disconnected run to their token
    limit. Cancel them as streaming ones are": a client that closes its connection while an
    aggregate response is being generated gets its generation cancelled at the worker, before
    the worker finished it."""
    worker = FakeWorker(Script(text=tuple("abcdefghijklmnopqrstuvwxyz" * 4), delay_s=0.05))
    body = BODIES.get(route, {"model": MODEL, "input": "hi"})
    async with running_gateway(worker) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        data = json.dumps(body).encode()
        writer.write(f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
        await _wait_for(lambda: worker.requests)
        assert worker.requests, "the request reached the worker"
        writer.close()
        await writer.wait_closed()
        await _wait_for(lambda: worker.cancelled)
    request_id = worker.last.request_id
    assert worker.cancelled == [request_id]
    assert request_id not in worker.finished


def _error(cls: type, message: str, **extra) -> InfernixError:
    return error_from_dict({"type": cls.__name__, "message": message, **extra})


@pytest.mark.asyncio
@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("error, status, code, anthropic_type", [
    (_error(GrammarServiceUnavailable, "the grammar service is unreachable", retry_after_s=2.5),
     503, "grammar_service_unavailable", "overloaded_error"),
    (_error(Overloaded, "the waiting queue is full", retry_after_s=1), 429, "overloaded",
     "rate_limit_error"),
])
async def test_dependency_failures_are_typed_with_retry_after(route, error, status, code,
                                                              anthropic_type):
    """Issue 12: "let a waiter for a slot time out with a typed 429/503 and a Retry-After, never a
    500"; "Dependency failures are typed (a 503 grammar_service_unavailable, not 500
    internal_error)", in each protocol's error shape."""
    worker = FakeWorker(Script(raise_before=error))
    async with running_gateway(worker) as url, aiohttp.ClientSession() as http:
        async with http.post(url + route, json=BODIES[route]) as r:
            payload = await r.json()
            assert r.status == status, payload
            retry = r.headers["Retry-After"]
    assert int(retry) >= 1
    if error.retry_after_s:
        assert int(retry) >= error.retry_after_s
    if route == "/v1/messages":
        assert payload["error"]["type"] == anthropic_type
    else:
        assert payload["error"]["code"] == code


@dataclass
class _SlotsFullProbe(InfernixError):
    """An error class no gateway module names, overloaded by its fault alone."""

    fault: ClassVar[str] = "overloaded"


@dataclass
class _DependencyDownProbe(InfernixError):
    fault: ClassVar[str] = "unavailable"


@pytest.mark.parametrize("error, status", [
    (_SlotsFullProbe("slots full"), 429), (_DependencyDownProbe("down"), 503),
    (ConstraintTooComplex("big"), 400), (InternalError("bug"), 500)])
def test_statuses_follow_the_fault_not_the_type_name(error, status):
    """shared/errors.py: "request" errors map to 4xx, "internal" ones to 5xx, "overloaded" to 429
    and "unavailable" to 503: the gateway reads the error's `fault`, so a class it has never heard
    of maps by what it declares (a request error found while generating is a 422)."""
    assert status_of(error) == status
    assert status_of(error, started=True) == (422 if status == 400 else status)


@pytest.mark.asyncio
async def test_constraint_too_complex_names_the_constraint():
    """Issue 12 item 2: a compile past its limits is a typed 4xx (`ConstraintTooComplex` naming
    the limit): 400 before generation, naming the constraint's field; 422 if found while
    generating."""
    too_complex = _error(ConstraintTooComplex, "the schema needs more than 2 s to compile",
                         limit="compile_seconds")
    worker = FakeWorker(Script(raise_before=too_complex))
    body = {**BODIES["/v1/chat/completions"],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "s", "schema": {"type": "object"}}}}
    async with running_gateway(worker) as url, aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            payload = await r.json()
            assert r.status == 400
        err = payload["error"]
        assert (err["code"], err["param"]) == ("constraint_too_complex", "response_format")
        assert "compile_seconds" in err["message"]
        worker.reset(Script(text=("x",), error=too_complex.to_dict()))
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 422
            assert (await r.json())["error"]["code"] == "constraint_too_complex"


@pytest.mark.asyncio
async def test_a_client_leaving_a_stream_of_several_choices_cancels_them_all():
    """A stream of n=3 choices whose client goes away: every choice is cancelled at the worker
    and none runs to its end."""
    worker = FakeWorker(Script(text=tuple("abcdefghijklmnopqrst" * 3), delay_s=0.05))
    async with running_gateway(worker) as url:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/chat/completions", json={
                    **BODIES["/v1/chat/completions"], "n": 3, "stream": True}) as r:
                assert r.status == 200
                await r.content.readline()
        await _wait_for(lambda: len(worker.cancelled) == 3)
    assert sorted(worker.cancelled) == sorted(r.request_id for r in worker.requests)
    assert worker.finished == []


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_generation_cut_by_a_draining_worker_is_a_typed_503(stream):
    """Issue 12 §6/§8: a worker's drain cancels what outlives its grace period with a terminal
    event (Finished CANCELLED); the client gets a typed 503 `service_unavailable` with a
    Retry-After (a terminal error event with that code when streaming), not `500 internal_error`."""
    worker = FakeWorker(Script(text=("par", "tial"), finish_reason=FinishReason.CANCELLED))
    body = {**BODIES["/v1/chat/completions"], "stream": stream}
    async with running_gateway(worker) as url, aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            if not stream:
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
                error = (await r.json())["error"]
            else:
                assert r.status == 200
                chunks = [json.loads(line[6:]) for line in (await r.text()).splitlines()
                          if line.startswith("data: {")]
                error = chunks[-1]["error"]
    assert error["code"] == "service_unavailable", error


@pytest.mark.asyncio
async def test_health_and_readiness_behind_a_pool_report_the_workers_dependencies():
    """Issue 12 §1: "health reports the degraded state (`/healthz` stays 200 with a `degraded`
    field; a readiness endpoint says what is missing)", also in the compose deployment, where the
    gateway's worker is a pool (before, the pool's health said nothing of the workers' grammar
    service or Redis, so /healthz was never degraded by them and /readyz always ready)."""
    from services.gateway.pool import WorkerPool

    class Reporting(FakeWorker):
        state: dict = {}

        async def health(self):
            return {**await super().health(), **self.state}

    a, b = Reporting(), Reporting()
    a.state = {"degraded": True, "missing": ["grammar_service"], "ready": True}
    pool = WorkerPool([a, b], health_interval_s=60)
    try:
        async with running_gateway(pool) as url, aiohttp.ClientSession() as http:
            await pool.check_health()

            async def get(path):
                async with http.get(url + path) as r:
                    return r.status, await r.json()

            status, body = await get("/healthz")
            assert (status, body["degraded"]) == (200, True)
            assert await get("/readyz") == (200, {"status": "ready", "degraded": True,
                                                  "missing": ["grammar_service"]})
            b.healthy = False  # out of the pool after two failed checks
            await pool.check_health()
            await pool.check_health()
            a.state = {"degraded": True, "missing": ["grammar_service", "redis"], "ready": False}
            await pool.check_health()
            assert await get("/readyz") == (503, {"status": "not_ready", "degraded": True,
                                                  "missing": ["grammar_service", "redis",
                                                              "worker"]})
            assert (await get("/healthz"))[0] == 200  # still serving (L1 grammars, plain text)
            a.state, b.healthy = {"degraded": False, "missing": [], "ready": True}, True
            await pool.check_health()
            assert await get("/readyz") == (200, {"status": "ready", "degraded": False,
                                                  "missing": []})
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_worker_that_answers_health_but_cannot_serve_leaves_the_rotation():
    """A worker whose engine stopped still answers Health (status "stopped") and refused every
    request with 500 "the engine is not running"; the pool kept routing to it. Now its status
    takes it out like a failed check, and it comes back once it reports "ok"."""
    from services.gateway.pool import WorkerPool

    class Stopped(FakeWorker):
        status: str = "stopped"

        async def health(self):
            return {**await super().health(), "status": self.status}

    broken, fine = Stopped(), FakeWorker()
    pool = WorkerPool([broken, fine], health_interval_s=60)
    try:
        await pool.check_health()
        await pool.check_health()
        assert [m.healthy for m in pool.members] == [False, True]
        for i in range(3):
            _ = [e async for e in pool.generate(dataclasses.replace(
                _chat_request(), request_id=f"r{i}"))]
        assert broken.requests == [] and len(fine.requests) == 3
        broken.status = "ok"
        await pool.check_health()
        assert pool.members[0].healthy
    finally:
        await pool.aclose()


def _chat_request():
    from shared.generation import ChatMessage, GenerateRequest, PromptInput

    return GenerateRequest("r", PromptInput(messages=(ChatMessage("user", "hi"),)), model=MODEL)


@pytest.mark.asyncio
async def test_a_worker_refusing_because_it_cannot_serve_passes_the_request_on():
    """A worker that refuses a request because it cannot serve at all (ServiceUnavailable naming
    the worker, e.g. its engine stopped) is taken out and the request runs on another worker; a
    refusal naming another service (the grammar service) is the request's answer."""
    from services.gateway.pool import WorkerPool
    from shared.errors import GrammarServiceUnavailable, ServiceUnavailable

    down = FakeWorker(Script(raise_before=ServiceUnavailable("the engine is not running",
                                                             service="worker")))
    fine = FakeWorker(Script(text=("ok",)))
    pool = WorkerPool([down, fine], health_interval_s=60)
    try:
        events = [e async for e in pool.generate(_chat_request())]
        assert events[-1].content == "ok" and len(down.requests) == 1
        assert [m.healthy for m in pool.members] == [False, True]
        fine.reset(Script(raise_before=GrammarServiceUnavailable("down", service="grammar")))
        with pytest.raises(GrammarServiceUnavailable):
            await anext(pool.generate(_chat_request()))
        assert pool.members[1].healthy
    finally:
        await pool.aclose()
