"""Mask-fill cost of the Qwen3.5 output framings on the real vocabulary, as JSON.

For each case: the cold compile time and the per-token cost of `fill_next_token_bitmask` (p50,
p99, max microseconds) while walking one canonical output (the model's tokenizer writes the text,
control tokens by id), split by region (reasoning, framing and content, call framing, argument
values); for the non-strict case also the ParameterNameConstraint's `apply` per mask. The plain
JSON schema grammar on the same JSON output is the baseline the thinking framing is compared with,
side by side in one run.

    python -m bench.qwen35_framings [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import xgrammar as xgr

from bench.report import host, write_report
from services.grammar.compiler import build_framed_grammar
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.param_names import NameIndex, ParameterNameConstraint
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition
from shared.frontends import get_frontend
from shared.frontends.qwen35 import qwen35_tokenizer

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "notes": {"type": "array", "items": {"type": "string"}}},
    "required": ["city", "days"], "additionalProperties": False}
ANSWER = {"city": "Shanghai", "days": 3, "notes": ["bring an umbrella", "warm evenings"]}
LOOKUP = ToolDefinition.create("lookup", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "detail": {"type": "string", "minLength": 1}, "units": {"enum": ["metric", "imperial"]}},
    "required": ["city", "days"], "additionalProperties": False}, strict=True)
NOTE = ToolDefinition.create("note", {"type": "object", "properties": {"text": {"type": "string"}}})
REASONING = ("The user asks for the weather in Shanghai for the next three days. I should call "
             "the lookup tool with the city and the number of days, in metric units.\n")
STRICT_CALL = ("\n<function=lookup>\n<parameter=city>\nShanghai, China\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n<parameter=detail>\nhourly, with wind and "
               "rain\n</parameter>\n<parameter=units>\nmetric\n</parameter>\n</function>\n")
LOOSE_CALL = ("\n<function=note>\n<parameter=text>\nRemember: the user prefers short answers "
              "and metric units.\n</parameter>\n<parameter=tags>\n[\"weather\", \"prefs\"]"
              "\n</parameter>\n</function>\n")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _stats(values: list[float]) -> dict:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 1), "p99": round(_pct(values, 0.99), 1),
            "max": round(max(values), 1), "tokens": len(values)}


def run_case(compiler, domain, name, constraint, framing, pieces, names=False) -> dict:
    """`pieces`: [(region, text | token id)] in output order."""
    start = time.perf_counter()
    compiled = compiler.compile_grammar(build_framed_grammar(constraint, framing, domain))
    compile_ms = (time.perf_counter() - start) * 1000
    enc = qwen35_tokenizer()._tokenizer.encode_ordinary
    tokens = [(region, t) for region, piece in pieces
              for t in ([piece] if isinstance(piece, int) else enc(piece))]
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, domain.size)
    companion = ParameterNameConstraint(NameIndex.of(domain), domain.special_id("<tool_call>"),
                                        domain.special_id("</tool_call>")) if names else None
    by_region: dict[str, list[float]] = {}
    apply_us: list[float] = []
    for region, t in tokens:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        by_region.setdefault(region, []).append((time.perf_counter() - t0) * 1e6)
        if companion is not None:
            t0 = time.perf_counter()
            companion.apply(mask[0])
            apply_us.append((time.perf_counter() - t0) * 1e6)
            companion.accept(t)
        if not matcher.accept_token(t):
            raise RuntimeError(f"{name}: token {t} ({region}) refused")
    if not (matcher.accept_token(min(domain.eos_ids)) and matcher.is_terminated()):
        raise RuntimeError(f"{name}: the output is not complete")
    out = {"case": name, "framing": framing, "cold_compile_ms": round(compile_ms, 1),
           "mask_fill_us": _stats([v for vs in by_region.values() for v in vs]),
           "by_region": {r: _stats(v) for r, v in by_region.items()}}
    if companion is not None:
        out["names_apply_us"] = _stats(apply_us)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON report here too")
    args = parser.parse_args(argv)
    frontend = get_frontend("qwen3.5")
    domain = frontend.domain
    t = frontend.thinking
    info = domain.tokenizer_info()
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    opener, closer = domain.special_id("<tool_call>"), domain.special_id("</tool_call>")
    close = [("framing", c) for c in t.close_tokens]
    answer = json.dumps(ANSWER)
    json_c = OutputConstraint.json_schema(SCHEMA)
    strict = ToolSpec((LOOKUP, NOTE), ToolChoice())
    cases = [
        ("json (baseline)", json_c, "raw", [("content", answer)], False),
        ("thinking + json", json_c, "qwen-think-v1+raw",
         [("reasoning", REASONING[:-1])] + close + [("content", answer)], False),
        ("thinking + xml strict (auto)", strict, "qwen-think-v1+qwen-xml-v1",
         [("reasoning", REASONING[:-1])] + close + [("content", "I will look it up.\n\n"),
                                                    ("call", opener), ("call", STRICT_CALL),
                                                    ("call", closer)], False),
        # `auto`: a forced call (`required`, a named choice) to a non-strict tool follows its
        # declared properties, so only an unforced one takes the loose parameters measured here
        ("xml non-strict (auto)", ToolSpec((LOOKUP, NOTE), ToolChoice()),
         "qwen-xml-v1", [("call", opener), ("call", LOOSE_CALL), ("call", closer)], True),
        ("thinking + json | xml", ToolSpec((LOOKUP, NOTE), ToolChoice(), json_c),
         "qwen-think-v1+qwen-xml-v1",
         [("reasoning", REASONING[:-1])] + close + [("content", answer)], False),
    ]
    results = [run_case(compiler, domain, *case) for case in cases]
    base = results[0]["mask_fill_us"]["p50"]
    for r in results:
        r["p50_over_json_baseline"] = round(r["mask_fill_us"]["p50"] / base, 2)
    report = {"bench": "qwen35-framings", "vocab_size": domain.size,
              "machine": host("xgrammar"),
              "cases": results}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
