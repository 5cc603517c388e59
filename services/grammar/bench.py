"""`infernix bench grammar`: compile-cache and mask-fill costs for both vocabularies, as JSON.

For each model: cold compile of a set of typical schemas (what the request waits for: storing the
blob in Redis happens afterwards, in the background), L1 hit and Redis hit latency (p50/p95,
through the real GrammarCache), the compressed serialised size, and the per-token cost of filling
the next-token mask while walking typical JSON outputs tokenised by the model's own tokenizer
(p50/p99 microseconds). Targets (issue 2): L1 hit < 0.1 ms; Redis hit < 1/4 of the cold compile;
mask fill p50 < 40 us per token on the Qwen3.5 vocabulary.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import platform
import statistics
import sys
import time
from typing import Any

import xgrammar as xgr

from shared.contract import OutputConstraint
from shared.frontends import get_domain

# Typical response schemas and outputs that satisfy them (what a JSON-mode user sends and gets).
SCHEMAS: list[tuple[dict[str, Any], list[Any]]] = [
    (
        {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
         "required": ["name", "age"], "additionalProperties": False},
        [{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
          "tags": ["mathematics", "poetry", "engines"]},
         {"name": "Alan Turing", "age": 41, "tags": []}],
    ),
    (
        {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "forecast": {"type": "array", "items": {"type": "object", "properties": {
                "day": {"type": "string", "enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                "high": {"type": "number"}, "low": {"type": "number"},
                "summary": {"type": "string"}},
                "required": ["day", "high", "low", "summary"], "additionalProperties": False}}},
         "required": ["city", "days", "forecast"], "additionalProperties": False},
        [{"city": "Shanghai", "days": 2, "forecast": [
            {"day": "mon", "high": 21.5, "low": 14.0, "summary": "Light rain in the afternoon."},
            {"day": "tue", "high": 24.25, "low": 15.5, "summary": "Sunny with a gentle breeze."}]}],
    ),
]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _tokenize(model: str, text: str) -> list[int]:
    if model == "smollm2":
        from shared.frontends.smollm2 import smollm2_tokenizer

        return smollm2_tokenizer().encode(text).ids
    from shared.frontends.qwen35 import qwen35_tokenizer

    return list(qwen35_tokenizer().encode(text))


def mask_fill_us(compiled: xgr.CompiledGrammar, domain_size: int, tokens: list[int]) -> list[float]:
    """Microseconds per `fill_next_token_bitmask` while accepting `tokens` one by one."""
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, domain_size)
    out = []
    for t in tokens:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        out.append((time.perf_counter() - start) * 1e6)
        if not matcher.accept_token(t):
            raise RuntimeError(f"bench output token {t} was refused by its own schema")
    return out


async def _bench_model(model: str, redis_url: str | None, repeats: int) -> dict[str, Any]:
    from services.grammar.cache import CacheConfig, GrammarCache, encode_blob
    from services.grammar.limits import StorePolicy
    from services.grammar.compiler import ModelCompiler
    from services.grammar.store import RedisStore, StoreConfig

    domain = get_domain(model)
    compiler = ModelCompiler(domain)
    start = time.perf_counter()
    compiler.tokenizer_info  # noqa: B018 - vocabulary index, built once per process
    index_ms = (time.perf_counter() - start) * 1000
    result: dict[str, Any] = {"model": model, "vocab_size": domain.size,
                              "vocabulary_index_ms": round(index_ms, 1), "schemas": []}
    fills: list[float] = []
    for i, (schema, outputs) in enumerate(SCHEMAS):
        constraint = OutputConstraint.json_schema(schema)
        cold, l1, redis_hit, sizes = [], [], [], []
        compiled = None
        for r in range(repeats):
            # A fresh cache pair and Redis namespace per repeat makes the first compile cold.
            prefix = f"infernix:bench:{time.time_ns()}:{r}"
            stores = [RedisStore(StoreConfig(redis_url, prefix=prefix)) if redis_url else None
                      for _ in range(2)]
            # Store everything: these figures are what a Redis hit costs, whatever the policy.
            store_all = CacheConfig(policy=StorePolicy(min_speedup=0))
            writer = GrammarCache(compiler, model=model, store=stores[0], config=store_all)
            t0 = time.perf_counter()
            compiled = (await writer.compile(constraint)).grammar
            cold.append((time.perf_counter() - t0) * 1000)
            for _ in range(50):
                t0 = time.perf_counter()
                await writer.compile(constraint)
                l1.append((time.perf_counter() - t0) * 1000)
            if redis_url:
                await writer.drain()  # the blob is written in the background after a build
                reader = GrammarCache(compiler, model=model, store=stores[1], config=store_all)
                t0 = time.perf_counter()
                got = await reader.compile(constraint)
                redis_hit.append((time.perf_counter() - t0) * 1000)
                if got.stats.hit != "redis":
                    raise RuntimeError(f"expected a Redis hit, got {got.stats}")
                sizes.append(len(encode_blob(compiled)))
            for store in stores:
                if store is not None:
                    await store.aclose()
        assert compiled is not None
        for output in outputs:
            tokens = _tokenize(model, json.dumps(output, ensure_ascii=False))
            fills.extend(mask_fill_us(compiled, domain.size, tokens))
        entry: dict[str, Any] = {
            "schema": i,
            "cold_compile_ms": {"p50": round(statistics.median(cold), 2), "max": round(max(cold), 2)},
            "l1_hit_ms": {"p50": round(_percentile(l1, 0.5), 4), "p95": round(_percentile(l1, 0.95), 4)},
            "memory_size_bytes": compiled.memory_size_bytes,
        }
        if redis_hit:
            entry["redis_hit_ms"] = {"p50": round(_percentile(redis_hit, 0.5), 2),
                                     "p95": round(_percentile(redis_hit, 0.95), 2)}
            entry["redis_hit_over_cold"] = round(statistics.median(redis_hit) / statistics.median(cold), 3)
            entry["serialized_compressed_bytes"] = max(sizes)
        result["schemas"].append(entry)
    result["mask_fill_us_per_token"] = {"p50": round(_percentile(fills, 0.5), 2),
                                        "p99": round(_percentile(fills, 0.99), 2),
                                        "tokens": len(fills)}
    return result


def run(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "bench": "grammar",
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                    "xgrammar": importlib.metadata.version("xgrammar")},
        "redis": bool(args.redis_url),
        "command": "infernix bench grammar " + " ".join(sys.argv[3:]),
        "models": [],
    }
    for model in args.models:
        report["models"].append(asyncio.run(_bench_model(model, args.redis_url, args.repeats)))
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0
