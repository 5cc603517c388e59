"""What the unique-items companion (services/grammar/unique_items.py) adds to each mask: CPU
microseconds of `fill_mask` alone and of `fill_mask` + `UniqueItemsConstraint.apply`, measured as
bench/json_names.py measures the name companion (its `bench_case`, the same walk over valid
outputs tokenised by the model's own tokenizer); plus the probes run and the tokens cleared.
Each case runs twice in one process, the reference path (`fast=False`: every legal token decided
afresh, every probe searched again) and the kept answers and shortcuts (the default), side by
side.

    python -m bench.unique_items --models smollm2 --passes 5 --out bench-out/unique-items.json
"""

from __future__ import annotations

import argparse
import sys

from bench.json_names import bench_case
from bench.report import write_report
from services.grammar.compiler import ModelCompiler
from services.grammar.unique_items import unique_items_for
from shared.frontends import get_domain

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
# (name, schema, outputs)
CASES = [
    ("any-strings", {"type": "array", "uniqueItems": True, "items": {"type": "string"}}, [WORDS]),
    ("short-strings", {"type": "array", "uniqueItems": True,
                       "items": {"type": "string", "maxLength": 7}}, [WORDS]),
    ("integers", {"type": "array", "uniqueItems": True, "items": {"type": "integer"}},
     [[3, 14, 15, 92, 65, 35, 89, 79, 323, 846]]),
    ("enum-12", {"type": "array", "uniqueItems": True, "items": {"enum": WORDS + ["x", "y"]}},
     [WORDS]),
    ("nested-tags", {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}}}}}},
     [{"items": [{"name": "a", "tags": WORDS[:4]}, {"name": "b", "tags": WORDS[4:8]}]}]),
]


def _reference(constraint, domain):
    return unique_items_for(constraint, domain, fast=False)


def bench_model(model: str, passes: int) -> dict:
    compiler = ModelCompiler(get_domain(model))
    cases = []
    for c in CASES:
        cases.append({"path": "reference", **bench_case(model, compiler, *c, passes=passes,
                                                        companion=_reference)})
        cases.append({"path": "fast", **bench_case(model, compiler, *c, passes=passes,
                                                   companion=unique_items_for)})
    return {"model": model, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2"], choices=["smollm2", "qwen3.5"])
    p.add_argument("--passes", type=int, default=5, help="timed walks of each output")
    p.add_argument("--out", help="write the JSON report here (default: stdout only)")
    args = p.parse_args(argv)
    write_report({"bench": "unique-items",
                  "models": [bench_model(m, args.passes) for m in args.models]}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
