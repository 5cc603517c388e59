"""The device side of one decode step, timed with CUDA events, beside the memory floor.

Per batch size B and per model path (`fused`: the fused layer path of models/layers.py;
`unfused`: the op-by-op path on the same weights), outside any engine:

- `forward_ms`: one replay of the Program's decode graph (services/worker/program/graphs.py, the
  whole lane attended, as the engine runs it), mean over `steps` replays;
- `sample_ms`: the greedy sample stage on that graph's logits, eagerly: the masked argmax
  (kernels/sampling_greedy.py) for `fused`, the general sampling kernel at candidate width 1 for
  `unfused` (what greedy rows ran before);
- `floor_ms`: every weight byte read once (the embedding's B rows) at the measured device copy
  bandwidth (models/qwen35_bench.py's measures, one home).

The engine's TPOT from the same run minus forward and sample is the host's share of a step (the
GPU idles then unless the host overlaps it): `decode.py` reports it as `host_ms` and the GPU idle
fraction as host_ms / TPOT.
"""

from __future__ import annotations

import torch

from kernels.sampling_contract import SamplingParams
from services.worker.models.qwen35_bench import copy_bandwidth, weight_bytes_per_step
from services.worker.program.graphs import DecodeGraph


def _event_ms(fn, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


@torch.inference_mode()
def step_breakdown(runtime, batch_sizes, paths, *, context: int = 128, steps: int = 20) -> dict:
    """{"copy_bandwidth_GBps", "rows": {B: {path: {forward_ms, sample_ms, floor_ms, ...}}}};
    CUDA only. `context`: each row's position (the lanes hold context + 1 positions)."""
    model = runtime.model
    device = runtime.device
    bandwidth = copy_bandwidth(device)
    vocab = runtime.domain.size
    was = model.fused
    rows: dict[int, dict] = {}
    try:
        for b in batch_sizes:
            state = model.new_state(b + 1, context + 1, dtype=runtime.dtype, device=device)
            tokens = torch.randint(0, vocab, (b, 1), device=device)
            positions = torch.full((b, 1), context, dtype=torch.int64, device=device)
            lanes = torch.arange(b, device=device)
            floor = weight_bytes_per_step(model, b) / bandwidth * 1e3
            entry = {}
            for path in paths:
                model.fused = path == "fused"
                graph = DecodeGraph(model, state, b, scratch_lane=b, pool=None)
                forward = _event_ms(lambda: graph.run(tokens, positions, lanes), steps)
                z = graph.logits
                if path == "fused":
                    from kernels.sampling_greedy import sample_greedy

                    sample = _event_ms(lambda: sample_greedy(z, vocab_size=vocab), steps)
                else:
                    from kernels.sampling import sample as kernel

                    def general():
                        params = SamplingParams.from_rows(b, temperature=0.0, device=device)
                        kernel(z, params, vocab_size=vocab, candidate_width=1)

                    sample = _event_ms(general, steps)
                entry[path] = {"forward_ms": round(forward, 4), "sample_ms": round(sample, 4),
                               "floor_ms": round(floor, 4),
                               "forward_over_floor": round(forward / floor, 3)}
                del graph
            rows[b] = entry
            del state
            torch.cuda.empty_cache()
    finally:
        model.fused = was
    return {"copy_bandwidth_GBps": round(bandwidth / 1e9, 1),
            "weight_bytes_b1": weight_bytes_per_step(model, 1), "rows": rows}
