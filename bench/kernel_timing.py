"""How bench/kernel_speed.py times one implementation: GPU time of calls captured in one CUDA
graph (`time_graph`), eager wall-clock calls (`time_eager`), whether it synchronises with the
host (`host_syncs`), and `run_case`, which times every implementation of a case and records it."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import torch


def time_graph(fn: Callable[[], object], reps: int = 20, iters: int = 5) -> float | None:
    """Median µs per call of `reps` calls replayed from one CUDA graph; None if not capturable
    (or on CPU)."""
    if not torch.cuda.is_available():
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
    except Exception:  # noqa: BLE001 (host-synchronising implementations cannot be captured)
        torch.cuda.synchronize()
        return None
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(times)


def host_syncs(fn: Callable[[], object]) -> bool | None:
    """Whether fn synchronises with the host (torch's sync debug mode); None on CPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def time_eager(fn: Callable[[], object], iters: int = 30) -> float:
    if not torch.cuda.is_available():
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def flat_output(out) -> torch.Tensor:
    if out is None:  # in-place operations: no comparable output
        return torch.empty(0)
    if isinstance(out, torch.Tensor):
        return out.float().reshape(-1)
    if isinstance(out, (tuple, list)):
        return torch.cat([flat_output(o) for o in out])
    return torch.cat([flat_output(getattr(out, f)) for f in out.__dataclass_fields__])


def run_case(results: list, kernel: str, shape: dict, impls: dict[str, Callable[[], object]],
             nbytes: int | None = None) -> None:
    """Time every implementation of one case and append one JSON record per implementation."""
    first = None
    for name, fn in impls.items():
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        diff = None
        flat = flat_output(out)
        if first is None:
            first = flat
        elif flat.shape == first.shape and flat.numel():
            diff = float((flat - first).abs().nan_to_num(0).max())
        syncs = host_syncs(fn)
        record = dict(kernel=kernel, impl=name, **shape, host_sync=syncs,
                      us_graph=None if syncs else time_graph(fn), us_eager=time_eager(fn),
                      max_abs_diff=diff)
        if nbytes is not None and record["us_graph"]:
            record["gb_per_s"] = nbytes / record["us_graph"] / 1e3
        results.append(record)
        print(json.dumps(record), flush=True)
