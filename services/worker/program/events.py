"""The ready event the host waits on after a step's device-to-host copies, through cuda-python;
inside a captured DFlash Forward graph the same event is recorded as an external event-record node.

`cuda.bindings` is the GPU extra's declared dependency (pyproject `gpu`); this module is imported
only on the CUDA path, so CPU installs never need it.
"""

from __future__ import annotations

import torch

from services.worker.integrity import DeviceError


class ReadyEvent:
    """A timing-disabled CUDA event: `record(stream)` after the copies, `wait()` on the host."""

    def __init__(self) -> None:
        from cuda.bindings import runtime as cudart

        self._cudart = cudart
        err, self._event = cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming)
        self._check(err, "cudaEventCreateWithFlags")

    def _check(self, err, what: str) -> None:
        if err != self._cudart.cudaError_t.cudaSuccess:
            raise DeviceError(f"{what} failed: {err}")  # a sticky fault of an earlier kernel

    def record(self, stream: torch.cuda.Stream) -> None:
        (err,) = self._cudart.cudaEventRecord(self._event, stream.cuda_stream)
        self._check(err, "cudaEventRecord")

    def record_external(self, stream: torch.cuda.Stream) -> None:
        """Inside a graph capture on `stream`: an external event-record node, so that the host's
        `wait()` after a replay returns when the graph reaches this point (DFlash's draft ids
        are on the host), not at its end. Illegal outside capture (cudaErrorIllegalState): the
        eager path calls `record` at the same point (design: the verified recipe)."""
        cudart = self._cudart
        (err,) = cudart.cudaEventRecordWithFlags(self._event, stream.cuda_stream,
                                                 cudart.cudaEventRecordExternal)
        self._check(err, "cudaEventRecordWithFlags(cudaEventRecordExternal)")

    def wait(self) -> None:
        (err,) = self._cudart.cudaEventSynchronize(self._event)
        self._check(err, "cudaEventSynchronize")

    def close(self) -> None:
        if self._event is not None:
            self._cudart.cudaEventDestroy(self._event)
            self._event = None
