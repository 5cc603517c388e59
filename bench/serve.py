"""`infernix bench serve`: a client-side load benchmark against a running server, as users run
`vllm bench serve`: what a client of the OpenAI protocol sees, gateway and worker included.

For each concurrency level C of the sweep, `--requests` requests are sent with C in flight at a
time (a closed loop: a new one starts as soon as one ends), cycling through the mix:

- raw: `/v1/completions` on a text prompt;
- chat: `/v1/chat/completions`;
- json: chat with `response_format` `json_schema` (strict);
- tools: chat with one function tool and `tool_choice: "required"`.

Every request streams (`stream_options.include_usage`) and is timed by this process: TTFT = the
first chunk carrying output (text, reasoning or tool-call arguments) after the request was sent;
ITL = the gaps between such chunks; TPOT = (last - first) / (completion tokens - 1), the
completion tokens from the final usage chunk; e2e = the whole request (a request that streamed no
output chunk, e.g. a tool call cut by max_tokens before its name, counts in e2e and throughput
only: `without_output_chunk`). Per level, overall and per
kind: p50 / p99 (nearest rank) and mean in milliseconds, output tokens per second over the level's
wall time, requests per second, cached prompt tokens, errors. One untimed warm-up request per kind
runs first (grammar compiles, first kernel shapes), unless `--warmup 0`.

Imports no torch: it runs on any client machine (aiohttp only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.report import host, write_report

KINDS = ("raw", "chat", "json", "tools")
SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 40},
                         "population": {"type": "integer", "minimum": 0}},
          "required": ["city", "population"], "additionalProperties": False}
TOOL = {"type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city.",
                     "parameters": {"type": "object",
                                    "properties": {"city": {"type": "string", "maxLength": 40}},
                                    "required": ["city"], "additionalProperties": False}}}
TOPICS = ("rivers", "mountains", "the moon", "bread", "trains", "libraries", "bees", "glass")


@dataclass
class Record:
    """One request as the client saw it (seconds)."""

    kind: str
    ok: bool = False
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.completion_tokens < 2 or not self.itl:
            return None
        return sum(self.itl) / (self.completion_tokens - 1)


def request_body(kind: str, i: int, *, model: str, max_tokens: int,
                 prompt_words: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of request i of `kind` (prompts differ per request: no accidental cache hits
    beyond what real clients share)."""
    topic = TOPICS[i % len(TOPICS)]
    filler = " ".join(f"{topic}-{i}-{w}" for w in range(max(0, prompt_words - 12)))
    common = {"model": model, "max_tokens": max_tokens, "stream": True, "temperature": 0,
              "stream_options": {"include_usage": True}}
    if kind == "raw":
        return "/v1/completions", {**common, "prompt": f"Notes {i} on {topic}: {filler}\nSummary:"}
    question = f"Request {i}. Tell me about {topic}. {filler}".strip()
    body = {**common, "messages": [{"role": "user", "content": question}]}
    if kind == "json":
        body["messages"][0]["content"] = f"Request {i}: name a city and its population. {filler}"
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "city", "schema": SCHEMA, "strict": True}}
    elif kind == "tools":
        body["messages"][0]["content"] = f"Request {i}: what is the weather in Paris? {filler}"
        body["tools"] = [TOOL]
        body["tool_choice"] = "required"
    elif kind != "chat":
        raise ValueError(f"unknown kind {kind!r}")
    return "/v1/chat/completions", body


def _has_output(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return False


async def one(session, url: str, kind: str, path: str, body: dict[str, Any],
              headers: dict[str, str], timeout_s: float) -> Record:
    """Send one streaming request and time its chunks."""
    import aiohttp

    rec = Record(kind)
    start = time.perf_counter()
    last = None
    try:
        async with session.post(url + path, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return rec
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = json.dumps(chunk["error"])[:200]
                    return rec
                now = time.perf_counter()
                if _has_output(chunk):
                    if last is None:
                        rec.ttft = now - start
                    else:
                        rec.itl.append(now - last)
                    last = now
                usage = chunk.get("usage")
                if usage:
                    rec.completion_tokens = int(usage.get("completion_tokens") or 0)
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = int(details.get("cached_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        return rec
    rec.e2e = time.perf_counter() - start
    rec.ok = True  # (a tool call cut by max_tokens before its name may stream no output chunk)
    return rec


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank (q in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _ms(values: list[float]) -> dict[str, float | None]:
    def r(x):
        return None if x is None else round(x * 1000, 3)

    return {"p50": r(percentile(values, 0.5)), "p99": r(percentile(values, 0.99)),
            "mean": r(statistics.fmean(values) if values else None), "n": len(values)}


def summarize(records: list[Record], wall: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    errors = [r.error for r in records if not r.ok]
    return {"requests": len(records), "ok": len(ok), "errors": len(errors),
            "error_samples": sorted(set(errors))[:3], "wall_s": round(wall, 4),
            "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
            "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
            "prompt_tokens": sum(r.prompt_tokens for r in ok),
            "cached_tokens": sum(r.cached_tokens for r in ok),
            "without_output_chunk": sum(r.ttft is None for r in ok),
            "ttft_ms": _ms([r.ttft for r in ok if r.ttft is not None]),
            "tpot_ms": _ms([r.tpot for r in ok if r.tpot is not None]),
            "itl_ms": _ms([g for r in ok for g in r.itl]),
            "e2e_ms": _ms([r.e2e for r in ok])}


async def level(session, args, concurrency: int, offset: int) -> dict[str, Any]:
    """`args.requests` requests with `concurrency` in flight; request ids start at `offset`."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    queue = list(range(args.requests))
    records: list[Record] = []

    async def client() -> None:
        while queue:
            i = queue.pop(0)
            kind = args.mix[i % len(args.mix)]
            path, body = request_body(kind, offset + i, model=args.model,
                                      max_tokens=args.max_tokens, prompt_words=args.prompt_words)
            records.append(await one(session, args.url, kind, path, body, headers,
                                     args.timeout))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    out = {"concurrency": concurrency, **summarize(records, wall)}
    out["by_kind"] = {k: summarize([r for r in records if r.kind == k], wall)
                      for k in args.mix}
    return out


async def _model_name(session, url: str, headers: dict[str, str]) -> str:
    async with session.get(url + "/v1/models", headers=headers) as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        if args.model is None:
            args.model = await _model_name(session, args.url, headers)
        warm = []
        for w in range(args.warmup):
            for kind in args.mix:
                path, body = request_body(kind, 10_000_000 + w, model=args.model,
                                          max_tokens=args.max_tokens,
                                          prompt_words=args.prompt_words)
                warm.append(await one(session, args.url, kind, path, body, headers, args.timeout))
        levels, offset = [], 0
        for c in args.concurrency:
            levels.append(await level(session, args, c, offset))
            offset += args.requests
    return {"bench": "serve", "command": "infernix " + shlex.join(sys.argv[1:]),
            "machine": host(),
            "url": args.url, "model": args.model,
            "options": {"mix": list(args.mix), "requests": args.requests,
                        "max_tokens": args.max_tokens, "prompt_words": args.prompt_words,
                        "warmup": args.warmup, "concurrency": list(args.concurrency)},
            "warmup_errors": sorted({r.error for r in warm if not r.ok}),
            "levels": levels}


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.max_tokens < 1 or args.warmup < 0 or \
            any(c < 1 for c in args.concurrency):
        raise SystemExit("bench serve: --requests, --max-tokens and --concurrency must be >= 1, "
                         "--warmup >= 0")
    args.url = args.url.rstrip("/")
    report = asyncio.run(bench(args))
    write_report(report, args.out)
    return 0 if all(lv["ok"] for lv in report["levels"]) else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="a client-side load benchmark against a running server",
                       description="A concurrency sweep of streaming OpenAI requests (raw, chat, "
                       "JSON Schema, tools) against a running `infernix serve` or gateway: TTFT, "
                       "TPOT, ITL p50/p99 and throughput as the client sees them, as JSON.")
    p.add_argument("--url", default="http://127.0.0.1:8000",
                   help="the server (default: http://127.0.0.1:8000)")
    p.add_argument("--model", help="the model name (default: the first of /v1/models)")
    p.add_argument("--api-key", help="a bearer key, when the server asks for one")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], metavar="C",
                   help="requests in flight per level (default: 1 8 32)")
    p.add_argument("--requests", type=int, default=64, help="requests per level (default: 64)")
    p.add_argument("--mix", nargs="+", choices=KINDS, default=list(KINDS),
                   help="request kinds, cycled (default: raw chat json tools)")
    p.add_argument("--max-tokens", type=int, default=64, help="per request (default: 64)")
    p.add_argument("--prompt-words", type=int, default=16,
                   help="approximate prompt length in words (default: 16)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed rounds of one request per kind first (default: 1)")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per request (default: 600)"
    )
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=run)
