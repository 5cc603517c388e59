"""The GPU's own faults, real, on the lent GPU: real worker processes on `--device cuda`, a real
gateway, faults the device itself raises (the scenarios: tests/support/device_faults.py; their
CPU rehearsal with stand-in faults: tests/e2e/test_device_faults_cpu.py).

Issue: "a CUDA out-of-memory or an illegal-state error inside a step fails the rows of that step
typed (not the process), the worker reports unhealthy if the device is lost, and the gateway
routes around it; a prompt that cannot fit the KV pool is refused typed at admission, never
evicted mid-decode without a terminal event."

- The lost device: a kernel inside a step reads out of bounds (a device-side assert, sticky:
  the worker's CUDA context is gone), launched by the test-only launcher
  tests/support/fault_worker.py.
- Out of memory: this test process takes every free byte of the device (torch.cuda.mem_get_info
  near zero) after the worker's allocator returned its cache, so the worker's next prefill
  allocation really fails in the driver.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.device_faults import (
    CUDA_SHAPE,
    kv_pool,
    lost_device,
    out_of_memory,
    running_stack,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack("cuda", tmp_path_factory.mktemp("gpu-faults"), CUDA_SHAPE) as built:
        yield built


def _hog() -> list[torch.Tensor]:
    """Every free byte of the device this process can take: 1 GiB blocks, then 64 MiB, then
    512 KiB ones (the caching allocator's small pool: 2 MiB segments), until each fails."""
    blocks = []
    for size in (1 << 30, 1 << 26, 1 << 19):
        while True:
            try:
                blocks.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    free, total = torch.cuda.mem_get_info()
    if free >= 32 << 20:  # give it back before failing: the worker must not wait on it
        _free(blocks)
        raise AssertionError(f"the hog left {free} of {total} bytes free")
    return blocks


def _free(blocks: list[torch.Tensor]) -> None:
    blocks.clear()
    torch.cuda.empty_cache()


@pytest.mark.asyncio
async def test_a_lost_device_fails_its_rows_typed_and_the_gateway_routes_around_it(stack):
    """A device-side assert inside a step: its rows and the live streams end ServiceUnavailable
    with a terminal event, the process lives, its health says unavailable (and stays so), and
    the gateway serves every new request on the healthy worker."""
    await lost_device(stack)


@pytest.mark.asyncio
async def test_a_prompt_beyond_the_kv_pool_is_refused_and_full_lanes_are_never_evicted(stack):
    """On CUDA, with the KV pool at its smallest (lanes x max_len): a prompt longer than a lane
    is refused typed at admission; prompts filling every lane, more than the pool holds at
    once, are queued or refused typed, never evicted mid-decode."""
    await kv_pool(stack)


@pytest.mark.asyncio
async def test_a_real_out_of_memory_fails_that_steps_rows_typed_and_the_worker_serves_on(stack):
    """The device full (another process holds every free byte): the worker's next prefill runs
    out of memory for real; that step's requests end ServiceUnavailable, the process and its
    health stay up, and with the memory back the same requests succeed."""
    await out_of_memory(stack, _hog, _free)
