"""`infernix bench coldstart`: what the start-up warm-up buys, measured from outside the server.

Per start (`--starts`, default 2: the second reuses the on-disk kernel cache of the first):
start `infernix serve` with the given model, device and extra flags; time start -> /healthz 200
(the warm-up's own counts and seconds are read from the health body); then, per prompt length of
`--lengths` (default 100 .. 4,000 tokens), one request of a length the server has not met yet
(the first) and `--repeats` more of the same length with other words (no shared prefix: the
prefix cache cannot help), each streaming `--max-tokens` tokens from /v1/completions, TTFT timed
by this client. The target: every first request within `--target` (2x) of its repeats' median.
The very first request after ready is the first length's first. Output: one JSON document.

    infernix bench coldstart --model DIR --device cuda --serve-arg=--lanes --serve-arg=32

Imports no torch itself: the server is another process (its own `python -m services.cli`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.report import write_report

# Short common words: about one token each in the byte-level BPE vocabularies served here.
WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child",
         "world", "school", "state", "family", "student", "group", "country", "problem", "hand",
         "part", "place", "case", "week", "company", "system", "program", "question", "work")


def prompt_text(tokens: int, seed: int) -> str:
    """About `tokens` tokens of words in an order of its own per seed (prompts of equal length
    but no shared prefix beyond the first word or so)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(max(1, tokens - 1)))


def summarize(lengths: dict[int, dict[str, Any]], target: float) -> dict[str, Any]:
    """Per length the first TTFT over the repeats' median, and whether all are within target."""
    ratios = {}
    for length, row in lengths.items():
        repeats = [t for t in row["repeat_ttft_s"] if t is not None]
        first = row["first_ttft_s"]
        ratios[length] = None if first is None or not repeats else \
            round(first / statistics.median(repeats), 2)
    known = [r for r in ratios.values() if r is not None]
    return {"first_over_repeat": ratios, "worst": max(known) if known else None,
            "target": target, "met": bool(known) and len(known) == len(ratios)
            and max(known) <= target}


async def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> dict[str, Any]:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {proc.returncode}")
            try:
                async with http.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        return await r.json()
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"the server was not ready within {timeout_s} s")


async def _measure(url: str, args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    import aiohttp

    from bench.serve import one

    out: dict[int, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as http:
        for i, length in enumerate(args.lengths):
            times, prompt_tokens, errors = [], [], []
            for r in range(1 + args.repeats):
                body = {"model": args.model, "prompt": prompt_text(length, 1000 * i + r),
                        "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True}}
                rec = await one(http, url, "raw", "/v1/completions", body, {}, args.timeout)
                times.append(rec.ttft)
                prompt_tokens.append(rec.prompt_tokens)
                if rec.error:
                    errors.append(rec.error)
            out[length] = {"prompt_tokens": prompt_tokens, "first_ttft_s": _round(times[0]),
                           "repeat_ttft_s": [_round(t) for t in times[1:]], "errors": errors}
    return out


def _round(t: float | None) -> float | None:
    return None if t is None else round(t, 4)


def _serve_command(args: argparse.Namespace, port: int) -> list[str]:
    return [sys.executable, "-m", "services.cli", "serve", "--model", args.model,
            "--device", args.device, "--port", str(port), *args.serve_arg]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one_start(args: argparse.Namespace, n: int) -> dict[str, Any]:
    port = args.port or _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    command = _serve_command(args, port)
    started = time.perf_counter()
    proc = await asyncio.to_thread(subprocess.Popen, command, env=env,
                                   stdout=subprocess.DEVNULL,
                                   stderr=None if args.server_logs else subprocess.DEVNULL)
    try:
        health = await _wait_ready(url, proc, args.ready_timeout)
        ready_s = time.perf_counter() - started
        lengths = await _measure(url, args)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    worker = health.get("worker") or {}
    return {"start": n, "command": command, "start_to_ready_s": round(ready_s, 2),
            "warmup": worker.get("warmup"), "lengths": lengths,
            "summary": summarize(lengths, args.target)}


def run(args: argparse.Namespace) -> int:
    if args.starts < 1 or args.repeats < 1 or not args.lengths:
        raise SystemExit("bench coldstart: --starts and --repeats >= 1, at least one length")
    starts = [asyncio.run(_one_start(args, n)) for n in range(args.starts)]
    doc = {"bench": "coldstart", "model": args.model, "device": args.device,
           "host": platform.node(), "max_tokens": args.max_tokens, "starts": starts}
    write_report(doc, args.out)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coldstart", help="start-to-ready time and TTFT of first requests at new "
                       "prompt lengths against repeats (the warm-up and the kernel cache)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="served model: smollm2 or a checkpoint "
                   "directory (default: smollm2)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="one more `infernix serve` argument (repeat it; e.g. "
                   "--serve-arg=--no-warmup to measure without the warm-up; default: none)")
    p.add_argument("--lengths", type=int, nargs="+", metavar="N",
                   default=[100, 260, 500, 1150, 2000, 2890, 4000],
                   help="prompt lengths in tokens (default: 100 260 500 1150 2000 2890 4000)")
    p.add_argument("--repeats", type=int, default=2,
                   help="requests per length after the first (default: 2)")
    p.add_argument("--starts", type=int, default=2,
                   help="server starts, each measured (default: 2: cold cache, then warm)")
    p.add_argument("--max-tokens", type=int, default=4, help="output tokens (default: 4)")
    p.add_argument("--target", type=float, default=2.0,
                   help="first / repeat TTFT ratio to meet (default: 2.0)")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--ready-timeout", type=float, default=1800.0,
                   help="seconds to wait for /healthz (default: 1800)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per request (default: 600)")
    p.add_argument("--server-logs", action="store_true", help="let the server log to stderr")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=run)
