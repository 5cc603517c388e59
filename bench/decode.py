"""`infernix bench decode`: what a JSON Schema constraint costs per output token, as JSON.

For each batch size B, one engine (`max_batch` = the largest B, CUDA graphs on CUDA) runs B
concurrent greedy requests of a fixed `max_tokens`, first unconstrained, then each with a typical
JSON Schema (`bench.grammar.SCHEMAS`, request i gets schema i mod 2). Per mode it reports
time to first token (p50 over requests), time per output token (p50 over requests of
decode time / (tokens - 1)), throughput (all output tokens / wall time of the round) and the
constraint report's CPU seconds (mask fills, accepts), plus constrained / unconstrained TPOT.
Our engine's rounds are bench/engine_rounds.py's. The reference engine (bench/reference.py) is
Hugging Face `generate` over the same weights (a `Qwen3ForCausalLM` or `LlamaForCausalLM` that
adopts our state dict), unconstrained and with xgrammar's HF logits processor. Targets (measured,
never asserted): constrained TPOT within 3% of unconstrained at every B on the H200; ours >= 3x
faster per token than the reference at B = 1; CPU mask work hidden at B = 1.

Models: `smollm2` (the built-in default), `qwen3-8b-random`, a random-weight bf16 model of
Qwen3-8B's shape over the Qwen3.5 vocabulary, and `qwen35-9b-random`, the random-weight
Qwen3.5-9B-shaped hybrid text model (structure only: timings, never quality; no HF reference).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.engine_rounds import bench_engine
from bench.models import build_runtime
from bench.report import report_header, write_report
from bench.stats import ratio as _ratio
from services.worker.runtime import ModelRuntime


@dataclass(frozen=True)
class DecodeBenchOptions:
    batch_sizes: tuple[int, ...] = (1, 8)  # concurrent requests per round, each >= 1
    max_tokens: int = 32  # output tokens per request, >= 2 (TPOT needs two tokens)
    prompt_tokens: int = 64  # approximate prompt length per request, >= 1
    reference: bool = True  # also time Hugging Face generate
    reference_batch_sizes: tuple[int, ...] = (1,)  # batch sizes the reference runs, each >= 1
    reference_max_tokens: int | None = None  # None: max_tokens
    cuda_graphs: bool = True  # our engine's decode graphs (CUDA only)
    warmup_tokens: int = 4  # output tokens of the warm-up rounds, >= 2
    compare_unfused: bool = False  # also run the op-by-op model path (the model's reference)
    compare_serial: bool = False  # also run the fused path with the engine's pipeline off
    compare_float32: bool = False  # also run the fused path on float32 weights (CPU GEMV off)
    breakdown: bool = False  # the device step breakdown and memory floor (its breakdown.py)
    # also an unconstrained round whose rows ask for logprobs with this many alternatives
    # (0..20; None: no such round), beside the others in the same run
    logprobs: int | None = None
    # also rounds whose requests arrive this many milliseconds apart (unconstrained and with the
    # schemas), beside the simultaneous ones: rows join a decoding batch, so their prefill steps
    # fall among the others' decode steps (None: no such rounds)
    stagger_ms: float | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        """Engine paths the rounds run, the befores first: "unfused" (op-by-op model, no
        pipeline; the greedy sampler as in production), "float32" (fused model, its weight GEMMs
        through F.linear on the float32 weights even where the CPU GEMV reads the checkpoint's
        blocks: INFERNIX_CPU_GEMV=0), "serial" (fused model, the pipeline off), "fused" (the
        production path: the fused model path and, on CUDA, the engine's pipeline) always."""
        return (("unfused",) if self.compare_unfused else ()) + \
            (("float32",) if self.compare_float32 else ()) + \
            (("serial",) if self.compare_serial else ()) + ("fused",)

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "reference_batch_sizes"):
            sizes = getattr(self, name)
            if not sizes or any(b < 1 for b in sizes):
                raise ValueError(
                    f"DecodeBenchOptions.{name} must be non-empty sizes >= 1, got {sizes}"
                )
        for name, low in (("max_tokens", 2), ("prompt_tokens", 1), ("warmup_tokens", 2)):
            if getattr(self, name) < low:
                raise ValueError(
                    f"DecodeBenchOptions.{name} must be >= {low}, got {getattr(self, name)}"
                )
        if self.stagger_ms is not None and not self.stagger_ms > 0:
            raise ValueError(f"DecodeBenchOptions.stagger_ms must be > 0, got {self.stagger_ms}")
        if self.reference_max_tokens is not None and self.reference_max_tokens < 2:
            raise ValueError(f"DecodeBenchOptions.reference_max_tokens must be >= 2, got "
                             f"{self.reference_max_tokens}")


# ---------------------------------------------------------------- report


_MODES = ("unconstrained", "constrained")  # the rounds every path and the reference run


def _speedups(before: dict, after: dict, key: str = "tpot_p50_ms") -> dict[str, float | None]:
    """Per mode, how many times faster `after` is than `before` by `key` (ms per token)."""
    return {m: _ratio(before[m][key], after[m][key]) for m in _MODES}


def _agreement(ours: dict, ref: dict) -> float:
    pairs = list(zip(ours["texts"], ref["texts"]))
    return round(sum(a == b for a, b in pairs) / len(pairs), 3)


def bench_decode(runtime: ModelRuntime, opts: DecodeBenchOptions, log=lambda line: None,
                 partial=lambda results: None) -> dict:
    """Run the whole benchmark on `runtime`; returns the report's `results` and `targets`.
    `log(line)` gets progress lines; `partial(results)` the raw results measured so far after
    each batch size (so an interrupted run still leaves numbers)."""
    paths: dict[str, dict] = {}  # model path -> the engine's rows
    for path in opts.paths:
        def partial_path(rows: dict, path: str = path) -> None:
            partial(
                {**{f"engine_{p}": r for p, r in paths.items()}, f"engine_{path}": rows["engine"]}
            )

        paths[path] = asyncio.run(bench_engine(runtime, opts, log, partial_path, path))
    engine = paths["fused"]
    if hasattr(runtime.model, "fused"):
        runtime.model.fused = True
    breakdown = None
    if opts.breakdown:
        from bench.breakdown import step_breakdown

        breakdown = step_breakdown(runtime, opts.batch_sizes,
                                   [p for p in opts.paths if p != "serial"])  # model paths
        log(f"breakdown: {breakdown['rows']}")
    done = {"engine": engine}
    reference = None
    if opts.reference:
        from bench.reference import bench_reference

        reference = bench_reference(runtime, opts, log,
                                     lambda rows: partial({**done, **rows}))
    rows = []
    for b in opts.batch_sizes:
        row = {"batch_size": b, "engine": engine[b], "reference": None}
        if "unfused" in paths:
            before = paths["unfused"][b]
            row["engine_unfused"] = before
            row["speedup_fused_over_unfused"] = _speedups(before, engine[b])
        if "float32" in paths:
            before = paths["float32"][b]
            row["engine_float32"] = before
            row["speedup_over_float32"] = _speedups(before, engine[b])
            row["outputs_equal_float32"] = {m: _agreement(engine[b][m], before[m]) for m in _MODES}
        if "serial" in paths:
            serial = paths["serial"][b]
            row["engine_serial"] = serial
            row["speedup_pipeline"] = _speedups(serial, engine[b])
            row["speedup_pipeline_steady"] = _speedups(serial, engine[b], "tpot_steady_ms")
        if breakdown is not None:
            row["breakdown"] = _breakdown_row(breakdown["rows"][b], paths, b)
        if reference is not None and b in reference:
            ref = reference[b]
            row["reference"] = ref
            row["speedup_tpot_unconstrained"] = _ratio(ref["unconstrained"]["tpot_p50_ms"],
                                                       engine[b]["unconstrained"]["tpot_p50_ms"])
            row["speedup_tpot_constrained"] = _ratio(ref["constrained"]["tpot_p50_ms"],
                                                     engine[b]["constrained"]["tpot_p50_ms"])
            row["outputs_equal_fraction"] = {m: _agreement(engine[b][m], ref[m]) for m in _MODES}
        rows.append(row)
    first = rows[0] if rows[0]["batch_size"] == 1 else None
    targets = {
        "constrained_tpot_within_3pct": {r["batch_size"]: r["engine"]["tpot_ratio"] is not None
                                         and r["engine"]["tpot_ratio"] <= 1.03 for r in rows},
        "speedup_vs_reference_at_b1_ge_3x": None if first is None or first["reference"] is None
        else first["speedup_tpot_unconstrained"] >= 3.0,
        "mask_hidden_at_b1": None if first is None else first["engine"]["tpot_ratio"] <= 1.03,
    }
    if opts.stagger_ms is not None:  # p50 TPOT with staggered arrivals <= 1.15x the steady step
        targets["staggered_tpot_within_15pct_of_steady"] = {
            r["batch_size"]: {m: v is not None and v <= 1.15
                              for m, v in r["engine"]["staggered_over_steady"].items()}
            for r in rows}
    if breakdown is not None:
        targets.update(_speed_targets(rows, first))
    return {"results": rows, "reference": None if reference is None else {
        "max_tokens": reference["max_tokens"], "warmup": reference["warmup"],
        "logits_check": reference["logits_check"]},
            "targets": targets, "breakdown": None if breakdown is None else {
                k: v for k, v in breakdown.items() if k != "rows"}}


def _breakdown_row(device_rows: dict, paths: dict, b: int) -> dict:
    """Per path: the device times, plus the engine's unconstrained TPOT and what the host adds to
    it (TPOT - forward - sample: the GPU idles then unless the host overlaps the device)."""
    out = {}
    rows = dict(device_rows)
    if "serial" in paths:  # the same model path as "fused", the engine's pipeline off
        rows["serial"] = device_rows["fused"]
    for path, dev in rows.items():
        tpot = paths[path][b]["unconstrained"]["tpot_p50_ms"]
        host = tpot - dev["forward_ms"] - dev["sample_ms"]
        out[path] = {**dev, "tpot_ms": tpot, "host_ms": round(host, 4),
                     "device_idle_fraction": round(max(host, 0.0) / tpot, 4),
                     "tpot_over_floor": round(tpot / dev["floor_ms"], 3)}
        steady = paths[path][b]["unconstrained"]["tpot_steady_ms"]
        if steady is not None:  # the same from the steady-state step (no prefill inside)
            host = steady - dev["forward_ms"] - dev["sample_ms"]
            out[path].update(tpot_steady_ms=steady, host_steady_ms=round(host, 4),
                             device_idle_fraction_steady=round(max(host, 0.0) / steady, 4),
                             tpot_steady_over_floor=round(steady / dev["floor_ms"], 3))
    return out


def _speed_targets(rows: list[dict], first: dict | None) -> dict:
    """The decode-speed goals measured against the breakdown's floor (never asserted)."""
    by_b = {r["batch_size"]: r for r in rows}
    out: dict[str, Any] = {"tpot_b1_le_1_3x_floor": None, "gpu_idle_lt_5pct": {},
                           "constrained_tpot_within_2pct": {}, "throughput_b64_ge_5000": None,
                           "speedup_vs_reference_ge_5x": {}}
    if first is not None and "breakdown" in first:
        out["tpot_b1_le_1_3x_floor"] = first["breakdown"]["fused"]["tpot_over_floor"] <= 1.3
    out["gpu_idle_steady_lt_5pct"], out["constrained_tpot_steady_within_2pct"] = {}, {}
    for b, r in by_b.items():
        if "breakdown" in r:
            fused = r["breakdown"]["fused"]
            out["gpu_idle_lt_5pct"][b] = fused["device_idle_fraction"] < 0.05
            if "device_idle_fraction_steady" in fused:
                out["gpu_idle_steady_lt_5pct"][b] = fused["device_idle_fraction_steady"] < 0.05
        ratio = r["engine"]["tpot_ratio"]
        out["constrained_tpot_within_2pct"][b] = ratio is not None and ratio <= 1.02
        steady = r["engine"]["tpot_steady_ratio"]
        out["constrained_tpot_steady_within_2pct"][b] = steady is not None and steady <= 1.02
        if r.get("reference") is not None:
            out["speedup_vs_reference_ge_5x"][b] = (r["speedup_tpot_unconstrained"] or 0) >= 5.0
    if 64 in by_b:
        out["throughput_b64_ge_5000"] = (
            by_b[64]["engine"]["constrained"]["throughput_tok_s"] >= 5000
        )
    return out


def run(args: argparse.Namespace) -> int:
    cuda = args.device.startswith("cuda")
    if args.model == "qwen35-9b-random" and args.reference:
        print("bench decode: the Hugging Face reference covers the dense models only; pass "
              "--no-reference with --model qwen35-9b-random", file=sys.stderr)
        return 2
    opts = DecodeBenchOptions(
        batch_sizes=tuple(args.batch_sizes or ((1, 8, 32, 64) if cuda else (1, 8, 32))),
        max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens, reference=args.reference,
        reference_batch_sizes=tuple(args.reference_batch_sizes or ((1, 8) if cuda else (1,))),
        reference_max_tokens=args.reference_max_tokens, cuda_graphs=not args.no_cuda_graphs,
        compare_unfused=args.compare_unfused, compare_serial=args.compare_serial,
        compare_float32=args.compare_float32,
        breakdown=args.breakdown, logprobs=args.logprobs, stagger_ms=args.stagger_ms)

    def log(line: str) -> None:
        print(f"[bench decode] {line}", file=sys.stderr, flush=True)

    from shared.logging import configure_logging

    configure_logging(args.log_level)  # per-request logs would flood the timing rounds

    started = time.perf_counter()
    runtime = build_runtime(args.model, args.device)
    log(f"runtime {args.model} on {args.device} ready in {time.perf_counter() - started:.1f} s")
    report: dict[str, Any] = {
        **report_header("decode", args, runtime),
        "options": {"batch_sizes": list(opts.batch_sizes), "max_tokens": opts.max_tokens,
                    "prompt_tokens": opts.prompt_tokens, "reference": opts.reference,
                    "reference_batch_sizes": list(opts.reference_batch_sizes),
                    "cuda_graphs": opts.cuda_graphs, "greedy": True, "paths": list(opts.paths),
                    "breakdown": opts.breakdown, "logprobs": opts.logprobs,
                    "stagger_ms": opts.stagger_ms},
    }

    def partial(results: dict) -> None:
        if args.out:
            with open(args.out + ".partial", "w", encoding="utf-8") as f:
                json.dump({**report, "partial": results}, f, indent=2, default=str)

    report.update(bench_decode(runtime, opts, log, partial))
    report["total_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.out)
    return 0
