"""`infernix bench grammar`: what constraints cost the CPU, per vocabulary and engine, as JSON.

For every case of `bench.grammar_cases` and each vocabulary (single-threaded engines, CPU
time of this process, so other jobs on a shared machine inflate nothing but the wall clock):

- cold: compile (validate + convert + engine compile) and time to first mask (compile + matcher +
  first fill; lazily built mask work counts), p50 over `--repeats` fresh compiles;
- mask fill per token while a matcher walks the case's outputs tokenised by the model's own
  tokenizer: the first walk after each cold compile ("cold", lazy work included) and a second walk
  over the same compiled constraint ("warm", what the next request of a cached grammar pays);
- lookahead: K+1 masks (K = 15 drafts taken from the output) in one `fill_lookahead` call, and as
  a loop of fills, accepts and one rollback, against the sum of the K+1 single fills at the same
  positions (goal: ratio <= 1);
- sample: `infernix grammar sample`'s random walks (uniformly random legal tokens), tokens/s;
- store: the compressed blob size and its load (deserialise) time against the cold compile.

JSON cases are measured on every engine side by side ("chosen" marks the one the rule picks);
other cases on the engine the rule picks. A case whose work exceeds `--case-budget-s` of CPU time
stops walking early and says so (`truncated`). With `--redis-url`, the typical schemas also go
through the real GrammarCache (cold / L1 hit / Redis hit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import zlib
from typing import Any

import numpy as np

from bench.grammar_cases import SCHEMAS as _CASES
from bench.grammar_cases import Case, all_cases
from bench.report import host, write_report
from services.grammar.engines.engine import CompiledConstraint
from shared.contract import ConstraintKind
from shared.frontends import get_domain

K = 15  # drafts per lookahead round
# (schema, typical outputs) of the two typical schemas: the worker's decode benchmark uses them.
SCHEMAS = [(c.constraint.schema, [json.loads(t) for t in c.outputs])
           for c in _CASES if c.name in ("person", "forecast")]
GOALS = {"mask_p50_us": 40.0, "mask_p99_us": 1000.0, "ttfm_p50_ms": 50.0, "sample_tok_s": 200.0}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


def _stats(values: list[float], digits: int = 1) -> dict[str, Any]:
    return {"p50": round(_pct(values, 0.5), digits), "p99": round(_pct(values, 0.99), digits),
            "max": round(max(values), digits) if values else 0.0, "n": len(values)}


def _cpu() -> float:
    # The process's CPU time: engines compile in their own worker threads (xgrammar even with
    # max_threads=1), and nothing else runs in this process while it measures.
    return time.process_time()


def tokenize(model: str, text: str) -> list[int]:
    if model == "smollm2":
        from shared.frontends.smollm2 import smollm2_tokenizer

        return smollm2_tokenizer().encode(text).ids
    from shared.frontends.qwen35 import qwen35_tokenizer

    # Output text as text: a spelled "<tool_call>" is ordinary bytes here (Hermes framing).
    return list(qwen35_tokenizer().encode(text, allowed_special=set()))


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.until = _cpu() + seconds
        self.truncated = False

    def spent(self) -> bool:
        if _cpu() > self.until:
            self.truncated = True
        return self.truncated


def walk_fills(constraint: CompiledConstraint, tokens: list[int], budget: _Budget) -> list[float]:
    """Microseconds of CPU per fill_mask while accepting `tokens` one by one."""
    matcher = constraint.matcher()
    mask = np.zeros((1, constraint.domain.mask_words), dtype=np.int32)
    out = []
    for t in tokens:
        if budget.spent():
            break
        start = _cpu()
        matcher.fill_mask(mask, 0)
        out.append((_cpu() - start) * 1e6)
        if not matcher.accept_token(t):
            raise RuntimeError(f"bench output token {t} was refused by its own constraint")
    return out


def lookahead_ratio(constraint: CompiledConstraint, tokens: list[int], budget: _Budget,
                    ) -> dict[str, Any]:
    """K+1 masks for K drafts at positions 0, K, 2K, ... of `tokens`: one `fill_lookahead` call
    ("chain") and the same as a Python loop of fill_mask / accept_token / one rollback ("loop"),
    against the K+1 single fills at the same positions (goal: chain / singles <= 1)."""
    domain = constraint.domain
    out = np.zeros((K + 1, domain.mask_words), dtype=np.int32)
    chain, loop, single = [], [], []
    m = constraint.matcher()
    for start in range(0, max(len(tokens) - K, 0), K):
        if budget.spent():
            break
        drafts = tokens[start:start + K]
        t0 = _cpu()
        n = m.fill_lookahead(drafts, out)
        t1 = _cpu()
        assert n == K
        for i in range(K + 1):
            m.fill_mask(out, i)
            if i < K:
                m.accept_token(drafts[i])
        m.rollback(K)
        t2 = _cpu()
        s = 0.0
        for i in range(K + 1):
            a = _cpu()
            m.fill_mask(out, i)
            s += _cpu() - a
            if i < K:
                m.accept_token(drafts[i])
        m.rollback(K)
        chain.append((t1 - t0) * 1e6)
        loop.append((t2 - t1) * 1e6)
        single.append(s * 1e6)
        for t in drafts:  # advance to the next round's start
            m.accept_token(t)
    if not chain:
        return {"rounds": 0}
    return {"rounds": len(chain), "k": K, "chain_us_p50": round(statistics.median(chain), 1),
            "loop_us_p50": round(statistics.median(loop), 1),
            "singles_us_p50": round(statistics.median(single), 1),
            "ratio_p50": round(statistics.median(a / b for a, b in zip(chain, single) if b), 3),
            "loop_ratio_p50": round(statistics.median(a / b for a, b in zip(loop, single) if b), 3)}


def sample_rate(constraint: CompiledConstraint, seconds: float, max_tokens: int) -> dict[str, Any]:
    """`grammar sample` random walks for about `seconds` of CPU; tokens per CPU and wall second."""
    from services.grammar.engines.matching import random_walk

    rng = random.Random(0)
    tokens = walks = dead = 0
    c0, w0 = _cpu(), time.perf_counter()
    while _cpu() - c0 < seconds and walks < 50:
        walk = random_walk(constraint, constraint.domain, rng, max_tokens=max_tokens, end_bias=0.2)
        tokens += walk.tokens
        walks += 1
        dead += walk.dead_end
    cpu, wall = _cpu() - c0, time.perf_counter() - w0
    return {"walks": walks, "tokens": tokens, "dead_ends": dead,
            "tok_per_cpu_s": round(tokens / cpu, 1) if cpu else 0.0,
            "tok_per_wall_s": round(tokens / wall, 1) if wall else 0.0}


def engines_for(case: Case) -> list[str]:
    from services.grammar.compiler import BUILDABLE, choose_engine

    kind = getattr(case.constraint, "kind", None)
    if kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT):
        return list(BUILDABLE)

    return [choose_engine(case.constraint, interface=True)]


def bench_case(compiler: Any, model: str, case: Case, engine: str, args: argparse.Namespace,
               ) -> dict[str, Any]:
    from services.grammar.compiler import choose_engine

    budget = _Budget(args.case_budget_s)
    token_lists = [tokenize(model, text) for text in case.outputs]
    compile_ms, ttfm_ms, cold, warm = [], [], [], []
    constraint = None
    for _ in range(args.repeats):
        if budget.spent() and constraint is not None:
            break
        t0 = _cpu()
        constraint = compiler.compile(case.constraint, engine=engine).grammar
        t1 = _cpu()
        m = constraint.matcher()
        m.fill_mask(np.zeros((1, constraint.domain.mask_words), dtype=np.int32), 0)
        t2 = _cpu()
        compile_ms.append((t1 - t0) * 1000)
        ttfm_ms.append((t2 - t0) * 1000)
        for tokens in token_lists:
            cold.extend(walk_fills(constraint, tokens, budget))
    assert constraint is not None
    for tokens in token_lists:
        warm.extend(walk_fills(constraint, tokens, budget))
    look = lookahead_ratio(constraint, max(token_lists, key=len), budget)
    row: dict[str, Any] = {
        "case": case.name, "category": case.category, "engine": engine,
        "chosen": engine == choose_engine(case.constraint, interface=True),
        "compile_ms_p50": round(statistics.median(compile_ms), 2),
        "ttfm_ms_p50": round(statistics.median(ttfm_ms), 2),
        "mask_cold_us": _stats(cold), "mask_warm_us": _stats(warm), "lookahead": look,
    }
    if args.sample_s > 0 and not budget.spent():
        row["sample"] = sample_rate(constraint, args.sample_s, args.sample_tokens)
    t0 = _cpu()
    text = constraint.serialize_json()
    blob = zlib.compress(text.encode(), 1)
    t1 = _cpu()
    compiler.deserialize(zlib.decompress(blob).decode())
    t2 = _cpu()
    row["store"] = {"blob_bytes": len(blob), "serialize_ms": round((t1 - t0) * 1000, 1),
                    "load_ms": round((t2 - t1) * 1000, 2),
                    "memory_size_bytes": constraint.memory_size_bytes}
    row["truncated"] = budget.truncated
    row["goals"] = _goals(row, model)
    return row


def _goals(row: dict[str, Any], model: str) -> dict[str, Any]:
    """Each of `GOALS` that applies to this row: the measured value and whether it is met."""
    out: dict[str, Any] = {}
    if model == "qwen3.5":
        for walk in ("cold", "warm"):
            s = row[f"mask_{walk}_us"]
            out[f"mask_{walk}_p50_us"] = [s["p50"], s["p50"] <= GOALS["mask_p50_us"]]
            out[f"mask_{walk}_p99_us"] = [s["p99"], s["p99"] <= GOALS["mask_p99_us"]]
        if row["category"] == "schema":
            out["ttfm_p50_ms"] = [row["ttfm_ms_p50"], row["ttfm_ms_p50"] <= GOALS["ttfm_p50_ms"]]
        if row["lookahead"].get("rounds"):
            out["lookahead_ratio"] = [row["lookahead"]["ratio_p50"],
                                      row["lookahead"]["ratio_p50"] <= 1.0]
    if model == "smollm2" and "sample" in row and row["category"] in ("schema", "bounded", "gbnf"):
        rate = row["sample"]["tok_per_cpu_s"]
        out["sample_tok_per_cpu_s"] = [rate, rate >= GOALS["sample_tok_s"]]
    return out


async def _cache_rows(model: str, redis_url: str, repeats: int) -> list[dict[str, Any]]:
    """The typical schemas through the real GrammarCache: cold, L1 hit, Redis hit."""
    from services.grammar.cache.grammar_cache import CacheConfig, GrammarCache, encode_blob
    from services.grammar.cache.limits import StorePolicy
    from services.grammar.cache.store import RedisStore, StoreConfig
    from services.grammar.compiler import ModelCompiler

    compiler = ModelCompiler(get_domain(model))
    rows = []
    for case in [c for c in _CASES if c.category == "schema"]:
        cold, l1, hit, sizes = [], [], [], []
        for r in range(repeats):
            prefix = f"infernix:bench:{time.time_ns()}:{r}"
            stores = [RedisStore(StoreConfig(redis_url, prefix=prefix)) for _ in range(2)]
            # Store every grammar (the store policy would skip those cheaper to compile): the
            # Redis-hit figures need one.
            store_all = CacheConfig(policy=StorePolicy(min_speedup=0))
            writer = GrammarCache(compiler, model=model, store=stores[0], config=store_all)
            t0 = time.perf_counter()
            compiled = (await writer.compile(case.constraint)).grammar
            cold.append((time.perf_counter() - t0) * 1000)
            for _ in range(50):
                t0 = time.perf_counter()
                await writer.compile(case.constraint)
                l1.append((time.perf_counter() - t0) * 1000)
            await writer.drain()
            reader = GrammarCache(compiler, model=model, store=stores[1], config=store_all)
            t0 = time.perf_counter()
            got = await reader.compile(case.constraint)
            hit.append((time.perf_counter() - t0) * 1000)
            if got.stats.hit != "redis":
                raise RuntimeError(f"expected a Redis hit, got {got.stats}")
            sizes.append(len(encode_blob(compiled)))
            for store in stores:
                await store.aclose()
        rows.append({"case": case.name, "cold_ms_p50": round(statistics.median(cold), 2),
                     "l1_hit_ms_p50": round(_pct(l1, 0.5), 4),
                     "redis_hit_ms_p50": round(statistics.median(hit), 2),
                     "redis_over_cold": round(statistics.median(hit) / statistics.median(cold), 3),
                     "blob_bytes": max(sizes)})
    return rows


def _bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    from services.grammar.compiler import ModelCompiler

    domain = get_domain(model)
    compiler = ModelCompiler(domain)
    t0 = _cpu()
    compiler.tokenizer_info  # noqa: B018 - xgrammar's vocabulary index, once per process
    index = {"xgrammar": round((_cpu() - t0) * 1000, 1)}
    from services.grammar.compiler import BUILDABLE

    if "llguidance" in BUILDABLE:
        from services.grammar.engines.engine_llguidance import lltokenizer

        t0 = _cpu()
        lltokenizer(domain)
        index["llguidance"] = round((_cpu() - t0) * 1000, 1)
    rows = []
    for case in all_cases():
        if args.cases and case.name not in args.cases:
            continue
        for engine in engines_for(case):
            rows.append(bench_case(compiler, model, case, engine, args))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result: dict[str, Any] = {"model": model, "vocab_size": domain.size,
                              "vocabulary_index_ms": index, "cases": rows}
    if args.redis_url:
        result["cache"] = asyncio.run(_cache_rows(model, args.redis_url, args.repeats))
    return result


def run(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "bench": "grammar", "label": args.label,
        "machine": host("xgrammar", "llguidance"),
        "timing": "CPU time of the process (time.process_time), single-threaded engines",
        "goals": GOALS, "command": "infernix bench grammar " + " ".join(sys.argv[3:]),
        "models": [_bench_model(model, args) for model in args.models],
    }
    write_report(report, args.out)
    return 0
