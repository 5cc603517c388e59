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
from shared.generation import Finished, FinishReason, Started
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
async def test_after_a_failed_rebuild_nothing_runs_on_the_old_program(runtime, monkeypatch):
    """A request already queued when the device failed (it passed admission before the boundary
    closed it) must not run on the old Program once the rebuild failed: it fails typed, as the
    live rows did (on a device that still computes it would otherwise be served from state
    nobody trusts)."""
    import time

    from services.worker.engine import engine as engine_module

    hooked_runtime, model = hooked(runtime)
    client = open_client(hooked_runtime, max_batch=2, max_len=96)
    loop = asyncio.get_running_loop()
    late: dict = {}
    calls = {"n": 0}

    def before(tokens, positions, lanes):  # on the engine's thread
        calls["n"] += 1
        if calls["n"] != 5:
            return
        late["run"] = asyncio.run_coroutine_threadsafe(
            collect(client, text_request("late", "late", greedy(6), runtime.name)), loop)
        deadline = time.monotonic() + 30
        while client.engine.admission.get("late") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # its queueing follows its registration at once, on the loop
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    model.before = before
    try:
        def lost(self):
            raise RuntimeError("CUDA error: no CUDA-capable device is detected")

        monkeypatch.setattr(engine_module.Engine, "build", lost)
        await asyncio.wait_for(_two(client, hooked_runtime), 60)
        assert "run" in late, "the fault never fired"
        _, done = await asyncio.wait_for(asyncio.wrap_future(late["run"]), 60)
        assert done.finish_reason is FinishReason.ERROR, done
        assert done.error["type"] == "ServiceUnavailable", done.error
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


@pytest.mark.parametrize("error, lost", [
    (torch.AcceleratorError("CUDA error: device-side assert triggered"), True),
    (RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"), True),
    (None, True),  # the ready event's own report (cuda-python): DeviceError, filled in below
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
    (torch.AcceleratorError("CUDA error: out of memory"), False),
    (ValueError("a bug of ours"), None),
])
def test_step_failures_are_read_as_the_device_reports_them(error, lost):
    """Wherever the device reports a fault (torch, Triton's launcher, the ready event's
    cuda-python call: `cudaEventSynchronize failed: cudaError_t.cudaErrorAssert`), a state it
    cannot vouch for is the unavailable boundary (IntegrityError), a failed allocation is the
    worker's capacity (ServiceUnavailable, the process serves on), and anything else is the
    step's InternalError."""
    from services.worker.integrity import DeviceError, IntegrityError, step_failure
    from shared.errors import InternalError, ServiceUnavailable

    if error is None:
        error = DeviceError("cudaEventSynchronize failed: cudaError_t.cudaErrorAssert")
    if lost:
        with pytest.raises(IntegrityError) as raised:
            step_failure(error)
        assert raised.value.__cause__ is error
    elif lost is False:
        assert isinstance(step_failure(error), ServiceUnavailable)
    else:
        failure = step_failure(error, "engine failure")
        assert isinstance(failure, InternalError) and failure.message.startswith("engine failure")


def _fail_admission(monkeypatch, error: BaseException, after: int) -> dict:
    """Program.attach_prefix (it writes the lane's block table to the device) raises `error`
    at its call number `after` + 1: a device fault surfacing outside the Program step."""
    from services.worker.program import program as program_module

    calls = {"n": 0}
    original = program_module.Program.attach_prefix

    def attach(self, *args):
        calls["n"] += 1
        if calls["n"] == after + 1:
            raise error
        return original(self, *args)

    monkeypatch.setattr(program_module.Program, "attach_prefix", attach)
    return calls


async def _admitted_beside_two(client, runtime, name: str):
    """Two requests decoding, then a third whose admission fails; the three outcomes."""
    from tests.support.device_faults import Stream

    first = [Stream(client, text_request(f"{name}{i}", f"decode {i}", greedy(60),
                                         runtime.name)) for i in range(2)]
    for stream in first:
        await asyncio.wait_for(stream.first_text.wait(), 60)
    third = Stream(client, text_request(f"{name}-admitted", "admitted", greedy(6), runtime.name))
    return [await s.done(60) for s in (*first, third)]


@pytest.mark.asyncio
async def test_a_lost_device_reported_at_admission_fails_every_live_request_typed(
        runtime, monkeypatch):
    """A device error surfacing outside the Program step (here at an admission) is the same
    unavailable boundary as inside it: every live request, the one being admitted included,
    ends ServiceUnavailable (before, the one being admitted was left without a lane and without
    a terminal event, and the others ended InternalError on a worker that said ok)."""
    from services.worker.engine import engine as engine_module

    client = open_client(runtime, max_batch=3, max_len=96)
    try:
        _fail_admission(monkeypatch, torch.AcceleratorError(
            "CUDA error: an illegal memory access was encountered"), after=2)

        def lost(self):
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

        monkeypatch.setattr(engine_module.Engine, "build", lost)
        outcomes = await _admitted_beside_two(client, runtime, "lost")
        for outcome in outcomes:
            assert isinstance(outcome, Finished) and outcome.error is not None, outcome
            assert outcome.error["type"] == "ServiceUnavailable", outcome.error
        health = await client.health()
        assert health["status"] == "unavailable" and "illegal memory" in health["unavailable"]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_out_of_memory_at_admission_fails_typed_and_the_admitted_request_runs(
        runtime, monkeypatch):
    """Out of memory outside the Program step: the resident requests end ServiceUnavailable
    (not InternalError), the request being admitted waits again and then runs to its end, and
    the worker stays ok."""
    client = open_client(runtime, max_batch=3, max_len=96)
    try:
        _fail_admission(monkeypatch, torch.OutOfMemoryError("CUDA out of memory."), after=2)
        *first, third = await _admitted_beside_two(client, runtime, "oom")
        for outcome in first:
            assert isinstance(outcome, Finished) and outcome.error is not None, outcome
            assert outcome.error["type"] == "ServiceUnavailable", outcome.error
        expected = oracle_greedy(runtime, runtime.tokenizer.encode("admitted"), 6)
        assert isinstance(third, Finished) and third.error is None, third
        assert third.content == text_of(runtime.domain, expected)
        assert client.engine.health()["status"] == "ok"
    finally:
        await client.aclose()
