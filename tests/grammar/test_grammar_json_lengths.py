"""Counted JSON string lengths: the content grammar with counted strings written unbounded plus
the JsonLengthConstraint companion (services/grammar/json_lengths.py) give the language of the
exact bounded grammar, with every mask bit equal at every position.

JSON Schema: "A string instance is valid against [maxLength] if its length is less than, or
equal to, the value of this keyword. The length of a string instance is defined as the number of
its characters as defined by RFC 8259" (and minLength the same from below). The reference here
is the exact grammar the converter wrote before (`counted_lengths=False`), itself checked by the
schema tests; both are compiled for llguidance from the same schema, walked side by side: every
mask of the pair must equal the exact grammar's, and rollbacks must restore both.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.grammar.engines.engine_llguidance import LlguidanceConstraint
from services.grammar.engines.matching import legal_ids
from services.grammar.json_lengths import JsonLengthConstraint, JsonLengthIndex
from services.grammar.schema import check_schema, schema_to_lark
from services.grammar.schema.lengths import counted_strings
from shared.frontends.token_domain import TokenDomain

# merges that cross string boundaries, escapes and characters
_MERGES = (b'"', b'",', b'"}', b'":', b'":"', b'", "', b'","', b'""', b'"a"', b'{"', b'["',
           b'"]', b'"a', b'ab', b'abc', b'abcd', b'\\', b'\\n', b'\\"', b'\\\\', b'\\u', b'\\u00',
           b'\\u001', b'u00', b'001f', b'n"', b'\\t"', b'a\\', b'ab"', b'\xc3\xa9', b'\xe6\x97',
           b'\xa5', b'\xf0\x9f\x98', b'\x80', b'\xe6\x97\xa5\xe6\x9c\xac', b'a"}', b'a", "b":"',
           b'": "', b' "', b'x":"abc', b'":"ab"}', b'"b"', b', ', b'[', b']', b'ws ', b'  ',
           # a string opened after a name, a comma or whitespace, inside the token
           b': "abc', b':"a', b': ""', b',"ab', b', "abcd', b',""', b' "abc', b'"abcde',
           b'["abc', b'"], "', b'"}, {"')


def _domain() -> TokenDomain:
    tokens = [bytes([b]) for b in range(256)] + list(_MERGES) + [b"<eos>", b"<think-close>"]
    eos, close = len(tokens) - 2, len(tokens) - 1
    return TokenDomain(name="json-lengths-test", token_bytes=tuple(tokens), size=len(tokens) + 3,
                       eos_ids=frozenset({eos}), control_ids=frozenset({close}),
                       special_names=(("<eos>", eos), ("<think-close>", close)))


SCHEMAS = [
    {"type": "string", "maxLength": 3},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 2},
                                      "b": {"type": "string", "minLength": 2, "maxLength": 4}},
     "required": ["a"]},
    {"type": "object", "properties": {"x": {"type": "string", "maxLength": 1, "minLength": 1},
                                      "y": {"type": "array", "items": {"type": "string",
                                                                       "maxLength": 2}}},
     "additionalProperties": False},
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 1}],
     "items": {"type": "string", "minLength": 1, "maxLength": 3}, "maxItems": 4},
    # not counted where ambiguous: the union keeps its exact grammar beside a counted member
    {"type": "object", "properties": {
        "u": {"anyOf": [{"type": "string", "maxLength": 2}, {"enum": ["aaaab"]}]},
        "c": {"type": "string", "maxLength": 2},
        "n": {"type": "object", "properties": {"ab": {"type": "string", "maxLength": 5}}}},
     "required": ["u", "c", "n"], "additionalProperties": {"type": "string", "maxLength": 1}},
    # a declared name spelled with an escape and a multi-byte character; objects in an array
    {"type": "object", "properties": {
        'k"é': {"type": "string", "maxLength": 2},
        "o": {"type": "array", "maxItems": 2, "items": {
            "type": "object", "properties": {"ab": {"type": "string", "minLength": 2,
                                                     "maxLength": 3}}, "required": ["ab"],
            "additionalProperties": False}}},
     "additionalProperties": False},
]


def _pair(schema, domain, framing_close=None, whitespace="any"):
    exact = LlguidanceConstraint(schema_to_lark(schema, unique_names=True,
                                                whitespace=whitespace), domain).matcher()
    counted = counted_strings(check_schema(schema, unique_names=True).root)
    assert counted is not None
    loose = LlguidanceConstraint(schema_to_lark(schema, unique_names=True, counted_lengths=True,
                                                whitespace=whitespace), domain).matcher()
    lengths = JsonLengthConstraint(JsonLengthIndex.of(domain), counted, framing_close)
    return exact, loose, lengths


def _masks(exact, loose, lengths, domain):
    a = np.zeros((1, domain.mask_words), dtype=np.int32)
    b = np.zeros((1, domain.mask_words), dtype=np.int32)
    exact.fill_mask(a, 0)
    loose.fill_mask(b, 0)
    lengths.apply(b[0])
    return a[0], b[0]


def _pick(ids, domain, rng):
    """Mostly tokens that cross quotes, escapes or characters of several bytes."""
    datas = domain.token_bytes
    odd = [t for t in ids if b'"' in datas[t] or b"\\" in datas[t] or max(datas[t]) > 127]
    multi = [t for t in ids if len(datas[t]) > 1]
    r = rng.random()
    if odd and r < 0.4:
        return rng.choice(odd)
    return rng.choice(multi if multi and r < 0.8 else ids)


def _walk(schema, domain, rng, steps, pair=None, whitespace="any"):
    exact, loose, lengths = pair or _pair(schema, domain, whitespace=whitespace)
    depth = 0
    for _ in range(steps):
        a, b = _masks(exact, loose, lengths, domain)
        if not np.array_equal(a, b):
            only_a = set(legal_ids(a, domain.size)) - set(legal_ids(b, domain.size))
            only_b = set(legal_ids(b, domain.size)) - set(legal_ids(a, domain.size))
            pytest.fail(f"{schema}: masks differ after {lengths.state}: exact only "
                        f"{[domain.token_bytes[t] for t in sorted(only_a)][:8]}, pair only "
                        f"{[domain.token_bytes[t] for t in sorted(only_b)][:8]}")
        ids = [t for t in legal_ids(a, domain.size) if t not in domain.eos_ids]
        if not ids:
            break
        if depth and rng.random() < 0.1:  # roll back, then the masks must agree again
            n = rng.randint(1, depth)
            exact.rollback(n)
            loose.rollback(n)
            lengths.rollback(n)
            depth -= n
            continue
        t = _pick(ids, domain, rng)
        assert exact.accept_token(t) and loose.accept_token(t) and lengths.accept(t)
        depth += 1
    return depth


@pytest.mark.parametrize("schema", SCHEMAS)
def test_every_mask_equals_the_exact_grammar_on_adversarial_tokens(schema):
    domain = _domain()
    rng = random.Random(7)
    for _ in range(40):
        _walk(schema, domain, rng, 40)


@pytest.mark.parametrize("whitespace", ["compact", "indented"])
def test_every_mask_equal_in_each_whitespace_profile(whitespace):
    domain = _domain()
    rng = random.Random(11)
    for schema in (SCHEMAS[2], SCHEMAS[5]):
        for _ in range(15):
            _walk(schema, domain, rng, 40, whitespace=whitespace)


def test_the_union_position_is_not_counted():
    """The diagnosis's case: under anyOf(maxLength-2 string, enum "aaaab") no single bound
    applies, so only the plain member `c` is counted."""
    counted = counted_strings(check_schema(SCHEMAS[4], unique_names=True).root)
    assert [name for name, _ in counted.members] == [b"c", b"n"]


def test_rollback_restores_the_count():
    domain = _domain()
    exact, loose, lengths = _pair({"type": "string", "maxLength": 2}, domain)
    for t in (ord('"'), ord("a"), ord("b")):
        assert lengths.accept(t) and exact.accept_token(t) and loose.accept_token(t)
    assert not lengths.accept(ord("c"))  # a third character overruns
    lengths.rollback(1)
    exact.rollback(1)
    loose.rollback(1)
    a, b = _masks(exact, loose, lengths, domain)
    assert np.array_equal(a, b) and (int(b[ord("c") >> 5]) >> (ord("c") & 31)) & 1


def test_after_a_thinking_close_the_json_starts():
    domain = _domain()
    close = domain.special_id("<think-close>")
    lengths = JsonLengthConstraint(JsonLengthIndex.of(domain),
                                   counted_strings(check_schema(SCHEMAS[0]).root), close)
    for t in b'"abcdef':  # reasoning text: not counted
        assert lengths.accept(t)
    assert lengths.accept(close)
    for t in b'"abc':
        assert lengths.accept(t)
    assert not lengths.accept(ord("d"))


QWEN_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "minLength": 3, "maxLength": 12},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "u": {"anyOf": [{"type": "string", "maxLength": 5}, {"enum": ["aaaaaaaab"]}]}},
    "required": ["title"]}


@pytest.mark.slow
@pytest.mark.parametrize("schema", [SCHEMAS[1], SCHEMAS[2], SCHEMAS[4], QWEN_SCHEMA])
def test_qwen35_walks_keep_every_mask_equal(schema):
    from shared.frontends import get_domain

    domain = get_domain("qwen3.5")
    rng = random.Random(3)
    for _ in range(6):
        _walk(schema, domain, rng, 40)


@pytest.mark.slow
def test_qwen35_product_build_after_a_thinking_framing():
    """The product's compile (build_llguidance_lark under the Qwen thinking framing) and its
    companion (json_lengths_for) against the exact grammar under the same framing."""
    from services.grammar.compiler import build_llguidance_lark
    from services.grammar.framing import thinking_prefix_lark
    from services.grammar.json_lengths import json_lengths_for
    from shared.contract import OutputConstraint
    from shared.frontends import get_domain
    from shared.frontends.thinking import SPECS

    domain = get_domain("qwen3.5")
    framing = "qwen-think-v1+raw"
    constraint = OutputConstraint.json_schema(QWEN_SCHEMA)
    exact_lark = thinking_prefix_lark(SPECS["qwen-think-v1"], domain,
                                      schema_to_lark(QWEN_SCHEMA, unique_names=True))
    exact = LlguidanceConstraint(exact_lark, domain).matcher()
    loose = LlguidanceConstraint(build_llguidance_lark(constraint, framing, domain),
                                 domain).matcher()
    lengths = json_lengths_for(constraint, domain, framing)
    assert lengths is not None
    from shared.frontends.qwen35 import qwen35_tokenizer

    enc = qwen35_tokenizer()._tokenizer.encode_ordinary
    head = enc("Short.") + [domain.special_id(SPECS["qwen-think-v1"].close)] + enc("\n\n")
    for t in head:
        assert exact.accept_token(t) and loose.accept_token(t) and lengths.accept(t)
    _walk(QWEN_SCHEMA, domain, random.Random(5), 40, (exact, loose, lengths))


def test_grammar_check_refuses_a_text_past_a_counted_bound():
    """`grammar check` judges a text as the worker decodes it: the compiled grammar alone takes
    the overlong string (it is written unbounded), the check with the companion does not."""
    from services.grammar.cli import _checker
    from services.grammar.compiler import ModelCompiler
    from services.grammar.engines.matching import accepts
    from shared.contract import OutputConstraint

    domain = _domain()
    constraint = OutputConstraint.json_schema(SCHEMAS[1])
    compiled = ModelCompiler(domain).compile(constraint).grammar
    check = _checker(constraint, domain)
    assert accepts(compiled, '{"a":"abc"}')
    assert not check(compiled, '{"a":"abc"}') and check(compiled, '{"a":"ab"}')
    assert not check(compiled, '{"a":"","b":"x"}') and check(compiled, '{"a":"","b":"xy"}')


def test_items_of_a_unique_array_are_not_counted():
    """The unique-items companion probes the matcher for a fresh item; a probe through an
    unbounded item string could find one only a longer string than maxLength spells, so such
    items keep their bounded grammar."""
    schema = {"type": "object", "properties": {
        "u": {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 2}},
        "t": {"type": "string", "maxLength": 2}}}
    counted = counted_strings(check_schema(schema, unique_names=True, unique_items=True).root)
    assert counted.members == ((b"t", (0, 2)),)


def test_generated_schemas_keep_every_mask_equal():
    """The engine differential's generated schemas (objects, arrays, unions, enums, patterns,
    recursive definitions, bounded strings anywhere): wherever some string is counted, the pair's
    masks equal the exact grammar's along walks (a string the selection wrongly counted, or a
    bound the companion applied at the wrong place, shows as a differing bit)."""
    from tests.grammar.test_grammar_engine_diff import generated_schemas

    domain = _domain()
    rng = random.Random(21)
    counted = 0
    for schema in generated_schemas(400, seed=15):
        if counted_strings(check_schema(schema, unique_names=True).root) is None:
            continue
        counted += 1
        for _ in range(6):
            _walk(schema, domain, rng, 40)
    assert counted >= 10  # the generator reaches counted strings in many schemas
