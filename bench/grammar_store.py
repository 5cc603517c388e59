"""`infernix bench grammar-store` (also `python -m bench.grammar_store`): what a stored
grammar costs against compiling it again, per grammar and vocabulary, as JSON.

For each model and each grammar of a set spanning small to slow (typical response schemas,
choices, a GBNF list grammar, objects of N optional properties): the cold compile (in process),
the footprint, serialisation and compression, blob size, decompression and deserialisation (the
load a Redis or gRPC hit pays), the Redis round trip of the record when a Redis URL is given, the
store policy's verdict and the measured load / compile ratio. `policy` checks the verdicts against
the measurement: a stored grammar must load `min_speedup` times faster than it compiles
(`stored_too_slow_to_load` counts those that do not, `not_stored_fast_to_load` the grammars the
policy left out that would have qualified); `fit` is the least-squares line
load_ms = a + b * serialised_MB that the policy's `load_ms_per_mb` / `load_ms_fixed` defaults come
from, and `load_ms_per_serialized_mb` its range. `isolation` measures what running a
typical compile in a child process costs (verdict only, and with the grammar sent back);
`grpc_blob` what shipping a stored blob in the Compile reply costs over loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from bench.report import host, write_report
from services.grammar.cache.limits import CompileLimits, StorePolicy
from shared.contract import OutputConstraint
from shared.frontends import get_domain


def _optional_properties(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {
        f"property_{i:04d}": {"type": "string", "description": "an optional text field"}
        for i in range(n)}}


def grammars(quick: bool) -> list[tuple[str, OutputConstraint]]:
    """The benchmarked constraints, small to slow."""
    from bench.grammar import SCHEMAS

    out = [(f"typical_schema_{i}", OutputConstraint.json_schema(s)) for i, (s, _) in
           enumerate(SCHEMAS)]
    out += [("choice_3", OutputConstraint.choice(["yes", "no", "maybe"])),
            ("choice_2000", OutputConstraint.choice([f"option number {i}" for i in range(2000)])),
            ("gbnf_list", OutputConstraint.grammar(
                'root ::= item ("\\n" item){0,9}\nitem ::= "- " [^\\r\\n]{1,80}\n')),
            ("regex_date", OutputConstraint.regex(r"\d{4}-\d{2}-\d{2}"))]
    for n in (5, 25) if quick else (5, 25, 60):
        out.append(
            (f"optional_properties_{n}", OutputConstraint.json_schema(_optional_properties(n)))
        )
    return out


def _timed(fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    return value, (time.perf_counter() - start) * 1000.0


def _fit(points: list[tuple[float, float]]) -> dict[str, float]:
    """Least squares load_ms = a + b * mb over (mb, load_ms) points."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return {"load_ms_fixed": round(my - b * mx, 3), "load_ms_per_mb": round(b, 3)}


async def _redis_round_trip(url: str, vocab: str, key: str, data: bytes) -> float:
    from services.grammar.cache.store import RedisStore, StoreConfig

    store = RedisStore(StoreConfig(url, prefix=f"infernix:bench:{time.time_ns()}"))
    try:
        await store.put(vocab, key, data)
        start = time.perf_counter()
        got = await store.get(vocab, key)
        ms = (time.perf_counter() - start) * 1000.0
        assert got == data
        await store.discard(vocab, key)
        return ms
    finally:
        await store.aclose()


def bench_model(model: str, redis_url: str | None, quick: bool, policy: StorePolicy) -> dict:
    from services.grammar.cache import records
    from services.grammar.compiler import ModelCompiler, cache_key

    domain = get_domain(model)
    compiler = ModelCompiler(domain)
    compiler.tokenizer_info  # noqa: B018 - built once, outside the timings
    compiler.compile(OutputConstraint.choice(["warm", "up"]))
    rows, points = [], []
    for name, constraint in grammars(quick):
        outcome = compiler.compile(constraint)
        grammar, size = outcome.grammar, records.footprint(outcome.grammar)
        text, serialize_ms = _timed(grammar.serialize_json)
        import zlib

        blob, compress_ms = _timed(zlib.compress, text.encode(), 1)
        raw, decompress_ms = _timed(zlib.decompress, blob)
        _, deserialize_ms = _timed(compiler.deserialize, raw.decode())
        load_ms = decompress_ms + deserialize_ms
        points.append((len(text) / 1e6, load_ms))
        stored = (policy.worth_serializing(outcome.compile_ms, size)
                  and policy.should_store(outcome.compile_ms, len(text)))
        row = {"grammar": name, "compile_ms": round(outcome.compile_ms, 2),
               "footprint_bytes": size, "json_bytes": len(text), "blob_bytes": len(blob),
               "serialize_ms": round(serialize_ms, 2), "compress_ms": round(compress_ms, 2),
               "decompress_ms": round(decompress_ms, 2),
               "deserialize_ms": round(deserialize_ms, 2), "load_ms": round(load_ms, 2),
               "load_over_compile": round(load_ms / max(outcome.compile_ms, 1e-6), 3),
               "predicted_load_ms": round(policy.predicted_load_ms(len(text)), 2),
               "stored_by_policy": stored}
        if redis_url:
            data = records.Record(records.BuildInfo(outcome.compile_ms, size, True), blob).encode()
            get_ms = asyncio.run(_redis_round_trip(redis_url, domain.vocab_id,
                                                   cache_key(constraint, domain), data))
            row["redis_get_ms"] = round(get_ms, 2)
            row["redis_hit_ms"] = round(get_ms + load_ms, 2)
            row["redis_hit_over_compile"] = round((get_ms + load_ms) / outcome.compile_ms, 3)
        rows.append(row)
    stored = [r for r in rows if r["stored_by_policy"]]
    per_mb = [r["load_ms"] / (r["json_bytes"] / 1e6) for r in rows if r["json_bytes"] > 100_000]
    return {
        "model": model, "vocab_size": domain.size, "grammars": rows,
        "fit": _fit(points),
        "load_ms_per_serialized_mb": {"min": round(min(per_mb), 1), "max": round(max(per_mb), 1),
                                      "median": round(statistics.median(per_mb), 1)},
        "policy": {"load_ms_per_mb": policy.load_ms_per_mb, "load_ms_fixed": policy.load_ms_fixed,
                   "min_speedup": policy.min_speedup, "stored": len(stored),
                   "not_stored": len(rows) - len(stored),
                   "stored_too_slow_to_load": sum(
                       r["load_ms"] * policy.min_speedup > r["compile_ms"] for r in stored),
                   "worst_stored_load_over_compile": max(
                       (r["load_over_compile"] for r in stored), default=None),
                   "not_stored_fast_to_load": sum(
                       r["load_ms"] * policy.min_speedup <= r["compile_ms"]
                       for r in rows if not r["stored_by_policy"])},
        "isolation": asyncio.run(_isolation(domain)),
        "grpc_blob": asyncio.run(_grpc_blob(domain)),
    }


async def _isolation(domain) -> dict[str, float]:
    """A typical schema compiled in process, and in a compile child (verdict only; grammar sent
    back and deserialised), p50 of 5 each after a warm-up."""
    from bench.grammar import SCHEMAS
    from services.grammar.cache import records
    from services.grammar.cache.isolation import CompilePool
    from services.grammar.compiler import ModelCompiler

    constraint = OutputConstraint.json_schema(SCHEMAS[0][0])
    compiler = ModelCompiler(domain)
    pool = CompilePool(domain, size=1)
    await pool.start()
    try:
        await pool.compile(constraint, want="never")
        in_process, verdict, with_grammar = [], [], []
        for _ in range(5):
            in_process.append(_timed(compiler.compile, constraint)[1])
            start = time.perf_counter()
            await pool.compile(constraint, want="never")
            verdict.append((time.perf_counter() - start) * 1000.0)
            start = time.perf_counter()
            built = await pool.compile(constraint, want="always")
            records.deserialize(built.blob, compiler)
            with_grammar.append((time.perf_counter() - start) * 1000.0)
    finally:
        await pool.aclose()
    return {"in_process_ms": round(statistics.median(in_process), 2),
            "child_verdict_ms": round(statistics.median(verdict), 2),
            "child_with_grammar_ms": round(statistics.median(with_grammar), 2)}


async def _grpc_blob(domain) -> dict[str, Any]:
    """A stored grammar (the GBNF list grammar; policy: store all) that a worker client gets from
    a grammar service on loopback, answered from the service's L1: the whole compile call (gRPC
    with the blob, decompress, deserialise) and the decode part of it, p50 over 3 fresh workers."""
    import socket

    from services.grammar.cache.grammar_cache import (
        CacheConfig,
        GrammarCache,
        ModelCaches,
        RecordCache,
    )
    from services.grammar.client import GrpcGrammarClient
    from services.grammar.compiler import ModelCompiler
    from services.grammar.service import create_server

    constraint = dict(grammars(True))["gbnf_list"]
    store_all = CacheConfig(policy=StorePolicy(min_speedup=0),
                            limits=CompileLimits(deadline_s=3600.0))
    service = ModelCaches({"m": RecordCache(ModelCompiler(domain), model="m", config=store_all)})
    server = create_server(service)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await server.start("127.0.0.1", port)
    totals, loads, blob_bytes = [], [], 0
    try:
        first = await service["m"].compile(constraint)
        blob_bytes = len(first.record.blob or b"")
        for _ in range(3):
            worker = GrpcGrammarClient("127.0.0.1", port, ModelCaches(
                {"m": GrammarCache(ModelCompiler(domain), model="m", config=store_all)}))
            worker.caches["m"].compiler.tokenizer_info  # noqa: B018 - outside the timing
            try:
                result = await worker.compile(constraint, model="m")
                assert result.stats.hit == "service", result.stats
                totals.append(result.stats.total_ms)
                loads.append(result.stats.load_ms)
            finally:
                await worker.close()
    finally:
        server.close()
        await server.wait_closed()
        await service.aclose()
    return {"grammar": "gbnf_list", "blob_bytes": blob_bytes,
            "compile_call_ms": round(statistics.median(totals), 2),
            "decode_ms": round(statistics.median(loads), 2),
            "transfer_ms": round(statistics.median(totals) - statistics.median(loads), 2)}


def run(args: argparse.Namespace) -> int:
    policy = StorePolicy()
    report = {
        "bench": "grammar-store",
        "machine": host("xgrammar"),
        "command": "infernix bench grammar-store " + " ".join(sys.argv[3:]),
        "models": [bench_model(m, args.redis_url or None, args.quick, policy) for m in args.models],
    }
    write_report(report, args.out)
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2", "qwen3.5"])
    p.add_argument("--redis-url", default="", help="also time the Redis round trip of each record")
    p.add_argument("--quick", action="store_true", help="fewer slow grammars")
    p.add_argument("--out", help="also write the JSON here")
    p.set_defaults(func=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.grammar_store")
    _arguments(parser)
    parsed = parser.parse_args()
    sys.exit(parsed.func(parsed))
