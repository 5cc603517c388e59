"""What the JSON name companion (services/grammar/json_names.py) adds to each mask: CPU
microseconds of `fill_mask` alone and of `fill_mask` + `JsonNameConstraint.apply`, side by side
in one run, while walking valid outputs tokenised by the model's own tokenizer (each mask twice at
its state: the second is `repeat`); plus the probes the companion ran and the tokens it cleared.

    python -m bench.json_names --models smollm2 qwen3.5 --passes 10 --out bench-out/json-names.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from bench.grammar import tokenize
from bench.report import write_report
from services.grammar.compiler import ModelCompiler
from services.grammar.json_names import json_names_for
from services.grammar.schema import layout_values
from shared.contract import OutputConstraint
from shared.frontends import get_domain

MANY = {f"k{i}": i for i in range(12)}
# (name, schema or None for json_object, outputs)
CASES = [
    ("open-object", {"type": "object"}, [MANY, {"a": {"b": 1, "c": [1, {"d": 2}]}, "e": "x"}]),
    ("min-properties-2", {"type": "object", "minProperties": 2,
                          "additionalProperties": {"type": "integer"}}, [MANY]),
    ("finite-names", {"type": "object", "propertyNames": {"enum": ["alpha", "beta", "gamma"]},
                      "additionalProperties": {"type": "integer"}},
     [{"alpha": 1, "beta": 2, "gamma": 3}]),
    ("json-object", None, [MANY]),
]


def _stats(values: list[float]) -> dict:
    values = sorted(values)
    return {"mean_us": round(statistics.fmean(values), 1),
            "p50_us": round(values[len(values) // 2], 1),
            "p99_us": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1)}


def bench_case(model: str, compiler: ModelCompiler, name: str, schema, outputs,
               passes: int = 10, companion=json_names_for) -> dict:
    """The masks of every output, walked `passes` times after one untimed warm-up pass (the
    vocabulary's one-time indexes and the interpreter's first calls are not a mask's cost); each
    mask is filled and cleared twice at its state, as the lookahead and the verification (or a
    proposer's probe and the sampling) do: `repeat` is the second. `companion(constraint,
    domain)`: the companion measured (bench/unique_items.py passes the unique-items one)."""
    domain = compiler.domain
    constraint = OutputConstraint.json_object(whitespace="any") if schema is None else \
        OutputConstraint.json_schema(schema, whitespace="any")
    grammar = compiler.compile(constraint).grammar
    texts = layout_values(schema if schema is not None else {"type": "object"}, outputs)
    bare, with_names, repeat = [], [], []
    probes = cleared = 0
    mask = np.zeros((1, domain.mask_words), dtype=np.int32)
    for n in range(passes + 1):
        for text in texts:
            names = companion(constraint, domain)
            matcher = grammar.matcher()
            for t in tokenize(model, text):
                start = time.process_time()
                matcher.fill_mask(mask, 0)
                mid = time.process_time()
                got = names.apply(mask[0], matcher)
                end = time.process_time()
                matcher.fill_mask(mask, 0)
                names.apply(mask[0], matcher)
                again = time.process_time()
                if n:
                    bare.append((mid - start) * 1e6)
                    with_names.append((end - start) * 1e6)
                    repeat.append((again - end) * 1e6)
                    cleared += got
                if not (matcher.accept_token(t) and (int(mask[0, t >> 5]) >> (t & 31)) & 1):
                    raise RuntimeError(f"{name}: a valid output's token {t} was refused")
                names.accept(t)
            if n:
                probes += names.probes
    return {"case": name, "engine": grammar.engine, "masks": len(bare), "passes": passes,
            "fill": _stats(bare), "fill_and_names": _stats(with_names),
            "fill_and_names_repeat": _stats(repeat), "probes": probes, "cleared": cleared}


def bench_model(model: str, passes: int = 10) -> dict:
    compiler = ModelCompiler(get_domain(model))
    return {"model": model,
            "cases": [bench_case(model, compiler, *c, passes=passes) for c in CASES]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2"], choices=["smollm2", "qwen3.5"])
    p.add_argument("--passes", type=int, default=10, help="timed walks of each output")
    p.add_argument("--out", help="write the JSON report here (default: stdout only)")
    args = p.parse_args(argv)
    report = {"bench": "json-names",
              "models": [bench_model(m, args.passes) for m in args.models]}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
