"""The Program: the physical side of the worker, allocated once at start.

    program.py   lanes, the model state, step(batch) -> PendingBatch, commit of device state
    blocks.py    the paged KV block manager and the automatic prefix cache
    batch.py     StepBatch / PendingBatch: what a step runs and what it produced per row
    masks.py     pinned host and device mask buffers [B, K+1, ceil(V/32)], descriptors, fills
    sampling.py  the sample stage: parameters, penalties, the masked sampling kernel
    graphs.py    CUDA graphs: one decode graph per batch size
    events.py    the ready event (cuda-python) the host waits on
"""

from services.worker.program.batch import BatchRow, PendingBatch, RowOutcome, RowResult, StepBatch
from services.worker.program.program import Program

__all__ = ["BatchRow", "PendingBatch", "Program", "RowOutcome", "RowResult", "StepBatch"]
