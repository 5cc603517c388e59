"""Runtime integrity errors of the worker: the Engine's state can no longer be trusted.

Design document: "Runtime integrity errors are never wrapped as user schema errors. A broken row
membership, a matcher that cannot roll back or a GPU physical commit that cannot complete keeps
the Engine's existing unavailable boundary." Raised where one is found (the OutputSession's
rollback, the commit path's Program commit, the Program's batch checks) and caught by the Engine
only, which then drains: every live request fails typed (ServiceUnavailable), health reports
unavailable, and nothing is served until the Engine has rebuilt its Program.
"""

from __future__ import annotations


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


def step_failure(exc: BaseException):
    """What a Program step that raised means for its rows: the device out of memory fails them
    with ServiceUnavailable (the worker's capacity, retried elsewhere; the process serves on);
    a device error that leaves its state unknown (an illegal memory access, a lost device) is an
    integrity failure (IntegrityError: the unavailable boundary, whose rebuild fails while the
    device is gone, so health stays unavailable); anything else is the step's InternalError."""
    import torch

    from shared.errors import InternalError, ServiceUnavailable

    if isinstance(exc, torch.OutOfMemoryError):
        return ServiceUnavailable(f"the device ran out of memory during this step: "
                                  f"{str(exc)[:200]}", service="worker", retry_after_s=1.0)
    accelerator = getattr(torch, "AcceleratorError", ())
    if isinstance(exc, accelerator) or "CUDA error" in str(exc):
        raise IntegrityError(f"the device failed: {type(exc).__name__}: {exc}") from exc
    return InternalError(f"the batch step failed: {exc}")
