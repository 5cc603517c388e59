"""Mask-fill cost of the JSON Schema constructs beyond plain types and properties (formats,
patterns, draft-04, if/then/else, oneOf, ...), measured side by side with plain baselines in one
run (ratios, never absolute targets): compile time and the microseconds per
`fill_next_token_bitmask` while walking valid outputs tokenised by the model's own tokenizer.

    python -m bench.schema_masks --models smollm2 qwen3.5 --out bench-out/schema-masks.json

Uses `bench.grammar.walk_fills` and `tokenize` (the grammar bench's own helpers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.grammar import _Budget, tokenize, walk_fills
from bench.report import write_report
from services.grammar.compiler import ModelCompiler
from services.grammar.schema import layout_values
from shared.contract import OutputConstraint
from shared.frontends import get_domain

D4 = "http://json-schema.org/draft-04/schema#"

# (name, schema, outputs); the first two are the baselines the others are compared with.
CASES = [
    ("baseline-string", {"type": "string"}, ["2024-05-01T10:00:00Z", "ada@example.org"]),
    (
        "baseline-object",
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
        [{"a": "x", "b": 1}, {"b": 22, "zz": True}],
    ),
    (
        "format-date-time",
        {"type": "string", "format": "date-time"},
        ["2024-05-01T10:00:00.125+02:00"],
    ),
    ("format-date", {"type": "string", "format": "date"}, ["2024-02-29"]),
    ("format-email", {"type": "string", "format": "email"}, ["ada.lovelace@example.org"]),
    ("format-hostname", {"type": "string", "format": "hostname"}, ["api.eu-west-1.example.com"]),
    ("format-uuid", {"type": "string", "format": "uuid"}, ["2eb8aa08-aa98-11ea-b4aa-73b441d16380"]),
    ("format-ipv6", {"type": "string", "format": "ipv6"}, ["2001:db8::8a2e:370:7334"]),
    ("format-uri", {"type": "string", "format": "uri"}, ["https://example.com/a/b?c=d#e"]),
    (
        "pattern+maxLength",
        {"type": "string", "pattern": "^[a-z][a-z0-9-]*$", "maxLength": 40},
        ["my-package-name-2"],
    ),
    (
        "draft04-object",
        {
            "$schema": D4,
            "type": "object",
            "properties": {
                "port": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
                "x-note": {},
            },
        },
        [{"port": 8080}],
    ),
    (
        "patternProperties",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "patternProperties": {"^x-": {"type": "string"}},
            "additionalProperties": False,
        },
        [{"name": "a", "x-b": "c", "x-d": "e"}],
    ),
    (
        "min/maxProperties",
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "minProperties": 1,
            "maxProperties": 4,
        },
        [{"a": 1, "b": 2, "c": 3}],
    ),
    (
        "dependentRequired",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "dependentRequired": {"a": ["b"]},
        },
        [{"a": "x", "b": "y"}],
    ),
    (
        "if/then/else",
        {
            "type": "object",
            "properties": {"k": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
            "if": {"properties": {"k": {"const": "a"}}},
            "then": {"required": ["x"]},
        },
        [{"k": "a", "x": 3}],
    ),
    ("not-enum", {"type": "string", "not": {"enum": ["admin", "root"]}}, ["operator"]),
    (
        "oneOf-complement",
        {
            "type": "object",
            "properties": {"e": {"type": "string"}, "ok": {"type": "boolean"}},
            "oneOf": [{"required": ["e"]}, {"required": ["ok"]}],
        },
        [{"ok": True}],
    ),
    ("multipleOf", {"type": "integer", "multipleOf": 7}, [7000007]),
    (
        "uniqueItems-enum",
        {"type": "array", "items": {"enum": ["r", "w", "x"]}, "uniqueItems": True},
        [["x", "r"]],
    ),
]


def bench_model(model: str) -> dict:
    domain = get_domain(model)
    compiler = ModelCompiler(domain)
    compiler.tokenizer_info  # noqa: B018 - built once, outside the timings
    rows = []
    for name, schema, outputs in CASES:
        t0 = time.perf_counter()
        compiled = compiler.compile(OutputConstraint.json_schema(schema, whitespace="any")).grammar
        compile_ms = (time.perf_counter() - t0) * 1000
        fills: list[float] = []
        for text in layout_values(schema, outputs):
            fills += walk_fills(compiled, tokenize(model, text), _Budget(60.0))
        rows.append({"case": name, "compile_ms": round(compile_ms, 1),
                     "mask_us_p50": round(statistics.median(fills), 1),
                     "mask_us_max": round(max(fills), 1), "tokens": len(fills)})
    base = statistics.median([rows[0]["mask_us_p50"], rows[1]["mask_us_p50"]])
    for row in rows:
        row["p50_over_baseline"] = round(row["mask_us_p50"] / base, 2)
    return {"model": model, "vocab_size": domain.size, "cases": rows}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--out")
    args = p.parse_args()
    report = {"bench": "schema-masks", "models": [bench_model(m) for m in args.models]}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
