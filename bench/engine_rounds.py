"""Our engine's side of `infernix bench decode`: timed rounds of B concurrent greedy requests on
one in-process engine, per engine path (bench/decode.py's `DecodeBenchOptions.paths`), each round
unconstrained, constrained and (when asked) with logprobs, after an untimed warm-up round of
each. The Hugging Face side is bench/reference.py."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from bench.models import prompt_texts
from bench.stats import ratio as _ratio
from bench.stats import schemas as _schemas
from bench.stats import summary as _summary
from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.models import layers as ops
from services.worker.runtime import ModelRuntime
from shared.contract import OutputConstraint
from shared.generation import (
    Finished,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    Started,
)

if TYPE_CHECKING:
    from bench.decode import DecodeBenchOptions


async def collect(client, request: GenerateRequest, marks: dict | None = None) -> Finished:
    """The request's Finished event. `marks` (when given) gets (wall time, engine steps) at the
    request's first output event ("first") and at its Finished ("end")."""
    engine = client.engine
    async for event in client.generate(request):
        if marks is not None and "first" not in marks and not isinstance(event, Started):
            marks["first"] = (time.perf_counter(), engine.steps)
        if isinstance(event, Finished):
            if event.error is not None:
                raise RuntimeError(f"request {request.request_id} failed: {event.error}")
            if marks is not None:
                marks["end"] = (time.perf_counter(), engine.steps)
            return event
    raise RuntimeError(f"request {request.request_id} ended without Finished")


def steady_step_ms(marks: list[dict]) -> float | None:
    """Milliseconds per engine step while every request of the round was decoding: from the
    last request's first output to the first request's end (no prefill step of the round falls
    inside, so each step is one token of every row: the steady-state TPOT). None when that
    window holds no step."""
    t0, s0 = max((m["first"] for m in marks), key=lambda x: x[0])
    t1, s1 = min((m["end"] for m in marks), key=lambda x: x[0])
    if s1 <= s0:
        return None
    return round((t1 - t0) / (s1 - s0) * 1e3, 3)


async def _engine_round(client, runtime: ModelRuntime, prompts: list[str], max_tokens: int,
                        schemas: list[dict] | None, tag: str,
                        logprobs: int | None = None, stagger_s: float = 0.0) -> dict[str, Any]:
    sampling = SamplingParams(temperature=0.0)
    requests = [
        GenerateRequest(
            f"{tag}-{i}",
            PromptInput(text=p),
            RequestOptions(
                max_tokens=max_tokens,
                sampling=sampling,
                constraint=OutputConstraint.json_schema(schemas[i % len(schemas)])
                if schemas
                else None,
                logprobs=logprobs,
            ),
            model=runtime.name,
        )
        for i, p in enumerate(prompts)
    ]
    marks: list[dict] = [{} for _ in requests]

    async def arrive(i: int, request: GenerateRequest, m: dict) -> Finished:
        if stagger_s:  # request i arrives i * stagger_s after the first
            await asyncio.sleep(i * stagger_s)
        return await collect(client, request, m)

    start = time.perf_counter()
    finished = await asyncio.gather(*(arrive(i, r, m)
                                      for i, (r, m) in enumerate(zip(requests, marks))))
    wall = time.perf_counter() - start
    tokens = [f.usage.completion_tokens for f in finished]
    tpot = [f.timings["decode"] / (n - 1) for f, n in zip(finished, tokens) if n >= 2]
    out = _summary([f.timings["ttft"] for f in finished], tpot, tokens, wall,
                   [f.content for f in finished], schemas)
    # TPOT p50 includes the steps that prefill later requests of the round (what a user sees);
    # the steady-state figure excludes them (what the decode step itself costs)
    out["tpot_steady_ms"] = steady_step_ms(marks)
    out["texts"] = [f.content for f in finished]
    if schemas:
        reports = [f.constraint or {} for f in finished]
        mask_s = sum(r.get("mask_seconds", 0.0) for r in reports)
        positions = sum(r.get("mask_positions", 0) for r in reports)
        out["constraint_cpu"] = {
            "mask_seconds": round(mask_s, 6),
            "accept_seconds": round(sum(r.get("accept_seconds", 0.0) for r in reports), 6),
            "mask_positions": positions,
            "mask_us_per_position": round(1e6 * mask_s / positions, 2) if positions else None,
        }
    return out


async def bench_engine(runtime: ModelRuntime, opts: DecodeBenchOptions, log,
                        partial, path: str = "fused") -> dict:
    schemas = _schemas()
    max_len = opts.prompt_tokens + max(opts.max_tokens, opts.warmup_tokens) + 32
    config = EngineConfig(max_batch=max(opts.batch_sizes), max_len=max_len,
                          prefill_chunk=max(512, opts.prompt_tokens + 32),
                          cuda_graphs=opts.cuda_graphs, pipeline=None if path == "fused" else False)
    model = runtime.model
    if hasattr(model, "fused"):
        model.fused = path != "unfused"  # before the engine captures its graphs
    cpu_gemv = ops.CPU_GEMV
    ops.CPU_GEMV = cpu_gemv and path != "float32"
    client = open_in_process(runtime, config)
    try:
        for schema in schemas:  # compile outside every timed round
            await client.engine.grammar.compile(
                OutputConstraint.json_schema(schema), model=runtime.name
            )
        rows = {}
        modes = [("unconstrained", None, None), ("constrained", schemas, None)]
        if opts.logprobs is not None:
            modes.append(("logprobs", None, opts.logprobs))
        stagger = (opts.stagger_ms or 0.0) / 1e3
        staggered = [("staggered_" + m, sch, None) for m, sch, _ in modes[:2]] if stagger else []
        for b in opts.batch_sizes:
            prompts = prompt_texts(runtime, b, opts.prompt_tokens)
            for mode, sch, lp in modes:
                await _engine_round(
                    client, runtime, prompts, opts.warmup_tokens, sch, f"w{b}{mode}", lp
                )
            entry = {}
            for mode, sch, lp in modes + staggered:
                entry[mode] = await _engine_round(
                    client, runtime, prompts, opts.max_tokens, sch, f"m{b}{mode}", lp,
                    stagger if mode.startswith("staggered_") else 0.0)
                log(f"engine[{path}] B={b} {mode}: tpot {entry[mode]['tpot_p50_ms']} ms, "
                    f"{entry[mode]['throughput_tok_s']} tok/s")
            if staggered:  # what joining rows' prefill steps cost the decoding ones
                entry["staggered_over_steady"] = {
                    m: _ratio(entry["staggered_" + m]["tpot_p50_ms"], entry[m]["tpot_steady_ms"])
                    for m, _, _ in modes[:2]}
            entry["tpot_ratio"] = _ratio(entry["constrained"]["tpot_p50_ms"],
                                         entry["unconstrained"]["tpot_p50_ms"])
            entry["tpot_steady_ratio"] = _ratio(entry["constrained"]["tpot_steady_ms"],
                                                entry["unconstrained"]["tpot_steady_ms"])
            if opts.logprobs is not None:  # what reading logprobs adds to a greedy row's step
                entry["logprobs_tpot_ratio"] = _ratio(entry["logprobs"]["tpot_p50_ms"],
                                                      entry["unconstrained"]["tpot_p50_ms"])
            rows[b] = entry
            partial({"engine": rows})
        return rows
    finally:
        await client.aclose()
        ops.CPU_GEMV = cpu_gemv
