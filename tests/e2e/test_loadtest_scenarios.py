"""Every load-test scenario (loadtest/scenarios.py, what locustfile.py and run.py send) is a request
the real gateway serves successfully, so the load test cannot silently measure errors; and run.py's
accounting tells a typed failure from an untyped or lost one."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))
from run import Outcome, _stream_outcome, one_request  # noqa: E402
from scenarios import Scenario, scenarios  # noqa: E402


@pytest.fixture(scope="module")
def gateway():
    """The gateway in front of a small random-weight engine (tests/support/worker_support.py)."""
    import asyncio
    import dataclasses
    import threading

    from aiohttp import web

    from services.gateway import create_app
    from tests.conftest import free_port
    from tests.support.worker_support import open_client, tiny_runtime

    runtime = dataclasses.replace(tiny_runtime(), name="smollm2")  # the name the mix asks for
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {}

    async def start() -> None:
        state["worker"] = open_client(runtime, max_batch=4, max_len=2048)
        state["runner"] = web.AppRunner(create_app(state["worker"]))
        await state["runner"].setup()
        await web.TCPSite(state["runner"], "127.0.0.1", port).start()
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()),
                              daemon=True)
    thread.start()
    assert ready.wait(60)
    yield f"http://127.0.0.1:{port}"

    async def stop() -> None:
        await state["runner"].cleanup()
        await state["worker"].aclose()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_every_scenario_succeeds(gateway: str) -> None:
    """Each scenario once, through run.py's accounting (a stream must end with its protocol's
    terminal event: [DONE], message_stop, response.completed/incomplete)."""
    import asyncio

    import aiohttp

    mix = scenarios(random.Random(0), max_tokens=24)
    assert {s.name for s in mix} >= {"chat", "chat_stream", "json_schema", "tool_call"}
    assert {s.path for s in mix} == {"/v1/chat/completions", "/v1/messages", "/v1/responses",
                                     "/v1/completions"}

    async def send_all() -> list[Outcome]:
        async with aiohttp.ClientSession() as session:
            return [await one_request(session, gateway, s, 120) for s in mix]

    for scenario, outcome in zip(mix, asyncio.run(send_all())):
        assert outcome.outcome == "ok", (scenario.name, outcome)


def test_stream_accounting_tells_typed_untyped_and_lost_apart() -> None:
    """A stream's end decides its outcome: an error event with a code is typed, one saying only
    internal_error (Anthropic: api_error) is untyped, a stream without its terminal event is
    lost."""
    chat = Scenario("s", 1, "/v1/chat/completions", {}, stream=True)
    messages = Scenario("m", 1, "/v1/messages", {}, stream=True)
    chunk = 'data: {"choices": []}\n\n'
    assert _stream_outcome(chat, chunk + "data: [DONE]\n\n", 0).outcome == "ok"
    assert _stream_outcome(chat, chunk, 0).outcome == "lost"
    typed = _stream_outcome(chat, chunk + 'data: {"error": {"code": "service_unavailable", '
                            '"message": "m"}}\n\ndata: [DONE]\n\n', 0)
    assert (typed.outcome, typed.code) == ("typed", "service_unavailable")
    untyped = _stream_outcome(chat, 'data: {"error": {"code": "internal_error", "message": "m"}}'
                              '\n\ndata: [DONE]\n\n', 0)
    assert untyped.outcome == "untyped"
    assert _stream_outcome(messages, 'event: error\ndata: {"type": "error", "error": {"type": '
                           '"api_error", "message": "m"}}\n\n', 0).outcome == "untyped"
    assert _stream_outcome(messages, 'event: error\ndata: {"type": "error", "error": {"type": '
                           '"overloaded_error", "message": "m"}}\n\n', 0).outcome == "typed"
    assert _stream_outcome(messages, 'event: message_stop\ndata: {"type": "message_stop"}\n\n',
                           0).outcome == "ok"
