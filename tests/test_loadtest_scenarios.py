"""Every load-test scenario (loadtest/scenarios.py, what locustfile.py sends) is a request the real
gateway serves successfully, so the load test cannot silently measure errors."""

from __future__ import annotations

import json
import random
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtest"))
from scenarios import scenarios  # noqa: E402


@pytest.fixture(scope="module")
def gateway():
    """The gateway in front of a small random-weight engine (tests/worker_support.py)."""
    import asyncio
    import dataclasses
    import threading

    from aiohttp import web

    from services.gateway import create_app
    from tests.conftest import free_port
    from tests.worker_support import open_client, tiny_runtime

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
    mix = scenarios(random.Random(0), max_tokens=24)
    assert {s.name for s in mix} >= {"chat", "chat_stream", "json_schema", "tool_call"}
    for scenario in mix:
        request = urllib.request.Request(gateway + scenario.path, data=json.dumps(scenario.body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            body = reply.read()
        assert reply.status == 200, scenario.name
        if scenario.stream:
            assert b'"error"' not in body and b"data: [DONE]" in body, scenario.name
        else:
            assert "error" not in json.loads(body), scenario.name
