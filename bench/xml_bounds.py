"""Length-bounded raw XML strings on the real Qwen3.5 vocabulary, as JSON: compile and mask cost
of the delimiter automaton with the RawLengthConstraint companion counting the bounds
(services/grammar/tools/raw_lengths.py), for maxLength 50, 255, 1000 and 10000 (minLength 20).

For each bound: the cold compile time, and while walking one call whose value has exactly the
maximum length (words, line breaks and partial delimiters, written by the model's tokenizer),
the per-token cost (p50, p99, max microseconds) of the matcher's `fill_next_token_bitmask`, of the
companion's `apply` and of both together, split by where the value is: far from the maximum
(more characters left than the longest token has) or near it. `--product N` also compiles the
exact product automaton (the delimiter's states times a count) for maxLength N, the alternative
the companion replaces, side by side in the same run.

    python -m bench.xml_bounds [--product 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import xgrammar as xgr

from bench.qwen35_framings import _stats
from bench.report import host, write_report
from services.grammar.compiler import build_framed_grammar
from services.grammar.tools import xml_values
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.raw_lengths import LengthIndex, RawLengthConstraint
from services.grammar.tools.xml_tools import counted_lengths
from shared.contract import ToolChoice, ToolDefinition, ToolMode
from shared.frontends.qwen35 import qwen35_domain, qwen35_tokenizer

BOUNDS = (50, 255, 1000, 10000)
LOW = 20
WORDS = ("the", "weather", "in", "Shanghai", "is", "warm,", "日本語", "é", "\n", "<", "\n</",
         "\n</param", "</parameter>", "x=1;", "\n\n")


def _spec(hi: int) -> ToolSpec:
    tool = ToolDefinition.create("note", {"type": "object", "properties": {
        "text": {"type": "string", "minLength": LOW, "maxLength": hi}},
        "required": ["text"], "additionalProperties": False}, strict=True)
    return ToolSpec((tool,), ToolChoice(ToolMode.REQUIRED))


def _value(hi: int, rng: random.Random) -> str:
    out = ""
    while len(out) < hi:
        out += rng.choice(WORDS) + " "
    out = out[:hi]
    while out.endswith(("\n", "\n<", "\n</")):  # a value never ends in a partial delimiter here
        out = out[:-1] + "x"
    return out


def run_bound(compiler, domain, hi: int, rng: random.Random) -> dict:
    spec = _spec(hi)
    start = time.perf_counter()
    compiled = compiler.compile_grammar(build_framed_grammar(spec, "qwen-xml-v1", domain))
    compile_ms = (time.perf_counter() - start) * 1000
    index = LengthIndex.of(domain)
    enc = qwen35_tokenizer()._tokenizer.encode_ordinary
    value = _value(hi, rng)
    head = enc("\n<function=note>\n<parameter=text>\n")
    body = enc(value + "\n</parameter>\n</function>\n")
    tokens = [domain.special_id("<tool_call>")] + head + body + \
        [domain.special_id("</tool_call>")]
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    lengths = RawLengthConstraint(index, domain.special_id("<tool_call>"),
                                  domain.special_id("</tool_call>"),
                                  counted_lengths(spec.allowed(), forced=spec.forced))
    mask = xgr.allocate_token_bitmask(1, domain.size)
    fill: dict[str, list[float]] = {}
    apply: dict[str, list[float]] = {}
    for t in tokens:
        s = lengths.state
        region = "framing" if s.mode != "value" else \
            "value far" if hi - s.count > index.max_chars else "value near"
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        t1 = time.perf_counter()
        lengths.apply(mask[0])
        t2 = time.perf_counter()
        fill.setdefault(region, []).append((t1 - t0) * 1e6)
        apply.setdefault(region, []).append((t2 - t1) * 1e6)
        if not (int(mask[0, t >> 5]) >> (t & 31)) & 1:
            raise RuntimeError(f"maxLength {hi}: token {t} cleared from its own walk's mask")
        if not (matcher.accept_token(t) and lengths.accept(t)):
            raise RuntimeError(f"maxLength {hi}: token {t} refused")
    if not matcher.is_completed():
        raise RuntimeError(f"maxLength {hi}: the call is not complete")
    return {"max_length": hi, "min_length": LOW, "value_chars": len(value),
            "cold_compile_ms": round(compile_ms, 1),
            "matcher_fill_us": {r: _stats(v) for r, v in fill.items()},
            "companion_apply_us": {r: _stats(v) for r, v in apply.items()},
            "total_us": {r: _stats([a + b for a, b in zip(fill[r], apply[r])]) for r in fill}}


def run_product(compiler, domain, hi: int) -> dict:
    """Compile the exact product automaton for maxLength `hi` (the grammar counting itself)."""
    saved = xml_values.MAX_COUNTED
    xml_values.MAX_COUNTED = 1 << 30  # every bound counted by grammar rules
    try:
        grammar = build_framed_grammar(_spec(hi), "qwen-xml-v1", domain)
    finally:
        xml_values.MAX_COUNTED = saved
    start = time.perf_counter()
    compiler.compile_grammar(grammar)
    return {"max_length": hi, "min_length": LOW,
            "cold_compile_ms": round((time.perf_counter() - start) * 1000, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--product", type=int, action="append", default=[],
                        help="also compile the product automaton for this maxLength")
    parser.add_argument("--out", help="write the JSON report here too")
    args = parser.parse_args()
    domain = qwen35_domain()
    compiler = xgr.GrammarCompiler(domain.tokenizer_info(), max_threads=1, cache_enabled=False)
    t0 = time.perf_counter()
    LengthIndex.of(domain)
    index_ms = (time.perf_counter() - t0) * 1000
    rng = random.Random(0)
    report = {"bench": "xml-bounds", "vocab_size": domain.size,
              "length_index_build_ms": round(index_ms, 1),
              "machine": host("xgrammar"),
              "companion": [run_bound(compiler, domain, hi, rng) for hi in BOUNDS],
              "product_automaton": [run_product(compiler, domain, hi) for hi in args.product]}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
