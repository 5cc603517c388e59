"""Runtime integrity errors of the worker: the Engine's state can no longer be trusted.

Design document: "Runtime integrity errors are never wrapped as user schema errors. A broken row
membership, a matcher that cannot roll back or a GPU physical commit that cannot complete keeps
the Engine's existing unavailable boundary." Raised where one is found (the OutputSession's
rollback, the commit path's Program commit, the Program's batch checks) and caught by the Engine
only, which then drains: every live request fails typed (ServiceUnavailable), health reports
unavailable, and nothing is served until the Engine has rebuilt its Program.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InternalError


class IntegrityError(RuntimeError):
    """A runtime integrity failure (see the module docstring); never a request's error."""


def check_membership(batch, resident) -> None:
    """A step's rows are resident requests, each in its own lane (design document: "From unit
    admission until the PendingBatch is consumed, membership, sequences, block tables and buffers
    stay stable"); anything else is a broken batch membership: IntegrityError."""
    lanes = set()
    members = {id(job) for job in resident}
    for row in batch.rows:
        job = row.request
        if id(job) not in members or job.lane is None or job.lane in lanes:
            raise IntegrityError(f"broken batch membership: request {job.request_id!r} "
                                 f"(lane {job.lane}) is not a distinct resident row")
        lanes.add(job.lane)


@dataclass
class DeviceError(InternalError):
    """A CUDA runtime call made through cuda-python failed; its message names the cudaError_t.
    Never a request's error: a step that meets one reads it through `step_failure`."""


# How a device failure reads where torch, Triton or cuda-python report it (torch raises
# AcceleratorError, Triton's launcher a RuntimeError, the runtime's own codes name themselves).
_DEVICE_MARKERS = ("CUDA error", "Triton Error [CUDA]", "cudaError", "CUDA_ERROR_")
_OUT_OF_MEMORY_MARKERS = ("out of memory", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")


def is_device_error(exc: BaseException) -> bool:
    """Whether `exc` is the device's own failure (not a bug of ours)."""
    import torch

    accelerator = getattr(torch, "AcceleratorError", ())
    return isinstance(exc, (torch.OutOfMemoryError, DeviceError)) or isinstance(
        exc, accelerator) or any(marker in str(exc) for marker in _DEVICE_MARKERS)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says the device ran out of memory: torch's allocator (OutOfMemoryError) or
    a CUDA call that could not allocate (a kernel's module load, a library's workspace). The
    device's state is intact: nothing ran that could have corrupted it."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        is_device_error(exc) and any(m in str(exc) for m in _OUT_OF_MEMORY_MARKERS))


def step_failure(exc: BaseException, what: str = "the batch step failed"):
    """What a Program step that raised means for its rows: the device out of memory fails them
    with ServiceUnavailable (the worker's capacity, retried elsewhere; the process serves on);
    a device error that leaves its state unknown (an illegal memory access, a device-side
    assert, a lost device) is an integrity failure (IntegrityError: the unavailable boundary,
    whose rebuild fails while the device is gone, so health stays unavailable); anything else
    is the step's InternalError (`what` failed). A device fault surfaces wherever the host next
    waits on the device, so every failure of an engine step is read through this."""
    from shared.errors import ServiceUnavailable

    if is_out_of_memory(exc):
        return ServiceUnavailable(f"the device ran out of memory during this step: "
                                  f"{str(exc)[:200]}", service="worker", retry_after_s=1.0)
    if is_device_error(exc):
        raise IntegrityError(f"the device failed: {type(exc).__name__}: {exc}") from exc
    return InternalError(f"{what}: {exc}")
