"""The device side of one decode step, timed with CUDA events (on the CPU: the wall clock, median
of the repeats), beside the memory floor.

Per batch size B and per model path (`fused`: the fused layer path of models/layers.py;
`float32`: the same on the float32 weights where the CPU GEMV would read the checkpoint's blocks;
`unfused`: the op-by-op path on the same weights), outside any engine:

- `forward_ms`: one replay of the Program's decode graph (services/worker/program/graphs.py, the
  whole lane attended, as the engine runs it), mean over `steps` replays; on the CPU one eager
  forward attending `context + 1` positions, as the CPU Program runs it (median);
- `sample_ms`: the greedy sample stage on that graph's logits, eagerly: the masked argmax
  (kernels/sampling_greedy.py) for `fused`, the general sampling kernel at candidate width 1 for
  `unfused` (what greedy rows ran before);
  `forward_cpu_ms` (CPU only): the process's CPU time per forward, all threads, which contention
  from other processes inflates less than the wall clock (OpenMP spin-waits count in it);
- `floor_ms`: every weight byte read once (the embedding's B rows; a matrix the CPU GEMV reads in
  its block format counted at those bytes on the `fused` path), and a hybrid model's
  recurrent state read and written once, at the measured device copy bandwidth
  (bench/qwen35_model.py's measures, one home; on the CPU a 512 MiB tensor copy).

The engine's TPOT from the same run minus forward and sample is the host's share of a step (the
GPU idles then unless the host overlaps it): `decode.py` reports it as `host_ms` and the GPU idle
fraction as host_ms / TPOT.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.qwen35_model import (
    copy_bandwidth,
    cuda_ms,
    recurrent_state_bytes_per_step,
    weight_bytes_per_step,
)
from kernels import cpu_gemv
from kernels.sampling_contract import SamplingParams
from services.worker.models import layers as ops
from services.worker.program.graphs import DecodeGraph


def _warm_cuda_ms(fn, repeats: int) -> float:
    fn()  # compile / lazy initialisation outside the timed calls
    return cuda_ms(fn, repeats)


def _wall_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def cpu_copy_bandwidth(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Host memory copy bandwidth in bytes/s (read + write counted), best of `repeats`."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = min(_wall_ms(lambda: dst.copy_(src), 1) for _ in range(repeats)) / 1e3
    return 2 * nbytes / best


def _block_bytes_saved(model, batch: int) -> int:
    """Bytes the CPU GEMV does not read at `batch` decode rows: float32 size minus block size of
    every matrix it takes (models/layers.py `linear`); 0 where it does not run."""
    if not (ops.CPU_GEMV and batch <= cpu_gemv.MAX_ROWS and cpu_gemv.available()):
        return 0
    matrices = [getattr(model, "quantized_output", None)]
    for module in model.modules():  # the dense model's attention and MLP blocks carry them
        matrices += list(getattr(module, "quantized", {}).values())
    return sum(m.out_features * m.in_features * 4 - m.nbytes for m in matrices if m is not None)


@torch.inference_mode()
def step_breakdown(runtime, batch_sizes, paths, *, context: int = 128, steps: int = 20) -> dict:
    """{"copy_bandwidth_GBps", "rows": {B: {path: {forward_ms, sample_ms, floor_ms, ...}}}}.
    `context`: each row's position (the lanes hold context + 1 positions)."""
    model = runtime.model
    device = runtime.device
    cuda = device.type == "cuda"
    bandwidth = copy_bandwidth(device) if cuda else cpu_copy_bandwidth()
    timed = _warm_cuda_ms if cuda else _wall_ms
    steps = steps if cuda else max(3, steps // 4)
    vocab = runtime.domain.size
    was, gemv = model.fused, ops.CPU_GEMV
    rows: dict[int, dict] = {}
    try:
        for b in batch_sizes:
            state = model.new_state(b + 1, context + 1, dtype=runtime.dtype, device=device)
            tokens = torch.randint(0, vocab, (b, 1), device=device)
            positions = torch.full((b, 1), context, dtype=torch.int64, device=device)
            lanes = torch.arange(b, device=device)
            read = weight_bytes_per_step(model, b) + recurrent_state_bytes_per_step(model, b)
            saved = _block_bytes_saved(model, b)
            entry = {}
            for path in paths:
                model.fused = path != "unfused"
                ops.CPU_GEMV = gemv and path == "fused"
                floor = (read - (saved if path == "fused" else 0)) / bandwidth * 1e3
                if cuda:
                    graph = DecodeGraph(model, state, b, scratch_lane=b, pool=None)
                    forward = _warm_cuda_ms(lambda: graph.run(tokens, positions, lanes), steps)
                    z = graph.logits
                else:
                    graph = None
                    cpu_start = time.process_time()
                    forward = _wall_ms(lambda: model(tokens, positions, state, lanes,
                                                     kv_len=context + 1), steps)
                    cpu_ms = (time.process_time() - cpu_start) / (steps + 1) * 1e3
                    z = model(tokens, positions, state, lanes, kv_len=context + 1)[:, -1]
                if path != "unfused":
                    from kernels.sampling_greedy import sample_greedy

                    sample = timed(lambda: sample_greedy(z, vocab_size=vocab), steps)
                else:
                    if cuda:
                        from kernels.sampling import sample as kernel
                    else:
                        from kernels.sampling_ref import sample_reference as kernel

                    def general():
                        params = SamplingParams.from_rows(b, temperature=0.0, device=device)
                        kernel(z, params, vocab_size=vocab, candidate_width=1)

                    sample = timed(general, steps)
                entry[path] = {"forward_ms": round(forward, 4), "sample_ms": round(sample, 4),
                               "floor_ms": round(floor, 4),
                               "forward_over_floor": round(forward / floor, 3)}
                if not cuda:  # CPU seconds of all the process's threads per forward (spin included)
                    entry[path]["forward_cpu_ms"] = round(cpu_ms, 3)
                graph = z = None
            rows[b] = entry
            state = None
            if cuda:
                torch.cuda.empty_cache()
    finally:
        model.fused, ops.CPU_GEMV = was, gemv
    return {"copy_bandwidth_GBps": round(bandwidth / 1e9, 1),
            "weight_bytes_b1": weight_bytes_per_step(model, 1), "rows": rows}
