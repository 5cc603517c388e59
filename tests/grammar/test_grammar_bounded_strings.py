"""Bounded JSON strings on xgrammar: the rule chain against the counted repetition it replaced.

The seed: "Length counts decoded Unicode characters, independent of escaping; control characters,
quotes and backslashes in JSON strings must be escaped legally", and DESIGN.md, "Constraint
engines": "Neither engine may make a language looser." The chain (`strings.bounded_string_rules`)
is a rewrite for mask speed only, so the language must stay exactly the same: on random strings
(escapes, non-canonical escapes, raw controls, lengths around both bounds) the chain, the old
`char{lo,hi}` form and llguidance's lexeme accept the same texts, and those are exactly the
canonical JSON strings whose decoded length lies in the bounds; along random walks the chain's
masks equal the old form's at every position.
"""

from __future__ import annotations

import json
import random
from unittest import mock

import numpy as np
import pytest

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.engine import LLGUIDANCE, XGRAMMAR
from services.grammar.engines.matching import accepts, legal_ids
from services.grammar.schema import strings
from shared.contract import OutputConstraint
from tests.support.common import byte_domain

# (minLength, maxLength): inside the chain limit, at it, and past it (the counted repetition).
BOUNDS = [(0, 0), (0, 1), (0, 5), (2, 5), (3, 3), (0, 64), (10, 64), (0, 65)]
_PIECES = ["a", "é", "日", "😀", " ", "\\n", "\\\"", "\\\\", "\\u0001", "\\u001f", "\\t", "\\/",
           "\\u0041", "\\x", "\n", "\"", "\\", "ab", "\\u00e9"]


def _compile(schema: dict, engine: str, *, chain: bool = True):
    """The grammar with the string bounded in it (where the product counts a string's length
    beside the matcher instead, test_grammar_json_lengths.py checks the pair against this)."""
    limit = strings.CHAIN_MAX_LENGTH if chain else -1
    with mock.patch.object(strings, "CHAIN_MAX_LENGTH", limit), \
            mock.patch("services.grammar.schema.counted_strings", lambda root: None):
        return ModelCompiler(byte_domain()).compile(OutputConstraint.json_schema(schema),
                                                    engine=engine).grammar


def _expected(text: str, lo: int, hi: int) -> bool:
    """Canonical (json.dumps, ensure_ascii=False) JSON string with lo..hi decoded characters."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, str) and json.dumps(value, ensure_ascii=False) == text \
        and lo <= len(value) <= hi


def _candidates(rng: random.Random, hi: int, count: int) -> list[str]:
    out = []
    for _ in range(count):
        n = rng.choice([hi - 1, hi, hi + 1, rng.randint(0, hi + 3)])
        body = "".join(rng.choice(_PIECES) for _ in range(max(n, 0)))
        out.append(f'"{body}"')
        value = "".join(rng.choice("aé😀\n\"\\\x01 ") for _ in range(max(n, 0)))
        out.append(json.dumps(value, ensure_ascii=False))
    return out


@pytest.mark.parametrize("lo,hi", BOUNDS)
def test_chain_accepts_exactly_what_the_counted_repetition_and_llguidance_accept(lo, hi):
    """Same accept/reject on both forms and both engines, equal to the independent check."""
    schema = {"type": "string", "minLength": lo, "maxLength": hi}
    chain, old = _compile(schema, XGRAMMAR), _compile(schema, XGRAMMAR, chain=False)
    lark = _compile(schema, LLGUIDANCE)
    rng = random.Random(lo * 1000 + hi)
    texts = _candidates(rng, hi, 60)
    for text in texts:
        want = _expected(text, lo, hi)
        got = (accepts(chain, text), accepts(old, text), accepts(lark, text))
        assert got == (want, want, want), (text, got)
    assert any(_expected(t, lo, hi) for t in texts) and not all(_expected(t, lo, hi) for t in texts)


@pytest.mark.parametrize("lo,hi", [(0, 5), (2, 7), (0, 40)])
def test_chain_masks_equal_the_counted_repetition_along_random_walks(lo, hi):
    """The chain changes no mask inside an object with two bounded strings (shared chain rules),
    at every position of random walks over the byte vocabulary."""
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "minLength": lo, "maxLength": hi},
        "b": {"type": "string", "maxLength": hi + 1}}, "required": ["a", "b"],
        "additionalProperties": False}
    chain, old = _compile(schema, XGRAMMAR), _compile(schema, XGRAMMAR, chain=False)
    domain = byte_domain()
    rng = random.Random(hi)
    buf = np.zeros((2, domain.mask_words), dtype=np.int32)
    for _ in range(6):
        m_new, m_old = chain.matcher(), old.matcher()
        for _ in range(4 * hi + 20):
            m_new.fill_mask(buf, 0)
            m_old.fill_mask(buf, 1)
            ids = legal_ids(buf[0], domain.size)
            assert ids == legal_ids(buf[1], domain.size)
            ordinary = [i for i in ids if i not in domain.eos_ids]
            if not ordinary:
                break
            token = rng.choice(ordinary)
            assert m_new.accept_token(token) and m_old.accept_token(token)
        assert m_new.is_completed() == m_old.is_completed()


def test_chains_stay_within_their_rule_budget():
    """Bounds past CHAIN_MAX_LENGTH, or chains past CHAIN_RULE_BUDGET rules, keep the counted
    repetition (compile cost grows with the chain: one precomputed mask per rule)."""
    rules: dict[str, str] = {}
    assert strings.bounded_string_rules(0, strings.CHAIN_MAX_LENGTH + 1, rules) is None
    assert strings.bounded_string_rules(0, None, rules) is None
    assert strings.bounded_string_rules(0, 64, rules) == "strb_t64"
    assert len(rules) == 65
    assert strings.bounded_string_rules(0, 10, rules) == "strb_t10" and len(rules) == 65
    assert strings.bounded_string_rules(60, 64, rules) == "strb_m60_4"
    assert len(rules) == 125
    assert strings.bounded_string_rules(10, 64, rules) is None  # 54 more rules: over 128
