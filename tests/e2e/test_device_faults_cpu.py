"""The CPU rehearsal of tests/e2e/test_gpu_faults.py: the same scenarios with real processes
(tests/support/device_faults.py: worker processes, a real gateway over two of them, gRPC and
HTTP on loopback), with stand-in faults of the types the device raises (torch's AcceleratorError
for a device-side assert, OutOfMemoryError for the allocator's refusal) from the test-only
launcher tests/support/fault_worker.py.

Issue: "a CUDA out-of-memory or an illegal-state error inside a step fails the rows of that step
typed (not the process), the worker reports unhealthy if the device is lost, and the gateway
routes around it; a prompt that cannot fit the KV pool is refused typed at admission, never
evicted mid-decode without a terminal event."
"""

from __future__ import annotations

import pytest

from tests.support.device_faults import (
    CPU_SHAPE,
    kv_pool,
    lost_device,
    out_of_memory,
    running_stack,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack("cpu", tmp_path_factory.mktemp("device-faults"), CPU_SHAPE) as built:
        yield built


@pytest.mark.asyncio
async def test_a_lost_device_takes_the_worker_out_and_the_gateway_routes_around_it(stack):
    """The device fails inside a step and stays lost: every live request ends
    ServiceUnavailable, health says unavailable, the gateway serves every new request on the
    other worker."""
    await lost_device(stack)


@pytest.mark.asyncio
async def test_the_kv_pool_refuses_at_admission_and_never_evicts(stack):
    await kv_pool(stack)


@pytest.mark.asyncio
async def test_out_of_memory_fails_that_steps_rows_and_the_worker_serves_on(stack):
    """The OOM handshake of the GPU test, the allocator's refusal stood in for."""
    await out_of_memory(stack, lambda: None, lambda held: None)
