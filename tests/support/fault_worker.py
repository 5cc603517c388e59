"""A test-only worker launcher whose device really fails when a test says so.

`python -m tests.support.fault_worker [LAUNCHER FLAGS] WORKER FLAGS...` runs `infernix worker
serve` exactly as `tests.support.tiny_worker` does (random weights over the SmolLM2 vocabulary;
`--hidden-size` chooses a larger model, so that a long prefill needs device memory of its own), and
wraps the model's eager forward (prefill chunks, eager decode steps; a replayed CUDA graph runs no
Python) with the faults its flags arm:

- `--fault-file PATH`: the first eager forward after PATH exists launches a kernel that reads out
  of bounds (an index_select past its table: a device-side assert, cudaErrorAssert). On CUDA that
  error is sticky: the process's context is lost and every later CUDA call fails, as when a
  device is lost. On the CPU (the rehearsal of the same scenario) the fault is the error torch
  raises for it, and the device stays lost: building a model state fails from then on.
- `--oom-dir DIR`: an out-of-memory handshake. Once DIR/release exists, the next eager forward
  returns this process's cached free device memory to the driver (torch.cuda.empty_cache, which
  the caching allocator itself does before it gives up on a failed cudaMalloc), writes
  DIR/released and waits (up to 60 s) for DIR/hogged, which the test writes once another
  process holds all free device memory; the forward then goes on and its allocations really fail.
  On the CPU, while DIR/hogged exists every eager forward raises torch.OutOfMemoryError (the
  rehearsal's stand-in for the allocator's own).

Nothing here is part of the product: the worker's code runs unchanged around these hooks.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path


def _launcher_flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--fault-file", type=Path, default=None)
    parser.add_argument("--oom-dir", type=Path, default=None)
    parser.add_argument("--hidden-size", type=int, default=32)
    return parser


class DeviceFaults:
    """Wraps a model's forward with the faults of the module docstring."""

    def __init__(self, model, *, fault_file: Path | None, oom_dir: Path | None) -> None:
        self.model = model
        self.fault_file = fault_file
        self.oom_dir = oom_dir
        self.faulted = False  # the out-of-bounds kernel ran
        self.released = False  # the OOM handshake's cache release ran
        self._forward = model.forward
        self._new_state = model.new_state
        model.forward = self.forward
        model.new_state = self.new_state

    def forward(self, tokens, *args, **kwargs):
        import torch

        capturing = tokens.is_cuda and torch.cuda.is_current_stream_capturing()
        if not capturing:
            self._before(tokens.device)
        return self._forward(tokens, *args, **kwargs)

    def new_state(self, *args, **kwargs):
        if self.faulted and self.fault_file is not None and not self._is_cuda():
            raise self._cpu_fault()  # the CPU rehearsal's device stays lost
        return self._new_state(*args, **kwargs)

    def _is_cuda(self) -> bool:
        return next(self.model.parameters()).is_cuda

    @staticmethod
    def _cpu_fault() -> BaseException:
        import torch

        return torch.AcceleratorError("CUDA error: device-side assert triggered (the CPU "
                                      "rehearsal of an out-of-bounds read)")

    def _before(self, device) -> None:
        import torch

        if self.fault_file is not None and not self.faulted and self.fault_file.exists():
            self.faulted = True
            if device.type != "cuda":
                raise self._cpu_fault()
            table = torch.zeros(8, device=device)
            past_the_end = torch.full((1,), 1 << 20, dtype=torch.int64, device=device)
            table.index_select(0, past_the_end)  # device-side assert: index out of bounds
        if self.oom_dir is None:
            return
        hogged = self.oom_dir / "hogged"
        if not self.released and (self.oom_dir / "release").exists():
            self.released = True
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
            (self.oom_dir / "released").touch()
            deadline = time.monotonic() + 60.0
            while not hogged.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        if device.type != "cuda" and hogged.exists():
            raise torch.OutOfMemoryError("CUDA out of memory (the CPU rehearsal's stand-in "
                                         "for the allocator's own)")


def fault_runtime(model=None, *, device="cpu", dtype=None, flags) -> object:
    """A `load_runtime` stand-in: the tiny worker's runtime with DeviceFaults on its model."""
    from tests.support.tiny_worker import tiny_smollm2_runtime

    heads = max(2, flags.hidden_size // 128)
    runtime = tiny_smollm2_runtime(model, device=device, dtype=dtype,
                                   hidden_size=flags.hidden_size, num_heads=heads,
                                   num_kv_heads=max(1, heads // 4),
                                   max_position_embeddings=16384)
    DeviceFaults(runtime.model, fault_file=flags.fault_file, oom_dir=flags.oom_dir)
    return runtime


def main(argv: list[str]) -> int:
    import services.worker.runtime as runtime_module
    from services.cli import main as cli_main

    flags, worker_flags = _launcher_flags().parse_known_args(argv)
    runtime_module.load_runtime = functools.partial(fault_runtime, flags=flags)
    return cli_main(["worker", "serve", *worker_flags])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
