"""A load run against a running Infernix gateway that accounts for every request:
`python loadtest/run.py --url http://127.0.0.1:8000 --requests 100 --concurrency 8`.

It sends the mix of `scenarios.py` (plain, JSON Schema, regex, choice and tool constraints;
streaming and not; chat, Responses, Anthropic messages and completions) from `--concurrency`
concurrent clients and sorts each request's end into one of four outcomes:

- `ok`: a 200 response, or a stream that ended with its protocol's terminal event and no error;
- `typed`: a typed failure: a 4xx/503 error body, or a stream's terminal error event, whose code
  names the failure (`overloaded`, `service_unavailable`, `grammar_service_unavailable`, ...);
- `untyped`: a failure the client cannot act on: a 500 or an error whose code is `internal_error`
  (Anthropic: `api_error`), or a body that is not the protocol's error shape;
- `lost`: no end at all: the connection dropped, a stream stopped without its terminal event, or
  no answer within `--timeout-s` (a hung request).

The summary (JSON, also written to `--out`) counts outcomes per scenario and lists the codes of
typed failures; the exit status is 1 when any request was untyped or lost. The fault test
(tests/e2e/test_loadtest_faults.py) runs this same mix while it kills and restarts services.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenarios import Scenario, scenarios  # noqa: E402

# Codes (OpenAI shape) and types (Anthropic shape) that say only "internal failure".
UNTYPED_CODES = frozenset({"internal_error", "server_error", "api_error", None, ""})
OUTCOMES = ("ok", "typed", "untyped", "lost")


@dataclass(frozen=True)
class Outcome:
    scenario: str
    outcome: str  # one of OUTCOMES
    status: int | None = None
    code: str | None = None  # the error's code (Anthropic: its error type)
    detail: str = ""
    seconds: float = 0.0


def _error_code(body: Any) -> tuple[bool, str | None, str]:
    """(is an error body, its code, its message) for an OpenAI or Anthropic error body."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False, None, ""
    error = body["error"]
    if body.get("type") == "error":  # Anthropic
        return True, error.get("type"), str(error.get("message", ""))
    return True, error.get("code"), str(error.get("message", ""))


def _failure(name: str, status: int | None, code: str | None, message: str,
             seconds: float) -> Outcome:
    kind = "untyped" if code in UNTYPED_CODES or status == 500 else "typed"
    return Outcome(name, kind, status, code, message[:300], seconds)


def _sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) of every complete SSE event in `text`."""
    events = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            events.append((name, "\n".join(data)))
    return events


def _stream_outcome(scenario: Scenario, text: str, seconds: float) -> Outcome:
    """The outcome of a complete stream body by its protocol's terminal event."""
    name = scenario.name
    for event, data in _sse_events(text):
        if data == "[DONE]":
            return Outcome(name, "ok", 200, seconds=seconds)
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            return Outcome(name, "untyped", 200, detail=f"not JSON: {data[:200]}", seconds=seconds)
        is_error, code, message = _error_code(payload)
        if is_error:
            return _failure(name, 200, code, message, seconds)
        if event == "message_stop" or event in ("response.completed", "response.incomplete"):
            return Outcome(name, "ok", 200, seconds=seconds)
        if event == "response.failed":
            error = (payload.get("response") or {}).get("error") or {}
            return _failure(name, 200, error.get("code"), str(error.get("message", "")), seconds)
    return Outcome(name, "lost", 200, detail="the stream ended without its terminal event",
                   seconds=seconds)


async def one_request(session: Any, url: str, scenario: Scenario, timeout_s: float,
                      headers: dict[str, str] | None = None) -> Outcome:
    """Send one scenario; its Outcome (never raises for what the server or network does)."""
    import aiohttp

    started = time.perf_counter()

    def took() -> float:
        return round(time.perf_counter() - started, 3)

    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url + scenario.path, json=scenario.body,
                                    headers=headers) as reply:
                raw = await reply.read()
                text = raw.decode("utf-8", errors="replace")
                if reply.status == 200 and scenario.stream:
                    return _stream_outcome(scenario, text, took())
                try:
                    body = json.loads(text)
                except json.JSONDecodeError:
                    return Outcome(scenario.name, "untyped", reply.status,
                                   detail=f"not JSON: {text[:200]}", seconds=took())
                is_error, code, message = _error_code(body)
                if reply.status == 200 and not is_error:
                    return Outcome(scenario.name, "ok", 200, seconds=took())
                if not is_error:
                    return Outcome(scenario.name, "untyped", reply.status,
                                   detail=f"HTTP {reply.status} without an error body",
                                   seconds=took())
                return _failure(scenario.name, reply.status, code, message, took())
    except TimeoutError:
        return Outcome(scenario.name, "lost", detail=f"no end within {timeout_s} s (hung)",
                       seconds=took())
    except (aiohttp.ClientError, OSError) as exc:
        return Outcome(scenario.name, "lost", detail=f"{type(exc).__name__}: {exc}",
                       seconds=took())


async def run_mix(url: str, *, requests: int | None = None, stop: asyncio.Event | None = None,
                  concurrency: int = 8, seed: int = 0, max_tokens: int = 16,
                  timeout_s: float = 60.0, api_key: str = "") -> list[Outcome]:
    """Send scenarios drawn by weight (seeded) from `concurrency` clients until `requests` were
    sent or `stop` is set (at least one of them); every request's Outcome, in completion order."""
    import aiohttp

    if requests is None and stop is None:
        raise ValueError("give requests, stop, or both")
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}", "x-api-key": api_key} if api_key else None
    outcomes: list[Outcome] = []
    sent = 0

    def draw() -> Scenario | None:
        nonlocal sent
        if (requests is not None and sent >= requests) or (stop is not None and stop.is_set()):
            return None
        sent += 1
        mix = scenarios(rng, max_tokens=max_tokens)
        return rng.choices(mix, weights=[s.weight for s in mix])[0]

    async def client(session: aiohttp.ClientSession) -> None:
        while (scenario := draw()) is not None:
            outcomes.append(await one_request(session, url, scenario, timeout_s, headers))

    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return outcomes


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts per outcome and per scenario, the typed failures' codes, and every request that was
    untyped or lost."""
    by_scenario: dict[str, Counter] = {}
    for o in outcomes:
        by_scenario.setdefault(o.scenario, Counter())[o.outcome] += 1
    seconds = sorted(o.seconds for o in outcomes)
    return {
        "requests": len(outcomes),
        **{kind: sum(o.outcome == kind for o in outcomes) for kind in OUTCOMES},
        "typed_codes": dict(Counter(f"{o.status} {o.code}" for o in outcomes
                                    if o.outcome == "typed")),
        "by_scenario": {name: dict(c) for name, c in sorted(by_scenario.items())},
        "seconds_p50": seconds[len(seconds) // 2] if seconds else None,
        "seconds_max": seconds[-1] if seconds else None,
        "bad": [asdict(o) for o in outcomes if o.outcome in ("untyped", "lost")],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's base URL")
    parser.add_argument("--requests", type=int, default=100, help="requests to send (default 100)")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens (default 32)")
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="a request without an end by then is lost (default 120)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mix (default 0)")
    parser.add_argument("--out", help="also write the summary JSON here")
    args = parser.parse_args(argv)
    outcomes = asyncio.run(run_mix(args.url, requests=args.requests, concurrency=args.concurrency,
                                   seed=args.seed, max_tokens=args.max_tokens,
                                   timeout_s=args.timeout_s,
                                   api_key=os.environ.get("INFERNIX_API_KEY", "")))
    summary = summarize(outcomes)
    text = json.dumps(summary, indent=2)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")
    print(text)
    return 1 if summary["untyped"] or summary["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
