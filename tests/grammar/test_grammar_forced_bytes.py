"""The matcher's forced bytes (services/grammar/engines/engine.py), on both engines.

Contract: `forced_bytes()` is "the bytes every continuation of the output so far starts with (the
grammar forces them, across rules ...); b"" where the next byte is free, or the output ended.
Never changes the state." DESIGN.md, "Constraint engines": the engines are "proved equivalent by
differential tests" (tests/grammar/test_grammar_engine_diff.py compares forced bytes along its
walks).

Independent base: on the byte test vocabulary the forced bytes are the longest run along which the
mask holds exactly one legal single-byte token and no EOS, found by walking masks byte by byte.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.grammar.engines.matching import legal_ids
from shared.contract import OutputConstraint
from tests.grammar.test_grammar_engine_diff import SCHEMAS, both, compiler

LONG_KEYS = {"type": "object", "properties": {
    "customer_reference_number": {"type": "string", "maxLength": 8},
    "delivery_status": {"enum": ["pending", "shipped", "delivered_to_neighbour"]},
    "mark": {"enum": ["é1", "è2"]}},
    "required": ["customer_reference_number", "delivery_status", "mark"],
    "additionalProperties": False}


def oracle_forced(matcher, domain) -> bytes:
    """The forced bytes by masks: while exactly one byte token (ids 0..255) is legal and EOS is
    not, take it. Leaves the matcher where it was."""
    out = np.zeros((1, domain.mask_words), dtype=np.int32)
    data = bytearray()
    taken = 0
    while True:
        matcher.fill_mask(out)
        ids = legal_ids(out[0], domain.size)
        single = [i for i in ids if i < 256]
        if len(single) != 1 or any(i in domain.eos_ids for i in ids):
            break
        assert matcher.accept_token(single[0])
        taken += 1
        data.append(single[0])
    matcher.rollback(taken)
    return bytes(data)


def walk_and_compare(grammar, rng: random.Random, walks: int = 4, steps: int = 40) -> int:
    """Random legal walks; at every position the engine's forced bytes equal the mask oracle's
    and the query leaves the mask unchanged. Returns how many positions forced something."""
    domain = grammar.domain
    before = np.zeros((1, domain.mask_words), dtype=np.int32)
    after = before.copy()
    forcing = 0
    for _ in range(walks):
        m = grammar.matcher()
        for _ in range(steps):
            m.fill_mask(before)
            forced = m.forced_bytes()
            m.fill_mask(after)
            assert np.array_equal(before, after), "forced_bytes changed the state"
            assert forced == oracle_forced(m, domain), grammar.engine
            forcing += bool(forced)
            ids = [i for i in legal_ids(before[0], domain.size) if i not in domain.eos_ids]
            if not ids:
                break
            assert m.accept_token(rng.choice(ids))
    return forcing


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("i", [0, 5, 11, 23, 42, 60])
def test_forced_bytes_match_the_mask_oracle(engine, i):
    grammar = both(OutputConstraint.json_schema(SCHEMAS[i]), compiler())[engine == "llguidance"]
    walk_and_compare(grammar, random.Random(i))


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("whitespace", ["any", "indented"])
def test_forced_bytes_cross_rules_and_characters(engine, whitespace):
    """Keys, `": "`, the rest of an enum value and the closing layout are forced across rules;
    a forced run may end inside a UTF-8 character ("é1" and "è2" share their first byte)."""
    constraint = OutputConstraint.json_schema(LONG_KEYS, whitespace=whitespace)
    grammar = both(constraint, compiler())[engine == "llguidance"]
    m = grammar.matcher()
    assert m.accept_bytes(b"{")
    start = m.forced_bytes()
    indented = whitespace == "indented"
    assert start == (b'\n  "customer_reference_number": "' if indented else b"")
    assert m.accept_bytes(b'\n  "customer_reference_number": "ab",\n  "delivery_status": "d')
    assert m.forced_bytes() == (b'elivered_to_neighbour",\n  "mark": "\xc3' if indented
                                else b'elivered_to_neighbour"')
    assert walk_and_compare(grammar, random.Random(7)) > 0


@pytest.mark.parametrize("constraint,prefix,forced", [
    (OutputConstraint.regex("ab(cd|ce)fg[0-9]"), b"abce", b"fg"),
    (OutputConstraint.choice(["alpha beta", "alpha gamma"]), b"al", b"pha "),
    (OutputConstraint.choice(["alpha beta", "alpha gamma"]), b"alpha g", b"amma"),
], ids=["regex", "choice-shared", "choice-rest"])
def test_forced_bytes_of_xgrammar_only_languages(constraint, prefix, forced):
    grammar = compiler().compile(constraint, engine="xgrammar").grammar
    m = grammar.matcher()
    assert m.forced_bytes() == oracle_forced(m, grammar.domain)
    assert walk_and_compare(grammar, random.Random(3)) > 0
    assert m.accept_bytes(prefix)
    assert m.forced_bytes() == forced


def test_forced_bytes_after_the_end_are_empty():
    for grammar in both(OutputConstraint.json_schema({"const": "x"}), compiler()):
        m = grammar.matcher()
        assert m.forced_bytes() == b'"x"'
        assert m.accept_bytes(b'"x"')
        assert m.forced_bytes() == b""
        assert m.accept_token(min(grammar.domain.eos_ids)) and m.is_terminated()
        assert m.forced_bytes() == b""
