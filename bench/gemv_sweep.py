"""Time the Triton GEMV (kernels/gemv.py) against F.linear (cuBLAS) at the decode shapes, and sweep
its configs per shape, on CUDA. Writes JSON and prints a summary plus a `TUNED` table to paste into
kernels/gemv.py. No assertion about speed; it does assert correctness (against F.linear), bit
reproducibility and CUDA-graph capture.

    python -m bench.gemv_sweep --out gemv_bench.json [--ms 1,2,4,8,16] [--repeats 50] \
        [--budget 150] [--no-sweep]

Shapes: the Qwen3-8B linear layers after load-time fusion (q|k|v 6144 x 4096, o 4096 x 4096,
gate|up 24576 x 4096, down 4096 x 12288, 36 layers; lm_head 248320 x 4096) and the Qwen3.5-9B ones
(bench.random_weights.QWEN35_9B: GDN in_proj_qkv|z|a|b 12352 x 4096, out_proj
4096 x 4096 in 24 layers; attention q(+gate)|k|v 10240 x 4096, o 4096 x 4096 in 8; the same MLP and
lm_head).

Timing: every measurement is a CUDA graph of several calls (as the decode forward runs), replayed
`--repeats` times behind a GPU sleep so the CPU never starves the queue; per-replay CUDA events, the
median replay divided by the calls in it. Weights below 256 MiB are replicated and the calls
rotate among the copies so each graph reads >= 256 MiB of distinct weights (H200 L2: 50 MiB) and
the numbers are HBM numbers. Effective bandwidth = weight bytes / time.

Sweep: stage 1 times every block config of the grid for the row bucket with its own heuristic
split (`choose_split`); stage 2 tries every split for the 3 fastest. `--budget` seconds bounds the
whole run: past it (less a reserve for the remaining F.linear / heuristic timings) sweeps stop.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
import triton

from kernels import gemv as G

DEV = "cuda"  # "cpu" under --dry-run

# The Qwen3-8B-shaped random model as benchmarked (hidden 4096, 32 q / 8 kv heads of 128,
# intermediate 12288, 36 layers) with a 248320-row lm_head (the real Qwen3-8B vocabulary is 151936)
QWEN3_8B = {
    "layers": 36,
    "per_layer": [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 24576, 4096),
        ("down", 4096, 12288),
    ],
    "lm_head": ("lm_head", 248320, 4096),
}


def qwen35_9b() -> dict:
    """The Qwen3.5-9B linear shapes after fusion, from its config (gdn.py, qwen35_layers.py)."""
    try:
        from bench.random_weights import QWEN35_9B as c
    except Exception:  # pragma: no cover - bench run outside the repo
        c = dict(
            vocab_size=248_320,
            hidden_size=4096,
            intermediate_size=12288,
            layer_types=tuple(
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)
            ),
            num_heads=16,
            num_kv_heads=4,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
        )
    h = c["hidden_size"]
    key_dim = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    value_dim = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    gdn_in = (
        2 * key_dim + value_dim + value_dim + 2 * c["linear_num_value_heads"]
    )  # qkv | z | a | b
    attn_qkv = (
        2 * c["num_heads"] * c["head_dim"] + 2 * c["num_kv_heads"] * c["head_dim"]
    )  # query+gate | k | v
    attn_o = c["num_heads"] * c["head_dim"]
    n_gdn = sum(t == "linear_attention" for t in c["layer_types"])
    n_attn = len(c["layer_types"]) - n_gdn
    mlp = [("gate_up", 2 * c["intermediate_size"], h), ("down", h, c["intermediate_size"])]
    return {"layers": len(c["layer_types"]),
            "groups": [(n_gdn, [("gdn_in_proj", gdn_in, h), ("gdn_out_proj", h, value_dim)]),
                       (n_attn, [("attn_qkv", attn_qkv, h), ("attn_o", h, attn_o)]),
                       (len(c["layer_types"]), mlp)],
            "lm_head": ("lm_head", c["vocab_size"], h)}


def model_counts() -> dict[str, list[tuple[str, int, int, int]]]:
    """model -> [(name, N, K, count per forward)]."""
    q3 = [(n, N, K, QWEN3_8B["layers"]) for n, N, K in QWEN3_8B["per_layer"]] + [
        (*QWEN3_8B["lm_head"], 1)
    ]
    m = qwen35_9b()
    q35 = [(n, N, K, count) for count, group in m["groups"] for n, N, K in group] + [
        (*m["lm_head"], 1)
    ]
    return {"qwen3-8b": q3, "qwen3.5-9b": q35}


# (mode, block_n, block_k, num_warps, num_stages) per row bucket; "dot" pads rows to 16, so its
# compiled kernels serve every bucket. num_stages only matters for "dot" (its tiles go through
# cp.async into shared memory); the elementwise modes' loads are not pipelined by Triton 3.9 (sm_90
# PTX: plain ld.global.v4 in the loop), so they hide latency by occupancy and wide tiles instead
_DOT = [
    ("dot", 32, 128, 4, 4),
    ("dot", 64, 128, 4, 4),
    ("dot", 64, 128, 4, 3),
    ("dot", 64, 256, 4, 3),
    ("dot", 128, 128, 4, 4),
    ("dot", 128, 64, 4, 5),
    ("dot", 64, 128, 8, 4),
    ("dot", 32, 256, 4, 3),
    ("dot", 128, 256, 8, 3),
    ("dot", 64, 64, 4, 6),
]
_ELEMENTWISE = {
    1: [
        ("acc", 32, 128, 4, 2),
        ("acc", 64, 128, 4, 2),
        ("acc", 64, 256, 8, 2),
        ("acc", 128, 128, 8, 2),
        ("acc", 32, 256, 4, 2),
        ("acc", 128, 64, 4, 2),
        ("acc", 64, 128, 2, 2),
        ("acc", 128, 256, 8, 2),
        ("sum", 64, 128, 4, 2),
        ("sum", 32, 256, 4, 2),
    ],
    2: [
        ("acc", 16, 128, 4, 2),
        ("acc", 32, 128, 4, 2),
        ("acc", 32, 256, 8, 2),
        ("acc", 64, 128, 8, 2),
        ("sum", 32, 128, 4, 2),
        ("sum", 64, 128, 8, 2),
        ("sum", 32, 256, 4, 2),
    ],
    4: [
        ("acc", 16, 128, 4, 2),
        ("acc", 32, 128, 8, 2),
        ("acc", 16, 256, 8, 2),
        ("sum", 16, 128, 4, 2),
        ("sum", 32, 128, 4, 2),
        ("sum", 32, 256, 8, 2),
    ],
    8: [("sum", 16, 128, 4, 2), ("sum", 32, 128, 8, 2), ("sum", 16, 256, 4, 2)],
    16: [("sum", 16, 128, 4, 2), ("sum", 32, 128, 8, 2), ("sum", 16, 256, 8, 2)],
}
_SPLITS = (1, 2, 4, 8, 16, 32)


def grid_for(M: int, N: int, K: int, sms: int) -> list[G.GemvConfig]:
    bucket = triton.next_power_of_2(M)
    out = []
    for mode, bn, bk, warps, stages in _ELEMENTWISE[bucket] + _DOT:
        out.append(G.GemvConfig(bn, bk, G.choose_split(M, N, K, bn, bk, sms), warps, stages, mode))
    return out


def splits_for(base: G.GemvConfig, N: int, K: int, sms: int) -> list[G.GemvConfig]:
    slabs = triton.cdiv(N, base.block_n)
    return [G.GemvConfig(base.block_n, base.block_k, s, base.num_warps, base.num_stages, base.mode)
            for s in _SPLITS if s != base.split and triton.cdiv(K, s * base.block_k) >= 1
            and (s == 1 or slabs * s <= 32 * sms)]


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (read + write counted): the measure the decode benches
    use (bench/qwen35_model.py on CUDA; bench/breakdown.py's host copy for --dry-run)."""
    if DEV == "cpu":
        from bench.breakdown import cpu_copy_bandwidth

        return cpu_copy_bandwidth(nbytes=64 << 20, repeats=1)
    from bench.qwen35_model import copy_bandwidth as device_copy_bandwidth

    return device_copy_bandwidth(torch.device(DEV))


def empty_cache() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()


_SCALE = 1  # --dry-run divides every N and K by 64


def scaled(n: int) -> int:
    return max(1, n // _SCALE)


class CpuTimer:
    """--dry-run: median wall seconds per call over a few eager repeats (interpreter speed)."""

    def __init__(self, repeats: int):
        self.repeats = repeats

    def __call__(self, call, calls: int) -> float:
        times = []
        for _ in range(self.repeats):
            t = time.perf_counter()
            for i in range(calls):
                call(i)
            times.append((time.perf_counter() - t) / calls)
        return statistics.median(times)


class Timer:
    """Median seconds per call of `call(i)` (i = 0..calls-1) replayed in a CUDA graph."""

    def __init__(self, repeats: int):
        self.repeats = repeats

    def __call__(self, call, calls: int) -> float:
        for i in range(calls):  # compile / warm eagerly, outside the capture
            call(i)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # a private pool per graph: a pool shared with graphs already destroyed trips
        # CUDACachingAllocator's use_count assertion at the next capture (seen on the H200)
        with torch.cuda.graph(graph):
            for i in range(calls):
                call(i)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(self.repeats)]
        graph.replay()
        ev[0][0].record()
        graph.replay()
        graph.replay()
        ev[0][1].record()
        ev[0][1].synchronize()
        est = ev[0][0].elapsed_time(ev[0][1]) / 2e3  # seconds per replay
        # a head start for the GPU queue: the replays below queue up behind this sleep
        torch.cuda._sleep(int(min(0.05, 1.2 * self.repeats * est) * 2e9))
        for s, e in ev:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in ev]
        del graph
        return statistics.median(times) / calls


def check_graph_and_determinism(report: dict) -> None:
    """Capture one call in a CUDA graph, replay, compare with the eager output bit for bit; two
    eager runs bit-equal; and closeness to F.linear — for the heuristic config with and without
    split-K, and with a bias."""
    torch.manual_seed(1)
    checks = []
    for M, N, K, bias in ((1, 4096, 4096, False), (8, 4096, 12288, True), (4, 248320, 4096, False),
                          (16, 6144, 4096, True)):
        N, K = scaled(N), scaled(K)
        w = (torch.randn(N, K, device=DEV) * K ** -0.5).to(torch.bfloat16)
        b = torch.randn(N, device=DEV).to(torch.bfloat16) if bias else None
        x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
        config = G.pick_config(M, N, K, G.sm_count(x.device))
        eager = G.gemv(x, w, b)
        again = G.gemv(x, w, b)
        static_x = x.clone()
        if DEV == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = G.gemv(static_x, w, b)
            static_x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
        else:  # dry run: no graphs
            static_x.copy_(torch.randn_like(x))
            graph, out = None, G.gemv(static_x, w, b)
        fresh = G.gemv(static_x, w, b)
        ref = F.linear(x, w, b)
        err = (eager.float() - ref.float()).abs().max().item() / max(
            1e-6, ref.float().abs().max().item()
        )
        row = dict(
            M=M,
            N=N,
            K=K,
            bias=bias,
            config=config.as_dict(),
            graph_equal=bool(torch.equal(out, fresh)),
            deterministic=bool(torch.equal(eager, again)),
            rel_err_vs_F_linear=err,
        )
        checks.append(row)
        del w, graph
    empty_cache()
    report["checks"] = checks
    ok = all(
        c["graph_equal"] and c["deterministic"] and c["rel_err_vs_F_linear"] < 2**-6 for c in checks
    )
    report["checks_ok"] = ok
    print(f"graph capture / determinism / accuracy checks: {'ok' if ok else 'FAILED'}", flush=True)
    for c in checks:
        print(f"  M={c['M']} N={c['N']} K={c['K']} bias={c['bias']} split={c['config']['split']} "
              f"graph_equal={c['graph_equal']} deterministic={c['deterministic']} "
              f"rel_err={c['rel_err_vs_F_linear']:.2e}", flush=True)


def precompile(shapes, ms, sms, sweep: bool) -> float:
    """Compile every kernel the run will launch, in a thread pool (Triton's AsyncCompileMode);
    returns seconds. Falls back to compiling on first use if that fails."""
    t0 = time.perf_counter()
    jobs = []
    for N, K in shapes:
        w = torch.empty((N, K), dtype=torch.bfloat16, device=DEV)
        for M in ms:
            configs = [G.pick_config(M, N, K, sms)]
            if sweep:
                grid = grid_for(M, N, K, sms)
                configs += grid
                configs += [
                    G.GemvConfig(c.block_n, c.block_k, 2, c.num_warps, c.num_stages, c.mode)
                    for c in grid
                ]
                configs += [
                    G.GemvConfig(c.block_n, c.block_k, 1, c.num_warps, c.num_stages, c.mode)
                    for c in grid
                ]
            jobs += [(M, w, c) for c in configs]
        del w
    try:
        with (
            ThreadPoolExecutor(max_workers=16) as pool,
            triton.AsyncCompileMode(pool, ignore_errors=True),
        ):
            for M, w, c in jobs:
                G.warmup(M, w, c)
    except Exception as exc:  # pragma: no cover - compile on first use instead
        print(
            f"parallel precompile failed ({type(exc).__name__}: {exc}); compiling on first use",
            flush=True,
        )
    empty_cache()
    return time.perf_counter() - t0


def bench_shape(N, K, ms, timer: Timer, sms: int, *, sweep: bool, deadline: float) -> dict:
    nbytes = N * K * 2
    copies = max(1, math.ceil((256 << 20) / nbytes)) if DEV == "cuda" else 1
    calls = max(copies, math.ceil((512 << 20) / nbytes)) if DEV == "cuda" else 1
    torch.manual_seed(N + K)
    ws = [(torch.randn(N, K, device=DEV) * K ** -0.5).to(torch.bfloat16) for _ in range(copies)]
    out = {
        "N": N,
        "K": K,
        "weight_bytes": nbytes,
        "copies": copies,
        "calls_per_graph": calls,
        "by_M": {},
    }
    for M in ms:
        x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
        ref = F.linear(x, ws[0])

        def t_lin():
            return timer(lambda i: F.linear(x, ws[i % copies]), calls)

        def t_gemv(c):
            try:
                y = G.gemv(x, ws[0], None, c)  # compiles here, outside any capture
            except Exception as exc:  # e.g. out of shared memory / registers for this config
                print(f"    config {c} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                return float("nan"), float("nan")
            err = (y.float() - ref.float()).abs().max().item() / max(
                1e-6, ref.float().abs().max().item()
            )
            if err > 2 ** -6:
                return float("nan"), err
            return timer(lambda i: G.gemv(x, ws[i % copies], None, c), calls), err

        row = {"M": M}
        row["F.linear_s"] = t_lin()
        heur = G.pick_config(M, N, K, sms)
        row["heuristic"] = heur.as_dict()
        row["heuristic_s"], row["heuristic_rel_err"] = t_gemv(heur)
        results = {heur: row["heuristic_s"]}
        if sweep and time.perf_counter() < deadline:
            for c in grid_for(M, N, K, sms):
                if c not in results and time.perf_counter() < deadline:
                    results[c] = t_gemv(c)[0]
            ranked = sorted((t, i) for i, t in enumerate(results.values()) if t == t)
            keys = list(results)
            for _, i in ranked[:3]:
                for c in splits_for(keys[i], N, K, sms):
                    if c not in results and time.perf_counter() < deadline:
                        results[c] = t_gemv(c)[0]
        row["swept"] = len(results) - 1
        valid = {c: t for c, t in results.items() if t == t}
        best = min(valid, key=valid.get) if valid else heur
        row["best"], row["best_s"] = best.as_dict(), valid.get(best, float("nan"))
        row["top5"] = [
            dict(c.as_dict(), time_s=t) for c, t in sorted(valid.items(), key=lambda kv: kv[1])[:5]
        ]
        row["bad_configs"] = [c.as_dict() for c, t in results.items() if t != t]
        for key in ("F.linear", "heuristic", "best"):
            row[f"{key}_TBps"] = nbytes / row[f"{key}_s"] / 1e12
        row["speedup_heuristic"] = row["F.linear_s"] / row["heuristic_s"]
        row["speedup_best"] = row["F.linear_s"] / row["best_s"]
        out["by_M"][M] = row
        print(
            f"  N={N:6d} K={K:5d} M={M:2d}"
            f"  F.linear {row['F.linear_s'] * 1e6:8.1f} us {row['F.linear_TBps']:.2f} TB/s"
            f" | heuristic {row['heuristic_s'] * 1e6:8.1f} us {row['heuristic_TBps']:.2f} TB/s"
            f" | best {row['best_s'] * 1e6:8.1f} us {row['best_TBps']:.2f} TB/s"
            f" x{row['speedup_best']:.2f}"
            f" {best.mode} bn={best.block_n} bk={best.block_k} s={best.split} w={best.num_warps}"
            f" st={best.num_stages} ({row['swept']} swept)",
            flush=True,
        )
    ws = None
    empty_cache()
    return out


def model_estimates(by_shape: dict, counts: dict, ms, copy_bw: float) -> dict:
    est = {}
    for model, layers in counts.items():
        est[model] = {}
        for M in ms:
            tot = {"F.linear": 0.0, "heuristic": 0.0, "best": 0.0, "min_F.linear_best": 0.0,
                   "min_F.linear_heuristic": 0.0}
            nbytes = 0
            for _, N, K, count in layers:
                r = by_shape[(N, K)]["by_M"][M]
                tot["F.linear"] += count * r["F.linear_s"]
                tot["heuristic"] += count * r["heuristic_s"]
                tot["best"] += count * r["best_s"]
                tot["min_F.linear_best"] += count * min(r["F.linear_s"], r["best_s"])
                tot["min_F.linear_heuristic"] += count * min(r["F.linear_s"], r["heuristic_s"])
                nbytes += count * N * K * 2
            est[model][M] = {f"{k}_ms": v * 1e3 for k, v in tot.items()}
            est[model][M]["weight_bytes"] = nbytes
            est[model][M]["floor_at_copy_bw_ms"] = nbytes / copy_bw * 1e3
    return est


def tuned_snippet(by_shape: dict) -> str:
    lines = ["TUNED: dict[tuple[int, int], dict[int, GemvConfig]] = {"]
    for (N, K), s in by_shape.items():
        entries = []
        for M, r in s["by_M"].items():
            if r["best_s"] < r["F.linear_s"] and M == triton.next_power_of_2(M):
                b = r["best"]
                entries.append(
                    f"{M}: GemvConfig({b['block_n']}, {b['block_k']}, "
                    f"{b['split']}, {b['num_warps']}, "
                    f"{b['num_stages']}, {b['mode']!r})"
                )
        if entries:
            lines.append(f"    ({N}, {K}): {{" + ", ".join(entries) + "},")
    lines.append("}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument(
        "--budget",
        type=float,
        default=150.0,
        help="seconds for the whole run (sweeps stop past it)",
    )
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU under TRITON_INTERPRET=1 with N, K / 64 and few repeats: checks the script, "
        "not speed",
    )
    args = ap.parse_args(argv)
    global DEV, _SCALE
    if args.dry_run:
        if not G.INTERPRETED:
            print("--dry-run needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        DEV, _SCALE = "cpu", 64
    elif not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    ms = [int(m) for m in args.ms.split(",")]
    sms = G.sm_count(torch.device(DEV))
    counts = {
        m: [(n, scaled(N), scaled(K), c) for n, N, K, c in v] for m, v in model_counts().items()
    }
    shapes = list(dict.fromkeys((N, K) for layers in counts.values() for _, N, K, _ in layers))
    report = {
        "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)",
        "sms": sms,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "ms": ms,
        "repeats": args.repeats,
        "shapes": shapes,
        "models": {
            m: [dict(name=n, N=N, K=K, count=c) for n, N, K, c in v] for m, v in counts.items()
        },
    }
    report["copy_bw_Bps"] = copy_bw = copy_bandwidth()
    print(f"{report['device']} ({sms} SMs), copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    check_graph_and_determinism(report)
    report["precompile_s"] = (
        precompile(shapes, ms, sms, not args.no_sweep) if DEV == "cuda" else 0.0
    )
    print(f"precompile {report['precompile_s']:.1f} s", flush=True)
    timer = Timer(args.repeats) if DEV == "cuda" else CpuTimer(min(args.repeats, 2))
    by_shape = {}
    reserve_per_shape = 4.0  # F.linear + heuristic at every M of one shape, generously
    for i, (N, K) in enumerate(shapes):
        deadline = t_start + args.budget - reserve_per_shape * (len(shapes) - i - 1)
        by_shape[(N, K)] = bench_shape(
            N, K, ms, timer, sms, sweep=not args.no_sweep, deadline=deadline
        )
    report["by_shape"] = {f"{N}x{K}": v for (N, K), v in by_shape.items()}
    report["model_estimates"] = est = model_estimates(by_shape, counts, ms, copy_bw)
    report["tuned_snippet"] = snippet = tuned_snippet(by_shape)
    report["total_s"] = time.perf_counter() - t_start
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("\nwhole-model linear layers per forward (ms; floor = weight bytes / copy bandwidth):")
    for model, by_m in est.items():
        for M, e in by_m.items():
            print(
                f"  {model:11s} B={M:2d}: F.linear {e['F.linear_ms']:.3f}"
                f"  triton heuristic {e['heuristic_ms']:.3f}"
                f"  triton best {e['best_ms']:.3f}"
                f"  min(F.linear, best) {e['min_F.linear_best_ms']:.3f}"
                f"  floor {e['floor_at_copy_bw_ms']:.3f}"
            )
    print("\nbest configs as a TUNED table for kernels/gemv.py (only where faster than F.linear):")
    print(snippet)
    print(f"\nchecks_ok={report['checks_ok']} total {report['total_s']:.1f} s -> {args.out}")
    return 0 if report["checks_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
