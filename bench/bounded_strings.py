"""Mask fills inside bounded strings of framed grammars, before and after, as JSON.

On the built-in vocabulary (SmolLM2) a Hermes tool call whose strict arguments hold a string of
`maxLength` N, forced (`required`, "hermes-args") or after free text under `auto`
("hermes-auto"); on Qwen3.5 the thinking framing around a JSON schema with the same string (an
XML tool call's raw values are counted beside the matcher, by
`services/grammar/tools/raw_lengths.py`, which this bench does not drive). Each case walks one
canonical output (the model's tokenizer writes the text, control tokens by id) with the string N
characters long, and reports the engine, the cold compile, the blob size and the per-token
`fill_mask` CPU time (p50 / p99 / max) over the whole output, inside the string and in the free
text before the call, on the first walk after the cold compile and on the next walk over the
same compiled grammar (llguidance builds lexer states on first use). "before" is the first lowering:
xgrammar with the counted repetition `char{0,N}` (the chain limit set below every bound);
"xgrammar" the xgrammar grammar of record as it is now (the rule chain of
`services/grammar/schema/strings.py` up to its limit); "exact" the product's engine with the
string still bounded in the grammar (llguidance, the product before JSON content lengths were
counted beside the matcher); "after" the product's rule (`services.grammar.compiler.choose_engine`
/ `framed_engine`: JSON content, Hermes tool grammars and both after the thinking framing on
llguidance), with, for JSON content, the string written unbounded and its length companion
(`services/grammar/json_lengths.py`) clearing each mask, its time included in each fill; side by
side in one process. "before", "xgrammar" and "exact" keep the string bounded in the grammar. A
walk whose fills pass `--case-budget-s` of CPU is cut.

    infernix bench bounded-strings --out bench-out/bounded-strings.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from unittest import mock

import numpy as np

from bench.grammar import tokenize
from bench.report import host, write_report
from services.grammar.cache import records
from services.grammar.compiler import Framed, ModelCompiler
from services.grammar.engines.engine import XGRAMMAR
from services.grammar.engines.engine_llguidance import lltokenizer
from services.grammar.json_lengths import json_lengths_for
from services.grammar.schema import strings
from services.grammar.tools.hermes import ToolSpec
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode
from shared.errors import InfernixError
from shared.frontends import get_domain
from shared.frontends.qwen35 import qwen35_tokenizer

_WORDS = ("the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ",", ".",
          " é", " 日本", "\n", " \"quoted\"", " 42")


def _text(n: int) -> str:
    out, i = "", 0
    while len(out) < n:
        out += _WORDS[i % len(_WORDS)]
        i += 1
    return out[:n]


def _schema(n: int) -> dict:
    return {"type": "object", "properties": {"text": {"type": "string", "maxLength": n}},
            "required": ["text"], "additionalProperties": False}


CASES = {"smollm2": ("hermes-args", "hermes-auto"), "qwen3.5": ("thinking-json",)}
FORMS = ("before", "xgrammar", "exact", "after")


def _case(model: str, case: str, n: int) -> tuple[object, list[tuple[str, int]]]:
    """(compilable, [(region, token id)]) of the case's framed grammar and canonical output."""
    args = json.dumps({"text": _text(n)}, ensure_ascii=False)
    head, tail = args.split('"text": "', 1)
    if case in ("hermes-args", "hermes-auto"):
        tool = ToolDefinition.create("note", _schema(n), strict=True)
        forced = case == "hermes-args"
        spec = ToolSpec((tool,), ToolChoice(ToolMode.REQUIRED if forced else ToolMode.AUTO))
        pre = '<tool_call>\n{"name": "note", "arguments": ' + head + '"text": "'
        free = [] if forced else [("free text", "Sure, I will write that note <tool down now. ")]
        pieces = free + [("framing", pre), ("string", tail[:-2]),
                  ("framing", tail[-2:] + "}\n</tool_call>")]
        return spec, [(r, t) for r, p in pieces for t in tokenize(model, p)]
    domain = get_domain(model)
    enc = qwen35_tokenizer()._tokenizer.encode_ordinary
    close = domain.special_id("</think>")
    constraint = Framed(OutputConstraint.json_schema(_schema(n)), "qwen-think-v1+raw")
    pieces = [("reasoning", "The user wants a short note."), ("framing", close),
              ("framing", "\n\n" + head + '"text": "'), ("string", tail[:-2]),
              ("framing", tail[-2:])]
    return constraint, [(r, t) for r, p in pieces for t in ([p] if isinstance(p, int) else enc(p))]


def _stats(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"p50": round(statistics.median(ordered), 1), "p99": round(p99, 1),
            "max": round(ordered[-1], 1), "tokens": len(ordered)}


def run_case(compiler: ModelCompiler, model: str, case: str, n: int, form: str,
             budget_s: float) -> dict:
    constraint, tokens = _case(model, case, n)
    before = form == "before"
    # every form but "after" writes the string bounded, as the grammar did before its length
    # was counted beside the matcher
    exact = mock.patch("services.grammar.schema.counted_strings", lambda root: None) \
        if form != "after" else nullcontext()
    with mock.patch.object(strings, "CHAIN_MAX_LENGTH", -1) if before else nullcontext(), exact:
        start = time.process_time()
        engine = None if form in ("exact", "after") else XGRAMMAR
        compiled = compiler.compile(constraint, engine=engine).grammar
        compile_ms = (time.process_time() - start) * 1000
    lengths = None
    if form == "after" and isinstance(constraint, Framed):  # JSON content: its length companion
        lengths = lambda: json_lengths_for(constraint.source, compiler.domain,  # noqa: E731
                                           constraint.framing)
    blob_kb = len(records.serialize(compiled)) / 1024
    out = {"model": model, "case": case, "max_length": n, "form": form,
           "engine": compiled.engine, "cold_compile_ms": round(compile_ms),
           "blob_kb": round(blob_kb)}
    for walk in ("first", "next"):  # the next walk finds what the first one built lazily
        fills, cut = _walk(compiled, tokens, budget_s, f"{model} {case} {n} ({form})",
                           lengths() if lengths else None)
        out[walk] = {"cut": cut, "mask_fill_us": _stats([v for vs in fills.values() for v in vs]),
                     "in_string_us": _stats(fills.get("string", []))}
        if "free text" in fills:
            out[walk]["free_text_us"] = _stats(fills["free text"])
        if cut:
            break
    return out


def _walk(compiled, tokens: list[tuple[str, int]], budget_s: float, what: str,
          lengths=None) -> tuple[dict[str, list[float]], bool]:
    """CPU microseconds of each fill_mask (and the length companion's clearing, `lengths`: a
    JsonLengthConstraint) by region while one matcher accepts `tokens`, and whether the budget
    cut the walk."""
    matcher = compiled.matcher()
    mask = np.zeros((1, compiled.domain.mask_words), dtype=np.int32)
    fills: dict[str, list[float]] = {}
    until = time.process_time() + budget_s
    for region, t in tokens:
        if time.process_time() > until:
            return fills, True
        t0 = time.process_time()
        matcher.fill_mask(mask, 0)
        if lengths is not None:
            lengths.apply(mask[0])
        fills.setdefault(region, []).append((time.process_time() - t0) * 1e6)
        if not matcher.accept_token(t) or lengths is not None and not lengths.accept(t):
            raise RuntimeError(f"{what}: token {t} ({region}) refused")
    if not matcher.is_completed():
        raise RuntimeError(f"{what}: the output is not complete")
    return fills, False


def run(args: argparse.Namespace) -> int:
    results = []
    for model in args.models:
        compiler = ModelCompiler(get_domain(model))
        compiler.tokenizer_info  # noqa: B018 - the vocabulary indexes, outside every timing
        lltokenizer(compiler.domain)
        for case in CASES[model]:
            if args.cases and case not in args.cases:
                continue
            for n in args.max_lengths:
                for form in args.forms or FORMS:
                    try:
                        results.append(run_case(compiler, model, case, n, form,
                                                args.case_budget_s))
                    except InfernixError as exc:  # a bound the case's grammar refuses
                        results.append({"model": model, "case": case, "max_length": n,
                                        "form": form, "error": exc.to_dict()})
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    report = {"bench": "bounded-strings", "chain_max_length": strings.CHAIN_MAX_LENGTH,
              "machine": host("xgrammar"),
              "cases": results}
    write_report(report, args.out)
    return 0
