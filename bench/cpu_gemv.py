"""The bare weight GEMMs of one CPU decode step of the built-in model, both ways, side by side:
the GGUF's Q4_1 / Q8_0 blocks through kernels/cpu_gemv.py and F.linear on the float32 weights
(the path it replaces). Every fused GEMM of the model once per step (q|k|v, o, gate|up, down per
layer, the output matrix), on `--rows` input rows (decode rows B * T), alternating the two ways
`--steps` times per thread count, so contention from other processes falls on both alike. Reports
per way the min and median step time and the bytes read per step over the min (effective
bandwidth), as JSON.

    python -m bench.cpu_gemv --threads 1 2 --rows 1 --steps 30 --out gemv_cpu.json
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bench.report import report_header, write_report


def step_gemms(model) -> list[tuple]:
    """(block matrix, float32 weight) of every fused weight GEMM of one decode step."""
    pairs = [(model.quantized_output, model.output_weight)]
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        pairs += [(a.quantized["qkv"], a.fused_q_proj), (a.quantized["o_proj"], a.o_proj.weight),
                  (m.quantized["gate_up"], m.fused_gate_proj),
                  (m.quantized["down_proj"], m.down_proj.weight)]
    return pairs


@torch.inference_mode()
def bench_gemms(model, threads: tuple[int, ...], steps: int, rows: int = 1) -> dict:
    pairs = step_gemms(model)
    inputs = {k: torch.randn(rows, k) for k in {w.shape[1] for _, w in pairs}}
    ways = {
        "blocks": (lambda: [q.linear(inputs[w.shape[1]]) for q, w in pairs],
                   sum(q.nbytes for q, _ in pairs)),
        "float32": (lambda: [F.linear(inputs[w.shape[1]], w) for _, w in pairs],
                    sum(w.numel() * w.element_size() for _, w in pairs)),
    }
    was = torch.get_num_threads()
    out = {}
    try:
        for n in threads:
            torch.set_num_threads(n)
            times: dict[str, list[float]] = {way: [] for way in ways}
            for fn, _ in ways.values():
                fn()  # warm
            for _ in range(steps):
                for way, (fn, _) in ways.items():
                    start = time.perf_counter()
                    fn()
                    times[way].append(time.perf_counter() - start)
            row = {}
            for way, (_, nbytes) in ways.items():
                best = min(times[way])
                row[way] = {"min_ms": round(best * 1e3, 3),
                            "median_ms": round(statistics.median(times[way]) * 1e3, 3),
                            "bytes": nbytes, "GBps_at_min": round(nbytes / best / 1e9, 2)}
            row["speedup_min"] = round(row["float32"]["min_ms"] / row["blocks"]["min_ms"], 3)
            row["speedup_median"] = round(
                row["float32"]["median_ms"] / row["blocks"]["median_ms"], 3)
            out[n] = row
    finally:
        torch.set_num_threads(was)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_gemv", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rows", type=int, nargs="+", default=[1], help="input rows (default: 1)")
    p.add_argument("--out", metavar="FILE")
    args = p.parse_args(argv)
    from kernels import cpu_gemv
    from services.worker.runtime import load_runtime

    if not cpu_gemv.available():
        print(f"bench cpu_gemv: {cpu_gemv.unavailable_reason()}", file=sys.stderr)
        return 2
    runtime = load_runtime()
    args.model, args.device = runtime.name, "cpu"
    report = {**report_header("cpu_gemv", args, runtime),
              "command": "python -m bench.cpu_gemv " + shlex.join(sys.argv[1:]),
              "results": {r: bench_gemms(runtime.model, tuple(args.threads), args.steps, r)
                          for r in args.rows}}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
