"""Length-bounded raw XML strings: the tool grammar (delimiter automaton) together with the
RawLengthConstraint companion (services/grammar/tools/raw_lengths.py) generate exactly the values
of the definition, at every bound a real schema uses.

Design document: "A raw string argument ends at \\n</parameter>, which must not occur in the
value ... A string's pattern/length and the delimiter exclusion hold together." The definition a
value is judged by here: `DELIM not in value and min <= len(value) <= max` (characters, as JSON
Schema counts code points). Masks are judged by an oracle written from that definition alone (a
prefix is viable iff some valid value's call text starts with it, found by trying witnesses).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import xgrammar as xgr

from services.grammar.compiler import build_framed_grammar
from services.grammar.engines.matching import legal_ids
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.raw_lengths import LengthIndex, RawLengthConstraint
from services.grammar.tools.xml_tools import counted_lengths
from services.worker.output.named_matcher import NamedMatcher
from shared.contract import ToolChoice, ToolDefinition, ToolMode
from shared.errors import UnsupportedSchema
from tests.support.qwen_support import ordinary_ids, qwen_compiler, xml_domain

DELIM = "\n</parameter>"
PREAMBLE = b"\n<function=f>\n<parameter=v>\n"
TAIL = b"\n</parameter>\n</function>\n"
# characters and pieces that make values adversarial: partial and whole delimiters, multi-byte
PIECES = ("a", "b", " ", "é", "日本", "😀", "\n", "<", "/", "p", "r", ">", "\n<", "\n</",
          "\n</param", "eter>", "</parameter>", "\n</parameter", "\n</parameter>", "\n\n")


def _tool(prop: dict) -> ToolDefinition:
    return ToolDefinition.create("f", {"type": "object", "properties": {"v": prop},
                                       "required": ["v"], "additionalProperties": False},
                                 strict=True)


def _spec(prop: dict) -> ToolSpec:
    return ToolSpec((_tool(prop),), ToolChoice(ToolMode.REQUIRED))


def _valid(value: str, lo: int, hi: int | None) -> bool:
    return DELIM not in value and lo <= len(value) and (hi is None or len(value) <= hi)


def _complete_char(data: bytes) -> bytes | None:
    """`data` completed to a character boundary with the fewest bytes (None: not UTF-8)."""
    for extra in (b"", b"\x80", b"\x80\x80", b"\x90\x80\x80", b"\x80\x80\x80", b"\xa0\x80",
                  b"\x9f\x80", b"\x8f\x80\x80", b"\xa0", b"\x90\x80"):
        try:
            (data + extra).decode()
            return data + extra
        except UnicodeDecodeError:
            continue
    return None


def _viable(text: bytes, lo: int, hi: int | None) -> bool:
    """Whether some valid value's call text (after the opener token) starts with `text`."""
    if len(text) <= len(PREAMBLE):
        return PREAMBLE.startswith(text)
    if not text.startswith(PREAMBLE):
        return False
    rest = text[len(PREAMBLE):]
    values = []
    for i in range(len(rest) + 1):  # the value ends inside `text`
        values.append(rest[:i])
    done = _complete_char(rest)  # the value extends `text`: complete it, pad to the minimum
    if done is not None:
        chars = len(done.decode())
        values.append(done + b"a" * max(0, lo - chars))
    for v in values:
        try:
            value = v.decode()
        except UnicodeDecodeError:
            continue
        if _valid(value, lo, hi) and (PREAMBLE + v + TAIL).startswith(text):
            return True
    return False


def _session(compiled, domain, bounds):
    lengths = RawLengthConstraint(LengthIndex.of(domain), domain.special_id("<tool_call>"),
                                  domain.special_id("</tool_call>"), {"f": {"v": bounds}})
    return NamedMatcher(xgr.GrammarMatcher(compiled, terminate_without_stop_token=False),
                        lengths=lengths)


def _mask(pair: NamedMatcher, domain) -> torch.Tensor:
    out = xgr.allocate_token_bitmask(1, domain.size)
    pair.matcher.fill_next_token_bitmask(out, 0)
    pair.apply_names(out[0])
    return out


def _bit(mask: torch.Tensor, t: int) -> bool:
    return bool((int(mask[0, t >> 5]) >> (t & 31)) & 1)


def _accepts(pair: NamedMatcher, domain, tokens: list[int]) -> bool:
    """Every token legal in the pair's mask and accepted, and the language ends there."""
    for t in tokens:
        if not _bit(_mask(pair, domain), t):
            return False
        assert pair.accept_token(t), t
    return pair.matcher.is_completed()


def _random_value(rng: random.Random, hi: int | None) -> str:
    target = rng.choice([0, 1, 5, 12, 13, 14, 19, 20, 21, 30, 49, 50, 51, (hi or 30) + 1])
    out = ""
    while len(out) < target:
        out += rng.choice(PIECES)
    return out[:target] if rng.random() < 0.5 else out


BOUNDS = [(0, 13), (15, 20), (13, 13), (20, None), (0, 50)]


def _schema(lo: int, hi: int | None) -> dict:
    prop: dict = {"type": "string", "minLength": lo}
    if hi is not None:
        prop["maxLength"] = hi
    return prop


@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
def test_the_pair_accepts_exactly_the_valid_values_byte_domain(bounds) -> None:
    """Random and adversarial values (partial and whole delimiters, multi-byte characters), as
    single bytes and as the domain's merges: accepted iff the definition says valid."""
    d = xml_domain()
    compiler = xgr.GrammarCompiler(d.tokenizer_info(), max_threads=1, cache_enabled=False)
    spec = _spec(_schema(*bounds))
    assert counted_lengths(spec.allowed(), forced=spec.forced) == {"f": {"v": bounds}}
    compiled = compiler.compile_grammar(build_framed_grammar(spec, "qwen-xml-v1", d))
    by_bytes = {d.token_bytes[i]: i for i in range(len(d.token_bytes)) if d.is_ordinary(i)}
    rng = random.Random(hash(bounds) & 0xFFFF)
    seen = {True: 0, False: 0}
    for _ in range(120):
        value = _random_value(rng, bounds[1])
        text = PREAMBLE + value.encode() + TAIL
        for merged in (False, True):
            ids, i = [], 0
            while i < len(text):  # longest merge first, or single bytes
                n = max((len(b) for b in by_bytes if merged and text.startswith(b, i)), default=1)
                ids.append(by_bytes[text[i:i + n]])
                i += n
            tokens = [d.special_id("<tool_call>")] + ids + [d.special_id("</tool_call>")]
            expected = _valid(value, *bounds)
            assert _accepts(_session(compiled, d, bounds), d, tokens) == expected, \
                (value, merged)
            seen[expected] += 1
    assert seen[True] and seen[False]


@pytest.mark.parametrize("bounds", [(15, 20), (13, 13), (20, None)], ids=str)
def test_every_mask_bit_is_the_oracles_viability(bounds) -> None:
    """Along random walks through the pair's masks, at every position each token is legal iff
    the oracle finds a valid value whose call text continues the output with it."""
    d = xml_domain()
    compiler = xgr.GrammarCompiler(d.tokenizer_info(), max_threads=1, cache_enabled=False)
    compiled = compiler.compile_grammar(build_framed_grammar(_spec(_schema(*bounds)),
                                                             "qwen-xml-v1", d))
    opener, closer = d.special_id("<tool_call>"), d.special_id("</tool_call>")
    ordinary = [i for i in range(len(d.token_bytes)) if d.is_ordinary(i)]
    favour = [i for i in ordinary if d.token_bytes[i][:1] in (b"\n", b"<", b"/", b"e", b"\xc3")]
    rng = random.Random(7)
    for _ in range(6):
        pair = _session(compiled, d, bounds)
        assert pair.accept_token(opener)
        text = b""
        for _ in range(60):
            mask = _mask(pair, d)
            legal = set(legal_ids(mask[0], d.size))
            for t in ordinary:
                assert (t in legal) == _viable(text + d.token_bytes[t], *bounds), \
                    (text, d.token_bytes[t])
            if closer in legal:
                break
            pool = [t for t in favour if t in legal] if rng.random() < 0.3 else sorted(legal)
            t = rng.choice(pool or sorted(legal))
            assert pair.accept_token(t)
            text += d.token_bytes[t]


@pytest.mark.parametrize("hi", [50, 255, 1000, 10000])
def test_any_real_bound_compiles_and_is_counted(hi) -> None:
    """maxLength 50-10,000 (with a minLength) compiles to the delimiter automaton alone, its
    bounds given to the companion."""
    d = xml_domain()
    spec = _spec({"type": "string", "minLength": 3, "maxLength": hi})
    assert counted_lengths(spec.allowed(), forced=spec.forced) == {"f": {"v": (3, hi)}}
    grammar = build_framed_grammar(spec, "qwen-xml-v1", d)
    assert "raw_b" not in str(grammar)  # no rule per counted character
    xgr.GrammarCompiler(d.tokenizer_info(), max_threads=1,
                        cache_enabled=False).compile_grammar(grammar)


def test_unions_count_one_interval_or_are_refused() -> None:
    """A union of bounded strings counts one interval of lengths; a gap, or a literal branch
    beside a counted one, is refused typed at the parameter (never a looser language)."""
    both = {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "string", "minLength": 15,
                                                             "maxLength": 40}]}
    spec = _spec(both)
    assert counted_lengths(spec.allowed(), forced=spec.forced) == {"f": {"v": (0, 40)}}
    for prop in ({"anyOf": [{"type": "string", "maxLength": 20},
                            {"type": "string", "minLength": 30, "maxLength": 40}]},
                 {"anyOf": [{"type": "string", "maxLength": 20}, {"const": "x" * 30}]}):
        with pytest.raises(UnsupportedSchema) as err:
            build_framed_grammar(_spec(prop), "qwen-xml-v1", xml_domain())
        assert "/properties/v" in str(err.value.to_dict())


def test_a_prefix_past_the_bound_is_refused_by_accept() -> None:
    """The companion refuses, at accept, a token that leaves the bounds (a continued assistant
    message cannot carry an overlong value past it); the matcher's state is unchanged."""
    d = xml_domain()
    compiled = xgr.GrammarCompiler(d.tokenizer_info(), max_threads=1, cache_enabled=False) \
        .compile_grammar(build_framed_grammar(_spec(_schema(0, 13)), "qwen-xml-v1", d))
    pair = _session(compiled, d, (0, 13))
    assert pair.accept_token(d.special_id("<tool_call>"))
    for b in PREAMBLE + b"x" * 13:
        assert pair.accept_token(b)
    assert not pair.accept_token(ord("y"))
    assert pair.lengths.state.count == 13 and pair.lengths.accepted == 1 + len(PREAMBLE) + 13
    assert _accepts(pair, d, list(TAIL) + [d.special_id("</tool_call>")])


@pytest.fixture(scope="module")
def qwen_bounded():
    from shared.frontends.qwen35 import qwen35_domain

    d = qwen35_domain()
    bounds = (20, 50)
    compiled = qwen_compiler().compile_grammar(build_framed_grammar(_spec(_schema(*bounds)),
                                                                    "qwen-xml-v1", d))
    return d, compiled, bounds


def test_real_vocabulary_values_accepted_exactly(qwen_bounded) -> None:
    """On the Qwen3.5 vocabulary, values tokenized by the real tokenizer together with the
    delimiter that follows them (merges across the boundary): accepted iff valid."""
    d, compiled, bounds = qwen_bounded
    rng = random.Random(3)
    seen = {True: 0, False: 0}
    for _ in range(40):
        value = _random_value(rng, bounds[1])
        tokens = [d.special_id("<tool_call>")] + ordinary_ids(PREAMBLE.decode()) + \
            ordinary_ids(value + TAIL.decode()) + [d.special_id("</tool_call>")]
        expected = _valid(value, *bounds)
        assert _accepts(_session(compiled, d, bounds), d, tokens) == expected, value
        seen[expected] += 1
    assert seen[True] and seen[False]


def test_real_vocabulary_masks_near_the_bounds(qwen_bounded) -> None:
    """On the Qwen3.5 vocabulary, at values of 0-52 characters ending in partial delimiters and
    multi-byte characters: every special token (line breaks, pieces of the delimiter), every
    token of the lengths around what is left, and a random sample are legal iff viable."""
    d, compiled, bounds = qwen_bounded
    index = LengthIndex.of(d)
    rng = random.Random(5)
    sample = rng.sample(range(len(d.token_bytes)), 1000)
    for count in (0, 19, 20, 45, 49, 50):
        for ending in ("", "\n", "\n</", "\n</parameter", "日"):
            value = "x" * count + ending
            if not _viable(PREAMBLE + value.encode(), *bounds):
                continue
            pair = _session(compiled, d, bounds)
            prefix = [d.special_id("<tool_call>")] + ordinary_ids(PREAMBLE.decode()) + \
                ordinary_ids(value)
            for t in prefix:
                assert pair.accept_token(t)
            legal = set(legal_ids(_mask(pair, d)[0], d.size))
            left = bounds[1] - len(value)
            near = np.flatnonzero(np.abs(index.chars - left) <= 2)
            near = rng.sample(near.tolist(), min(len(near), 1500))
            for t in set(index.special.tolist()) | set(sample) | set(near):
                if not d.is_ordinary(t):
                    continue
                assert (t in legal) == _viable(PREAMBLE + value.encode() + d.token_bytes[t],
                                               *bounds), (value, d.token_bytes[t])
