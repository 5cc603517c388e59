"""`infernix bench prefix`: what the automatic prefix cache saves on a long shared prefix, as JSON.

For each of `repeats` distinct documents of about `prefix_tokens` tokens (they differ from their
first token on, so none shares a block with another), one greedy request asks a question after
the document on an engine with an empty cache for it (cold: the whole prompt is prefilled), then
`hits` requests ask other questions after the same document (a hit: the document's full KV blocks
come from the cache; the question and at least the last prompt token are prefilled). It reports
TTFT (submission to first token, the engine's own timing) of cold and hit requests, their ratio
(the target: a hit under 10% of cold), the cached tokens each hit reported in its usage, and
decode TPOT of both (paged KV must leave TPOT unchanged within noise; `infernix bench decode`
compares it across builds). A last round repeats one cold and one hit prompt with the cache off,
so cold and off are also seen side by side. The built-in SmolLM2 runs on the CPU by default.

On CUDA every Triton kernel that compiles (or loads from disk) after the warm-up request, and
every autotuner run for a new key (fla-core's kernels benchmark their configs per key), is listed
in `compiles_after_warmup` with the request it delayed: the warm-up should leave none.
`lane_end_rows` counts the prefill rows split into forwards of warmed widths at their lane's
end (program/buckets.py `plan_widths`; the bench sizes the lane just above its prompts, so the
last chunks and the second document's hits meet it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Any

from bench.compiles import compile_log
from bench.engine_rounds import collect
from bench.models import build_runtime
from bench.report import report_header, write_report
from bench.stats import ms, p50, ratio
from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.runtime import ModelRuntime
from shared.generation import (
    ChatMessage,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
)

_TOPICS = ("lighthouses", "glaciers", "printing presses", "river deltas", "clockmakers",
           "salt marshes", "observatories", "canal locks")
_SENTENCE = (
    "Section {k} notes that {topic} changed slowly over the years, shaped by weather, trade "
    "and the patient work of people who kept records of what they saw. "
)
_QUESTIONS = ("What is the main subject?", "Summarise section 3.", "Who kept the records?",
              "Name one force that shaped it.", "How fast did things change?")


def documents(runtime: ModelRuntime, count: int, tokens: int) -> list[str]:
    """`count` documents of about `tokens` tokens that differ from their first token on."""
    out = []
    for i in range(count):
        topic = _TOPICS[i % len(_TOPICS)]
        text, k = f"{i + 1}. A document about {topic}. ", 0
        while len(runtime.tokenizer.encode(text)) < tokens:
            text += _SENTENCE.format(k=k, topic=topic)
            k += 1
        out.append(text)
    return out


def _request(runtime: ModelRuntime, tag: str, text: str, max_tokens: int,
             question: str | None = None, chat: bool = False) -> GenerateRequest:
    # `chat`: the document is the system message and the question the user's (the agent's case:
    # one system prompt, many questions); else one raw text, the question after "Q: "
    if question is None:
        prompt = PromptInput(text=text)
    elif chat:
        prompt = PromptInput(messages=(ChatMessage("system", text), ChatMessage("user", question)))
    else:
        prompt = PromptInput(text=text + "Q: " + question)
    return GenerateRequest(tag, prompt, RequestOptions(
        max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0)), model=runtime.name)


def _shared(runtime: ModelRuntime, a: GenerateRequest, b: GenerateRequest) -> int:
    # the tokens two prompts share from their start (what a hit could find at most)
    x, y = (runtime.prepare(r.prompt).token_ids for r in (a, b))
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def _row(fin) -> dict[str, Any]:
    n = fin.usage.completion_tokens
    return {"ttft_ms": ms(fin.timings["ttft"]), "prompt_tokens": fin.usage.prompt_tokens,
            "cached_tokens": fin.usage.cached_tokens, "output_tokens": n,
            "tpot_ms": ms(fin.timings["decode"] / (n - 1)) if n >= 2 else None, "text": fin.content}




async def _rounds(runtime: ModelRuntime, args, log) -> dict[str, Any]:
    docs = documents(runtime, args.repeats + 1, args.prefix_tokens)
    chat = getattr(args, "chat", False)
    longest = max(len(runtime.prepare(_request(runtime, "n", d, 1, q, chat).prompt).token_ids)
                  for d in docs for q in _QUESTIONS)
    # On CUDA the Engine's start-up warm-up runs first, as `serve` runs it: a cold request then
    # pays its prefill, not the first compile of each kernel shape (the warm-up request waits).
    config = dict(
        max_batch=1, max_len=longest + args.max_tokens + 1, prefill_chunk=args.prefill_chunk,
        warmup=runtime.device.type == "cuda",
    )
    cold, hits = [], []
    client = open_in_process(runtime, EngineConfig(**config, prefix_cache=True))
    compiles = contextlib.ExitStack()
    seen, tag = compiles.enter_context(compile_log(runtime.device.type == "cuda"))
    try:
        await collect(client, _request(runtime, "warmup", "Warm up.", 4))
        seen.clear()  # the warm-up's own compiles
        for r, doc in enumerate(docs[:-1]):
            first = _request(runtime, f"cold-{r}", doc, args.max_tokens, _QUESTIONS[0], chat)
            tag(first.request_id)
            fin = await collect(client, first)
            cold.append(_row(fin))
            log(
                f"document {r}: cold TTFT {cold[-1]['ttft_ms']:.0f} ms "
                f"({fin.usage.prompt_tokens} prompt tokens)"
            )
            for h in range(args.hits):
                q = _QUESTIONS[1 + h % (len(_QUESTIONS) - 1)]
                again = _request(runtime, f"hit-{r}-{h}", doc, args.max_tokens, q, chat)
                tag(again.request_id)
                fin = await collect(client, again)
                hits.append(_row(fin))
                shared = _shared(runtime, first, again)
                hits[-1].update(shared_tokens=shared,
                                cached_over_shared=ratio(fin.usage.cached_tokens, shared))
                log(
                    f"document {r}: hit TTFT {hits[-1]['ttft_ms']:.0f} ms "
                    f"({fin.usage.cached_tokens} cached)"
                )
        stats = client.engine.program.blocks.stats
        cache = {"hit_rate": round(stats.hit_rate, 4), "hit_tokens": stats.hit_tokens,
                 "lookup_tokens": stats.lookup_tokens, "evictions": stats.evictions,
                 "block_size": client.engine.program.blocks.block_size}
        warmup = client.engine.warmup
        graphs = client.engine.program.forward.prefill_graphs
        lane_end_rows = client.engine.program.forward.lane_end_rows
        prefill_graphs = None if graphs is None else {
            "captured": [list(s) for s in graphs.captured], "replays": graphs.replays,
            "split_at_snapshot_cuts": graphs.split_steps}
    finally:
        compiles.close()
        await client.aclose()
    off = []
    client = open_in_process(runtime, EngineConfig(**config, prefix_cache=False))
    try:
        await collect(client, _request(runtime, "warmup", "Warm up.", 4))
        for tag, q in (("off-0", _QUESTIONS[0]), ("off-1", _QUESTIONS[1])):
            off.append(_row(await collect(client, _request(runtime, tag, docs[-1], args.max_tokens,
                                                            q, chat))))
            log(f"cache off: TTFT {off[-1]['ttft_ms']:.0f} ms")
    finally:
        await client.aclose()
    cold_ttft = p50([c["ttft_ms"] for c in cold])
    hit_ttft = p50([h["ttft_ms"] for h in hits])
    tpot = {"cold_p50_ms": p50([c["tpot_ms"] for c in cold if c["tpot_ms"] is not None]),
            "hit_p50_ms": p50([h["tpot_ms"] for h in hits if h["tpot_ms"] is not None]),
            "cache_off_p50_ms": p50([o["tpot_ms"] for o in off if o["tpot_ms"] is not None])}
    return {"engine": config, "warmup": warmup.to_dict() if warmup is not None else None,
            "compiles_after_warmup": seen, "prefill_graphs": prefill_graphs,
            "lane_end_rows": lane_end_rows, "cold": cold,
            "hits": hits, "cache_off": off, "prefix_cache": cache,
            "ttft_cold_p50_ms": cold_ttft, "ttft_hit_p50_ms": hit_ttft,
            "ttft_cache_off_p50_ms": p50([o["ttft_ms"] for o in off]),
            "hit_over_cold": ratio(hit_ttft, cold_ttft), "tpot": tpot,
            "cached_over_shared_min": min(h["cached_over_shared"] or 0.0 for h in hits),
            "targets": {"hit_ttft_under_10pct_of_cold": (ratio(hit_ttft, cold_ttft) or 1.0) < 0.1,
                        "cached_ge_90pct_of_shared": all((h["cached_over_shared"] or 0.0) >= 0.9
                                                         for h in hits)}}


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.hits < 1 or args.prefix_tokens < 32 or args.max_tokens < 2:
        raise SystemExit("bench prefix: --repeats and --hits must be >= 1, --prefix-tokens >= 32, "
                         "--max-tokens >= 2")

    def log(line: str) -> None:
        print(f"[bench prefix] {line}", file=sys.stderr, flush=True)

    from shared.logging import configure_logging

    configure_logging(args.log_level)
    started = time.perf_counter()
    runtime = build_runtime(args.model, args.device)
    log(f"runtime {args.model} on {args.device} ready in {time.perf_counter() - started:.1f} s")
    report: dict[str, Any] = {
        **report_header("prefix", args, runtime),
        "options": {
            "prefix_tokens": args.prefix_tokens,
            "repeats": args.repeats,
            "hits": args.hits,
            "max_tokens": args.max_tokens,
            "prefill_chunk": args.prefill_chunk,
            "greedy": True,
            "chat": getattr(args, "chat", False),
        },
    }
    switch = getattr(args, "switch", None)
    if switch is None:
        report.update(asyncio.run(_rounds(runtime, args, log)))
    else:  # the same rounds with the operator switch off, then on, on the same runtime
        from services.settings import SETTINGS

        env = SETTINGS[switch].env
        report["switch"], report["runs"], before = env, {}, os.environ.get(env)
        try:
            for value in ("0", "1"):
                os.environ[env] = value
                log(f"{env}={value}")
                report["runs"][value] = asyncio.run(_rounds(runtime, args, log))
        finally:
            if before is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = before
    report["total_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.out)
    return 0
