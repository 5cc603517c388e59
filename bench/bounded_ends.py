"""Mask fills near the end of a bounded JSON string on llguidance, by characters left, as JSON.

`bench/bounded_strings.py` finds the slow masks of a `maxLength` string in its last characters;
this bench says where and why. On Qwen3.5's vocabulary, the matcher of `{"text": <string of
maxLength N>}` is put (by single-character tokens) where `k` characters are left, and the next
`fill_mask` is timed there, for each k, in these forms side by side in one process:

- "framed": the product's grammar, the thinking framing (`qwen-think-v1+raw`) around the schema;
- "bare": the same schema as plain JSON content (no framing): the same lexeme, so the same cost;
- "unbounded": the schema without `maxLength`, plus the numpy AND of one packed row (the bare
  cost of counting the string's characters beside the matcher);
- "counted": the product's grammar now (the string written unbounded, its length counted beside
  the matcher by `services/grammar/json_lengths.py`), framed: the fill plus the companion's
  `apply`, timed together; its mask is checked equal to the exact framed one at every k;
- with `--slice-study`: "bare" with no slices at all; with one slice `_CHAR{1,k}` made for
  that k alone (the best any ladder of length slices can do at k: the tokens of at most k
  characters added whole, every longer one walked in one trie); and with `DENSE`, the product's
  ladder with every length up to 13 (its masks checked equal to the product's).

Why it costs: llguidance's mask is a walk of the token trie that slices shorten only by adding
whole sets of tokens that are all legal. With k characters left, every token longer than k is
illegal but its first k characters are a legal prefix, so the walk visits those prefixes of all
of them (Qwen3.5: 248k tokens, 592k trie nodes, 191k of them within 3 characters).

Each time is the CPU time of one fill, min and median over `--repeats` fills from copies of the
positioned matcher (the lexer states are built by the first).

    python -m bench.bounded_ends --out bench-out/bounded-ends.json [--slice-study]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import llguidance as llg
import numpy as np

from bench.report import host, write_report
from services.grammar.compiler import build_llguidance_lark
from services.grammar.engines import engine_llguidance
from services.grammar.json_lengths import json_lengths_for
from shared.contract import OutputConstraint
from shared.frontends import get_domain
from shared.frontends.qwen35 import qwen35_tokenizer

LEFT = tuple(range(0, 21)) + (24, 30, 40, 60, 100)
# The product's slices with a length ladder of every count up to 13 (the product's has 1-4, 6, 8,
# 10): the slow masks sit there.
DENSE = (engine_llguidance.SLICES[:5]
         + [engine_llguidance._CHAR + "{1,%d}" % n for n in (*range(1, 14), 20, 30, 60, 120)]
         + [engine_llguidance._CHAR + "+"])
FRAMING = "qwen-think-v1+raw"


def _exact_lark(schema: dict, framed: bool, domain) -> str:
    """The Lark of `schema` with its string bounded in the grammar (no length companion)."""
    from services.grammar.framing import thinking_prefix_lark
    from services.grammar.schema import schema_to_lark
    from shared.frontends.thinking import SPECS

    text = schema_to_lark(schema, unique_names=True)
    return thinking_prefix_lark(SPECS["qwen-think-v1"], domain, text) if framed else text


def _counted_us(tokenizer, lark: str, lengths, prefix: list[int], mask: np.ndarray,
                repeats: int) -> list[float]:
    """CPU microseconds of `repeats` fills plus the length companion's clearing, positioned
    after `prefix`."""
    template = llg.LLMatcher(tokenizer, llg.LLMatcher.grammar_from_lark(lark), log_level=0)
    if template.is_error() or template.try_consume_tokens(prefix) != len(prefix):
        raise RuntimeError(f"the walk is refused: {template.get_error()[:300]}")
    for t in prefix:
        if not lengths.accept(t):
            raise RuntimeError("the length companion refused the walk")
    out = []
    for _ in range(repeats):
        m = template.deep_copy()
        t0 = time.process_time()
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        lengths.apply(mask)
        out.append((time.process_time() - t0) * 1e6)
    lengths.rollback(len(prefix))
    return out


def _schema(n: int | None) -> dict:
    text = {"type": "string"} if n is None else {"type": "string", "maxLength": n}
    return {"type": "object", "properties": {"text": text}, "required": ["text"],
            "additionalProperties": False}


def _tokenizer(domain, slices: list[str]) -> llg.LLTokenizer:
    vocabulary = llg.TokenizerWrapper(engine_llguidance._Vocabulary(domain))
    return llg.LLTokenizer(vocabulary, n_vocab=domain.size, eos_token=sorted(domain.eos_ids),
                           slices=slices)


def _fill_us(tokenizer, lark: str, prefix: list[int], mask: np.ndarray, repeats: int,
             ) -> list[float]:
    """CPU microseconds of `repeats` fills of a matcher that has accepted `prefix`."""
    template = llg.LLMatcher(tokenizer, llg.LLMatcher.grammar_from_lark(lark), log_level=0)
    if template.is_error() or template.try_consume_tokens(prefix) != len(prefix):
        raise RuntimeError(f"the walk is refused: {template.get_error()[:300]}")
    out = []
    for _ in range(repeats):
        m = template.deep_copy()
        t0 = time.process_time()
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        out.append((time.process_time() - t0) * 1e6)
        if m.is_error():
            raise RuntimeError(m.get_error()[:300])
    return out


def _and_us(mask: np.ndarray, row: np.ndarray, repeats: int) -> list[float]:
    """CPU microseconds of clearing a mask by one packed row, as a length count would."""
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        np.bitwise_and(mask, row, out=mask)
        out.append((time.process_time() - t0) * 1e6)
    return out


def _summary(values: list[float]) -> dict:
    return {"min": round(min(values), 1), "median": round(statistics.median(values), 1)}


def run(args: argparse.Namespace) -> int:
    domain = get_domain("qwen3.5")
    product = engine_llguidance.lltokenizer(domain)
    enc = qwen35_tokenizer()._tokenizer.encode_ordinary
    [char] = enc("a")
    close = domain.special_id("</think>")
    reasoning = enc("The user wants a short note.") + [close] + enc("\n\n")
    head = enc('{"text": "')
    mask = np.zeros(domain.mask_words, dtype=np.int32)
    row = np.full(domain.mask_words, -1, dtype=np.int32)
    bare: dict = {"none": _tokenizer(domain, []), "dense": _tokenizer(domain, DENSE)} \
        if args.slice_study else {}
    results = []
    for n in args.max_lengths:
        constraint = OutputConstraint.json_schema(_schema(n))
        framed = _exact_lark(_schema(n), True, domain)
        plain = _exact_lark(_schema(n), False, domain)
        open_ = build_llguidance_lark(OutputConstraint.json_schema(_schema(None)), None, domain)
        counted = build_llguidance_lark(constraint, FRAMING, domain)
        lengths = json_lengths_for(constraint, domain, FRAMING)
        for k in (k for k in LEFT if k <= n):
            body = head + [char] * (n - k)
            case = {"max_length": n, "left": k,
                    "framed_us": _summary(_fill_us(product, framed, reasoning + body, mask,
                                                   args.repeats))}
            expected = mask.copy()
            case["counted_us"] = _summary(_counted_us(product, counted, lengths, reasoning + body,
                                                      mask, args.repeats))
            if not np.array_equal(mask, expected):
                raise RuntimeError(f"the counted mask differs from the exact one at {k} left")
            case.update({
                    "bare_us": _summary(_fill_us(product, plain, body, mask, args.repeats))})
            fills = _fill_us(product, open_, body, mask, args.repeats)
            case["unbounded_us"] = _summary(fills)
            case["row_and_us"] = _summary(_and_us(mask, row, args.repeats))
            if args.slice_study:
                case["no_slices_us"] = _summary(_fill_us(bare["none"], plain, body, mask,
                                                         args.repeats))
                _fill_us(product, plain, body, mask, 1)
                expected = mask.copy()
                case["dense_us"] = _summary(_fill_us(bare["dense"], plain, body, mask,
                                                     args.repeats))
                if not np.array_equal(mask, expected):
                    raise RuntimeError(f"the dense ladder changed the mask at {k} left")
                if k:
                    if k not in bare:
                        bare[k] = _tokenizer(domain, [engine_llguidance._CHAR + "{1,%d}" % k])
                    case["one_slice_us"] = _summary(_fill_us(bare[k], plain, body, mask,
                                                             args.repeats))
            results.append(case)
            print(results[-1], file=sys.stderr, flush=True)
    report = {"bench": "bounded-ends", "vocabulary": "qwen3.5", "framing": FRAMING,
              "slices": engine_llguidance.SLICES, "repeats": args.repeats,
              "machine": host("llguidance"),
              "cases": results}
    write_report(report, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--max-lengths", nargs="+", type=int, default=[60, 300], metavar="N",
                   help="default: 60 300")
    p.add_argument("--repeats", type=int, default=5, help="fills per position (default: 5)")
    p.add_argument("--slice-study", action="store_true",
                   help="also no slices, and one slice made for each k (the best a ladder does)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
