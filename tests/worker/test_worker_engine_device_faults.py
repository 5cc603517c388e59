"""The device's own faults, the part a CPU can test (the GPU part runs on the lent H200).

Issue: "a CUDA out-of-memory or an illegal-state error inside a step fails the rows of that step
typed (not the process), the worker reports unhealthy if the device is lost ...; a prompt that
cannot fit the KV pool is refused typed at admission, never evicted mid-decode without a
terminal event." The faults are injected where the device raises them: from the forward.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from shared.errors import InvalidRequest
from shared.generation import FinishReason, Started
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    oracle_greedy,
    text_of,
    text_request,
    tiny_runtime,
)


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


def _raise_on_forward(model, n: int, error: BaseException) -> dict:
    calls = {"n": 0}

    def before(tokens, positions, lanes):
        calls["n"] += 1
        if calls["n"] == n:
            raise error

    model.before = before
    return calls


async def _two(client, runtime, n: int = 20):
    return await asyncio.gather(*(collect(client, text_request(name, name, greedy(n),
                                                                runtime.name))
                                  for name in ("left", "right")))


@pytest.mark.asyncio
async def test_out_of_memory_inside_a_step_fails_that_steps_rows_typed_not_the_process(runtime):
    hooked_runtime, model = hooked(runtime)
    _raise_on_forward(model, 5, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    client = open_client(hooked_runtime, max_batch=2, max_len=96)
    try:
        results = await _two(client, hooked_runtime)
        failed = [done for _, done in results if done.finish_reason is FinishReason.ERROR]
        assert failed, "the injected out-of-memory error failed no row"
        for done in failed:
            assert done.error["type"] == "ServiceUnavailable"
            assert "out of memory" in done.error["message"]
        assert client.engine.health()["status"] == "ok"
        deltas, done = await collect(client, text_request("after", "next", greedy(6),
                                                          runtime.name))
        expected = oracle_greedy(runtime, runtime.tokenizer.encode("next"), 6)
        assert done.error is None and "".join(deltas) == text_of(runtime.domain, expected)
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_an_illegal_device_state_takes_the_worker_out_of_rotation(runtime, monkeypatch):
    """A device error that leaves the device's state unknown is the unavailable boundary: the
    rows fail typed (ServiceUnavailable), and while the device stays lost (the Program cannot be
    rebuilt on it) health stays unavailable, so a gateway's pool routes around the worker."""
    from services.worker.engine import engine as engine_module

    hooked_runtime, model = hooked(runtime)
    _raise_on_forward(model, 5, RuntimeError("CUDA error: an illegal memory access was "
                                             "encountered"))
    client = open_client(hooked_runtime, max_batch=2, max_len=96)
    try:
        def lost(self):
            raise RuntimeError("CUDA error: no CUDA-capable device is detected")

        monkeypatch.setattr(engine_module.Engine, "build", lost)
        results = await _two(client, hooked_runtime)
        for _, done in results:
            assert done.finish_reason is FinishReason.ERROR
            assert done.error["type"] == "ServiceUnavailable", done.error
        health = await client.health()
        assert health["status"] == "unavailable" and not health["ready"]
        assert "illegal memory access" in health["unavailable"]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_a_prompt_that_cannot_fit_is_refused_at_admission_and_full_lanes_are_never_evicted(
        runtime):
    """Every lane's full length is backed by the KV pool (its smallest size), so a prompt that
    fits a lane is never evicted mid-decode: every lane decodes to its end beside the others, with
    the prefix cache on; a prompt longer than a lane is refused typed before any event."""
    max_len = 64
    client = open_client(runtime, max_batch=3, max_len=max_len, kv_cache_tokens=3 * max_len)
    try:
        too_long = "x" * (max_len + 5)
        events = []
        with pytest.raises(InvalidRequest) as refused:
            async for event in client.generate(text_request("long", too_long, greedy(4),
                                                            runtime.name)):
                events.append(event)
        assert refused.value.field == "prompt" and not any(isinstance(e, Started) for e in events)
        prompts = [f"lane {i} " * 3 for i in range(3)]
        results = await asyncio.gather(*(collect(client, text_request(
            f"full{i}", p, greedy(max_len - len(runtime.tokenizer.encode(p)) + 1), runtime.name))
            for i, p in enumerate(prompts)))
        for (deltas, done), prompt in zip(results, prompts):
            n = max_len - len(runtime.tokenizer.encode(prompt)) + 1
            expected = oracle_greedy(runtime, runtime.tokenizer.encode(prompt), n)
            assert done.error is None and "".join(deltas) == text_of(runtime.domain, expected)
            assert done.usage.completion_tokens == len(expected)
    finally:
        await client.aclose()
