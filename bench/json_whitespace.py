"""How often the built-in model writes valid JSON within the token budget, per whitespace profile.

    python -m bench.json_whitespace --seeds 10 --out bench-out/json-ws.json

The README's examples (a city and its population; a person), each with every profile of the
`structured_outputs` whitespace option, through the same in-process worker `infernix generate`
uses (`infernix generate --json-schema-file F --prompt P --json-whitespace W --seed S`), one model
load for all runs. A run counts as valid when it ended normally (finish_reason "stop") and the
content parses and validates against its schema (jsonschema); its whitespace share is the part of
the content that is whitespace outside strings. Sampling: the command's defaults (temperature 1,
256 tokens), one seed per run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import statistics
import sys
import time

import jsonschema

EXAMPLES = [
    ("A city and its population, as JSON.",
     {"type": "object", "properties": {"city": {"type": "string"},
                                       "population": {"type": "integer", "minimum": 0}},
      "required": ["city", "population"], "additionalProperties": False}),
    ("Invent a person.",
     {"type": "object", "properties": {"name": {"type": "string"},
                                       "age": {"type": "integer", "minimum": 0},
                                       "email": {"type": "string"},
                                       "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age"], "additionalProperties": False}),
]
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


def whitespace_share(text: str) -> float:
    outside = _STRINGS.sub("", text)
    return sum(c.isspace() for c in outside) / len(text) if text else 0.0


async def run(args: argparse.Namespace) -> dict:
    from services.worker.cli import generate_once
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import DEFAULT_MODEL, load_runtime
    from shared.contract import OutputConstraint
    from shared.generation import (
        ChatMessage,
        FinishReason,
        GenerateRequest,
        PromptInput,
        RequestOptions,
        SamplingParams,
    )

    runtime = load_runtime(None, device="cpu")
    client = open_in_process(runtime, EngineConfig(max_batch=1, max_len=1024))
    rows = []
    try:
        for profile in args.profiles:
            for e, (prompt, schema) in enumerate(EXAMPLES):
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    constraint = OutputConstraint.json_schema(schema, whitespace=profile)
                    options = RequestOptions(max_tokens=args.max_tokens, constraint=constraint,
                                             sampling=SamplingParams(temperature=1.0, seed=seed))
                    request = GenerateRequest(f"ws-{profile}-{e}-{seed}",
                                              PromptInput(messages=(ChatMessage("user", prompt),)),
                                              options, model=DEFAULT_MODEL)
                    t0 = time.perf_counter()
                    fin = await generate_once(client, request, stream=False, as_json=False,
                                              out=io.StringIO())
                    valid = False
                    if fin.finish_reason is FinishReason.STOP:
                        try:
                            valid = jsonschema.Draft202012Validator(schema).is_valid(
                                json.loads(fin.content))
                        except ValueError:
                            valid = False
                    rows.append({"profile": profile, "example": e, "seed": seed, "valid": valid,
                                 "finish_reason": fin.finish_reason.value,
                                 "tokens": fin.usage.completion_tokens,
                                 "whitespace_share": round(whitespace_share(fin.content), 3),
                                 "seconds": round(time.perf_counter() - t0, 2),
                                 "content": fin.content[:200]})
                    print(json.dumps(rows[-1], ensure_ascii=False), file=sys.stderr, flush=True)
    finally:
        await client.aclose()
    summary = {}
    for profile in args.profiles:
        mine = [r for r in rows if r["profile"] == profile]
        summary[profile] = {
            "valid_rate": round(sum(r["valid"] for r in mine) / len(mine), 3),
            "runs": len(mine),
            "tokens_p50": statistics.median(r["tokens"] for r in mine),
            "whitespace_share_p50": statistics.median(r["whitespace_share"] for r in mine),
            "per_example_valid": [sum(r["valid"] for r in mine if r["example"] == e)
                                  for e in range(len(EXAMPLES))]}
    return {"model": DEFAULT_MODEL, "max_tokens": args.max_tokens, "seeds": args.seeds,
            "summary": summary, "runs": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="runs per profile and example")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--profiles", nargs="+", default=["any", "compact", "indented"])
    p.add_argument("--out")
    args = p.parse_args()
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
