"""Admission control: a bounded waiting queue per worker, refusals typed with a Retry-After, and
a pool that passes a refused request on to a worker with room.

Issue 12 §5: "No admission control. 64 concurrent requests against 8 lanes are all admitted ...
A bounded waiting queue per worker (configurable), 429 with Retry-After beyond it, queue time and
rejections in metrics; the gateway's balancer uses the workers' queue depth."
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.gateway.pool import WorkerPool
from shared.errors import Overloaded
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    text_request,
    tiny_runtime,
)


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


async def _held_client(runtime, **config):
    """A client whose engine is held inside its first forward until `release` is set."""
    held, release = threading.Event(), threading.Event()

    def hold(tokens, positions, lanes):
        if not release.is_set():
            held.set()
            release.wait(20)

    hooked_runtime, model = hooked(runtime)
    model.before = hold
    return open_client(hooked_runtime, **config), held, release


@pytest.mark.asyncio
async def test_a_full_waiting_queue_refuses_with_retry_after(runtime):
    client, held, release = await _held_client(runtime, max_batch=1, max_len=96, max_waiting=2)
    try:
        running = asyncio.ensure_future(
            collect(client, text_request("run", "a", greedy(3), runtime.name))
        )
        while not held.is_set():
            await asyncio.sleep(0.005)
        queued = [
            asyncio.ensure_future(
                collect(client, text_request(f"q{i}", "b", greedy(3), runtime.name))
            )
            for i in range(2)
        ]
        while len(client.engine.live_requests()) < 3:
            await asyncio.sleep(0.005)
        with pytest.raises(Overloaded) as info:
            await collect(client, text_request("over", "c", greedy(3), runtime.name))
        assert info.value.resource == "waiting_queue" and info.value.retry_after_s >= 1
        assert client.engine.metrics.rejected.labels(reason="queue_full")._value.get() == 1
        release.set()
        done = await asyncio.gather(running, *queued)
        assert all(fin.finish_reason.value in ("stop", "length") for _, fin in done)
        # Each admission's wait is measured: three requests admitted.
        assert client.engine.metrics.queue_seconds._sum.get() >= 0
        samples = {s.name: s.value for m in client.engine.metrics.registry.collect()
                   for s in m.samples if s.name == "infernix_worker_queue_seconds_count"}
        assert samples["infernix_worker_queue_seconds_count"] == 3
    finally:
        release.set()
        await client.aclose()


@pytest.mark.asyncio
async def test_the_pool_passes_a_refused_request_to_a_worker_with_room(runtime):
    full, held, release = await _held_client(runtime, max_batch=1, max_len=96, max_waiting=0)
    free = open_client(runtime, max_batch=1, max_len=96)
    pool = WorkerPool([full, free], health_interval_s=60)
    try:
        running = asyncio.ensure_future(
            collect(full, text_request("run", "a", greedy(3), runtime.name))
        )
        while not held.is_set():
            await asyncio.sleep(0.005)
        # Both members look idle to the pool (no requests of its own): it tries `full` first
        # (ties rotate from the first), which refuses, and the request runs on `free`.
        _, fin = await collect(pool, text_request("p1", "b", greedy(3), runtime.name))
        assert fin.finish_reason.value in ("stop", "length")
        assert full.engine.metrics.rejected.labels(reason="queue_full")._value.get() == 1
        release.set()
        await running
    finally:
        release.set()
        await pool.aclose()


@pytest.mark.asyncio
async def test_the_pool_answers_overloaded_when_every_worker_is_full(runtime):
    clients = [
        await _held_client(runtime, max_batch=1, max_len=96, max_waiting=0) for _ in range(2)
    ]
    pool = WorkerPool([c for c, _, _ in clients], health_interval_s=60)
    try:
        running = [
            asyncio.ensure_future(collect(c, text_request("run", "a", greedy(3), runtime.name)))
            for c, _, _ in clients
        ]
        for _, held, _ in clients:
            while not held.is_set():
                await asyncio.sleep(0.005)
        with pytest.raises(Overloaded) as info:
            await collect(pool, text_request("p", "b", greedy(3), runtime.name))
        assert info.value.retry_after_s >= 1
        for _, _, release in clients:
            release.set()
        await asyncio.gather(*running)
    finally:
        for _, _, release in clients:
            release.set()
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_burst_is_bounded_while_its_requests_are_still_being_prepared(runtime):
    """Found by the load test with real processes: admission counted only the requests already
    queued, not those admitted and still in prepare (tokenizing, compiling), so a burst of
    concurrent requests all passed it (the issue's '64 concurrent requests against 8 lanes are
    all admitted'). One lane and one waiting place: of five sent at once, two are admitted."""
    client = open_client(runtime, max_batch=1, max_len=96, max_waiting=1)
    try:
        results = await asyncio.gather(
            *(collect(client, text_request(f"b{i}", "burst", greedy(3), runtime.name))
              for i in range(5)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, Overloaded)]
        served = [r for r in results if not isinstance(r, BaseException)]
        assert len(refused) == 3 and len(served) == 2, results
        assert all(r.resource == "waiting_queue" and r.retry_after_s >= 1 for r in refused)
        assert client.engine.metrics.rejected.labels(reason="queue_full")._value.get() == 3
        assert client.engine.health()["preparing"] == 0
    finally:
        await client.aclose()
