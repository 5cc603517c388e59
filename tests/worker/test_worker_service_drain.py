"""A worker's graceful stop with real processes: `infernix worker serve` on the built-in model.

Issue 12 §6: "On SIGTERM a worker stops taking new requests, finishes what it runs within a grace
period (`--drain-seconds`), then cancels the rest with a terminal event; the gateway stops routing
to it at once" (before, 4 of 4 running streams ended with an internal error on SIGTERM).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.worker.remote import GrpcWorkerClient, WorkerUnavailable
from shared.contract import OutputConstraint
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    TextDelta,
)
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


# A language without an end: the output runs until its token limit (or the drain cancels it).
ENDLESS = OutputConstraint.grammar("root ::= [a-z ] root")


def _request(rid: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(rid, PromptInput(messages=(ChatMessage("user", "Say something."),)),
                           RequestOptions(max_tokens=max_tokens, constraint=ENDLESS,
                                          sampling=SamplingParams(temperature=0.7, seed=1)))


async def _run(client: GrpcWorkerClient, request: GenerateRequest, started: asyncio.Event):
    events = []
    async for event in client.generate(request):
        events.append(event)
        if isinstance(event, TextDelta):
            started.set()
    return events


@pytest.mark.asyncio
async def test_sigterm_drains_running_streams_then_cancels_the_rest(tmp_path):
    port = free_port()
    env = dict(os.environ, INFERNIX_PORT=str(port), INFERNIX_LANES="4", INFERNIX_MAX_LEN="1024",
               INFERNIX_DRAIN_SECONDS="4", INFERNIX_LOG_LEVEL="WARNING")
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "serve"], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=log)
    client = GrpcWorkerClient("127.0.0.1", port, timeout_s=2.0)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                await client.health()
                break
            except (WorkerUnavailable, ConnectionError):
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()
                assert time.monotonic() < deadline, "the worker did not become healthy"
                await asyncio.sleep(0.3)
        flags = [asyncio.Event() for _ in range(4)]
        # Two short streams finish inside the grace period; two long ones outlive it.
        tasks = [asyncio.ensure_future(_run(client, _request(f"r{i}", n), flags[i]))
                 for i, n in enumerate((6, 6, 900, 900))]
        await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 120)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        with pytest.raises(WorkerUnavailable):  # no new work once draining
            await anext(client.generate(_request("late", 4)))
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert proc.wait(timeout=30) == 0
    finally:
        await client.aclose()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for i, events in enumerate(results):
        last = events[-1]
        assert isinstance(last, Finished), events[-3:]
        assert last.error is None, last.error
        if i < 2:
            assert last.finish_reason is FinishReason.LENGTH and last.usage.completion_tokens == 6
        else:  # cancelled at the end of the grace period, with its terminal event
            assert last.finish_reason is FinishReason.CANCELLED
            assert last.content and last.usage.completion_tokens < 900
