"""UniqueItemsConstraint: uniqueItems over an infinite (or large) scalar item domain, kept by a
matcher-side companion with exact masks; shapes it cannot keep exact stay refused with their
pointer.

The language is checked against `jsonschema` (its uniqueItems: JSON equality, 1 == 1.0, true is
not 1, strings after unescaping), every mask bit against a brute-force oracle over a small byte
vocabulary (an independent search through the grammar whose finished texts `jsonschema` checks).
"""

from __future__ import annotations

import io
import json
import random

import jsonschema
import numpy as np
import pytest

from services.grammar.cli import run_check
from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids, random_walk
from services.grammar.schema import (
    check_schema,
    companion_positions,
    reduce_tool_arguments,
    schema_to_ebnf,
)
from services.grammar.unique_items import (
    ItemReader,
    RepeatedItem,
    repeats_an_item,
    unique_items_for,
)
from shared.contract import OutputConstraint
from shared.errors import UnsupportedSchema
from tests.support.common import byte_domain

SCALARS = {"type": "array", "uniqueItems": True,
           "items": {"type": ["string", "integer", "boolean", "null"]}}

# Spellings of scalars that are JSON-equal (or look alike and are not).
SPELLINGS = ['"a"', '"\\u0061"', '"A"', '"\\ud83d\\ude00"', '"\U0001F600"', '"\\ud83d"',
             '"\\""', '"\\u0022"', '"\\/"', '"/"', '""', '"\\n"', '"é"', '"\\u00e9"', "1", "1.0",
             "1e0", "10e-1", "0", "-0", "0.0", "2", "true", "false", "null", "1E0"]


def _repeats(text: str) -> bool:
    try:
        ItemReader(companion_positions(SCALARS)).feed(ItemReader(None).start(), text.encode())
    except RepeatedItem:
        return True
    return False


def test_reader_decides_repeats_as_jsonschema_does():
    """'Canonical JSON equality as JSON Schema defines it: numbers compared by value, strings after
    unescaping': on random arrays of equal-looking spellings (escapes, surrogate pairs, 1 / 1.0 /
    1e0 / 10e-1, -0, true vs 1), the reader reports a repeat exactly when jsonschema's
    uniqueItems refuses the array."""
    check = jsonschema.Draft202012Validator({"uniqueItems": True})
    rng = random.Random(9)
    repeats = 0
    for _ in range(3000):
        items = [rng.choice(SPELLINGS) for _ in range(rng.randint(0, 4))]
        ws = rng.choice(["", " ", "\n "])
        text = "[" + ws + f"{ws},{ws}".join(items) + ws + "]"
        expected = not check.is_valid(json.loads(text))
        repeats += expected
        assert _repeats(text) is expected, text
    assert 300 < repeats < 2700


def test_only_companion_arrays_are_kept_unique():
    """The positions follow member names and items: a non-unique array beside a unique one, the
    same strings in sibling unique arrays, and a unique array inside a plain one."""
    schema = {"type": "object", "properties": {
        "u": {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
        "p": {"type": "array", "items": {"type": "string"}},
        "n": {"type": "array", "items": {"$ref": "#/properties/u"}}}}
    c = OutputConstraint.json_schema(schema)
    assert repeats_an_item(c, b'{"u":["a","b","\\u0061"]}')
    assert not repeats_an_item(c, b'{"u":["a","b"],"p":["a","a"]}')
    assert not repeats_an_item(c, b'{"n":[["a"],["a"]]}')
    assert repeats_an_item(c, b'{"n":[["a"],["b","b"]]}')
    assert not repeats_an_item(c, b'{"x":["a","a"]}')  # additionalProperties: any value


ISSUE_CASES = [
    ({"type": "array", "uniqueItems": True, "items": {"type": ["integer", "string"]}},
     ['[1,1]', '[1,"1"]', '["a","\\u0061"]', '["a","b"]', '[1,2,1]', '[]']),
    ({"type": "array", "uniqueItems": True, "items": {"type": "string", "minLength": 1},
      "minItems": 2}, ['["x","x"]', '["x","y"]', '["x"]']),
    ({"type": "array", "uniqueItems": True,
      "items": {"enum": [1.0, 2, 3, 4, 5, 6, 7, 8, 9, "a"]}},
     ['[1.0,1.0]', '[1.0,2]', '["a",9,"a"]', '[1.0,"a"]']),
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True,
                                                "items": {"type": "string"}}}},
     ['{"tags":["x","y","x"]}', '{"tags":["x","y"]}']),
]


def test_issue_cases_through_grammar_check(tmp_path):
    """'[1, 1.0]', '["a","\\u0061"]': `grammar check` accepts exactly the instances jsonschema
    finds valid (1.0 is the only spelling a {"enum": [1.0]} item has)."""
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(json.dumps({"json_schema": s, "instances": t})
                               for s, t in ISSUE_CASES) + "\n")
    args = type("A", (), {"batch": str(batch), "model": "smollm2", "json_whitespace": "any"})()
    out = io.StringIO()
    assert run_check(args, out) == 0, out.getvalue()
    answers = [json.loads(x) for x in out.getvalue().splitlines()]
    for (schema, texts), answer in zip(ISSUE_CASES, answers):
        check = jsonschema.Draft202012Validator(schema)
        assert answer["accepted"] == [check.is_valid(json.loads(t)) for t in texts], answer


REFUSED = [
    ({"type": "array", "uniqueItems": True, "items": {"type": "object"}}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": True, "items": {"type": "array"}}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": True, "items": {"type": "number"}}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": True, "prefixItems": [{"type": "string"}]}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": True, "minItems": 2,
      "items": {"type": "string", "pattern": "^a+$"}}, "/uniqueItems"),
    ({"anyOf": [{"type": "array", "uniqueItems": True, "items": {"type": "string"}},
                {"type": "array", "items": {"type": "string"}}]}, "/anyOf/0/uniqueItems"),
]


@pytest.mark.parametrize("schema,pointer", REFUSED, ids=range(len(REFUSED)))
def test_shapes_not_kept_exact_stay_refused(schema, pointer):
    """'A class that cannot be enforced exactly stays refused, typed with its pointer': object,
    array, fractional-number and any-value items (equality past one scalar), prefixItems, a
    minimum count a pattern's strings are not proved to fill, and an array position that is
    unique in one branch and not in another."""
    with pytest.raises(UnsupportedSchema) as e:
        check_schema(schema, unique_names=True, unique_items=True)
    assert e.value.pointer == pointer


def test_no_companion_no_support_for_tool_arguments():
    """Tool grammars run without this companion (Hermes and XML calls, and the JSON content of a
    JSON-or-calls union): refused there, though they run the name companion;
    schemas without such arrays get no companion (no cost)."""
    args = {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True,
                                                   "items": {"type": "string"}}},
            "additionalProperties": False}
    with pytest.raises(UnsupportedSchema) as e:
        reduce_tool_arguments(args, tool_index=0, tool_name="f")
    assert e.value.pointer == "/properties/t/uniqueItems"
    # a tool grammar's JSON content (JSON-or-calls) is embedded with the name companion only
    with pytest.raises(UnsupportedSchema):
        schema_to_ebnf(args, unique_names=True)
    d = byte_domain()
    assert unique_items_for(OutputConstraint.json_schema(args), d) is not None
    finite = {"type": "array", "uniqueItems": True, "items": {"enum": [1, 2, 3]}}
    assert unique_items_for(OutputConstraint.json_schema(finite), d) is None  # the grammar's
    assert unique_items_for(OutputConstraint.json_schema({"type": "string"}), d) is None
    assert unique_items_for(OutputConstraint.json_object(), d) is None


# ---------------------------------------------------------------- mask exactness

ORACLE_BYTES = b' [],"ab012.\\u'
WALK_BYTES = b' [],"ab012'


def _valid(check, text: bytes) -> bool:
    try:
        return check.is_valid(json.loads(text))
    except ValueError:
        return False


def _completes(matcher, text: bytearray, depth: int, check) -> bool:
    """Brute force: some completion over ORACLE_BYTES (at most `depth` bytes) the grammar accepts
    as a whole output and jsonschema accepts."""
    if matcher.is_completed() and _valid(check, bytes(text)):
        return True
    if depth == 0:
        return False
    for b in ORACLE_BYTES:
        if matcher.accept_token(b):  # byte_domain: token id b is byte b
            text.append(b)
            try:
                if _completes(matcher, text, depth - 1, check):
                    return True
            finally:
                text.pop()
                matcher.rollback(1)
    return False


EXACT_SCHEMAS = [
    # a finite string language past the grammar's 8 values (a pattern): items run out
    {"type": "array", "uniqueItems": True, "items": {"type": "string", "pattern": "^[ab]?$"},
     "maxItems": 4},
    {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 1},
     "maxItems": 4},
    # integers: 1 is a prefix of 10..12, 2 of nothing
    {"type": "array", "uniqueItems": True, "items": {"type": "integer", "minimum": 0,
                                                     "maximum": 12}, "maxItems": 4},
    {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b", "ab", "ba", "aa", "bb", "",
                                                              "a\\u", 0, 10, 1.0]}},
]


@pytest.mark.parametrize("schema", EXACT_SCHEMAS, ids=range(len(EXACT_SCHEMAS)))
def test_mask_is_exact_against_brute_force(schema):
    """'Every token the mask allows has a legal completion': along random walks, a token survives
    the companion exactly when the brute-force search finds a complete output valid for
    jsonschema after it (the grammar alone allows repeats)."""
    d = byte_domain()
    constraint = OutputConstraint.json_schema(schema, whitespace="any")
    grammar = ModelCompiler(d).compile(constraint).grammar
    check = jsonschema.Draft202012Validator(schema)
    rng = random.Random(4)
    cleared = 0
    for _ in range(5):
        items = unique_items_for(constraint, d)
        matcher = grammar.matcher()
        text = bytearray()
        for _ in range(16):
            mask = np.zeros((1, d.mask_words), dtype=np.int32)
            matcher.fill_mask(mask, 0)
            allowed = set(legal_ids(mask[0], d.size))
            cleared += items.apply(mask[0], matcher)
            kept = set(legal_ids(mask[0], d.size))
            for t in sorted(allowed):
                if t in d.eos_ids or not set(d.token_bytes[t]) <= set(ORACLE_BYTES):
                    continue  # the oracle could not finish a text holding other bytes
                assert matcher.accept_token(t)
                text += d.token_bytes[t]
                good = _completes(matcher, text, 7, check)
                del text[-len(d.token_bytes[t]):]
                matcher.rollback(1)
                assert (t in kept) is good, (schema, bytes(text), d.token_bytes[t])
            choices = [t for t in kept if t < 256 and t in WALK_BYTES]
            if not choices:
                break
            t = rng.choice(sorted(choices))
            assert matcher.accept_token(t)
            items.accept(t)
            text += d.token_bytes[t]
    assert cleared > 0  # the walks met repeats the grammar alone allowed


def test_walks_never_repeat_and_never_dead_end():
    """Random walks through the masks with the companion: every completed text is valid for
    jsonschema (no repeated item), and no walk reaches a dead end."""
    d = byte_domain()
    for schema in EXACT_SCHEMAS + [ISSUE_CASES[0][0], ISSUE_CASES[1][0]]:
        constraint = OutputConstraint.json_schema(schema, whitespace="any")
        grammar = ModelCompiler(d).compile(constraint).grammar
        check = jsonschema.Draft202012Validator(schema)
        rng = random.Random(12)
        for _ in range(25):
            walk = random_walk(grammar, d, rng, max_tokens=40, end_bias=0.15,
                               items=unique_items_for(constraint, d))
            assert not walk.dead_end, (schema, walk.data)
            if walk.completed:
                assert check.is_valid(json.loads(walk.data)), (schema, walk.data)


def test_rollback_and_prefix_bytes_follow_the_matcher():
    """The companion shares the matcher's transactions: tokens accepted and rolled back leave its
    state as it was; bytes accepted outside tokens (a continuation prefix) move it."""
    d = byte_domain()
    items = unique_items_for(OutputConstraint.json_schema(SCALARS), d)
    items.accept_bytes(b'["a",')
    base = items.state
    for b in b'"b",1,':
        items.accept(b)
    assert items.accepted == 6
    items.rollback(4)
    items.rollback(2)
    assert items.state == base
    with pytest.raises(ValueError):
        items.rollback(1)


def test_finite_domain_with_fewer_values_than_min_items_has_no_array():
    """The fuzzer's counterexample: a unique array over one value with minItems 2 wrote a rule
    with no way on as the placeholder bytes, so `[` + two NUL bytes was a complete output; no such
    array exists (unsatisfiable branch), also when the minimum comes from an allOf."""
    d = byte_domain()
    schema = {"oneOf": [{"type": "integer", "minimum": 4, "multipleOf": 3},
                        {"type": "array", "items": {"const": "x"}, "uniqueItems": True,
                         "minItems": 2}]}
    grammar = ModelCompiler(d).compile(OutputConstraint.json_schema(schema)).grammar
    m = grammar.matcher()
    assert not (m.accept_bytes(b"[\x00\x00") and m.is_completed())
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        check_schema({"allOf": [{"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True},
                                {"minItems": 3}]}, unique_names=True, unique_items=True)


def test_a_token_spanning_items_is_read_whole():
    """A token may close one item and open the next (`1,"`, `","`): where strings are any string
    a token that only opens one is skipped, one that completes a scalar first is not: after
    `[1,` the token `1,"` repeats 1 and is cleared, `2,"` and `,"`-free `"x` stay."""
    from shared.frontends.token_domain import TokenDomain

    base = byte_domain()
    extra = (b'1,"', b'2,"', b'","')
    tokens = base.token_bytes[:256] + extra + (b"<eos>",)
    d = TokenDomain(name="bytes-unique-test", token_bytes=tokens, size=len(tokens),
                    eos_ids=frozenset({len(tokens) - 1}), control_ids=frozenset(),
                    special_names=(("<eos>", len(tokens) - 1),))
    constraint = OutputConstraint.json_schema(ISSUE_CASES[0][0], whitespace="any")
    grammar = ModelCompiler(d).compile(constraint).grammar
    items = unique_items_for(constraint, d)
    matcher = grammar.matcher()
    for b in b'["a",1,':
        assert matcher.accept_token(b)
        items.accept(b)
    mask = np.zeros((1, d.mask_words), dtype=np.int32)
    matcher.fill_mask(mask, 0)
    items.apply(mask[0], matcher)
    kept = set(legal_ids(mask[0], d.size))
    one, two, pair = 256, 257, 258
    assert one not in kept and two in kept and ord('"') in kept
    for b in b'"b':
        assert matcher.accept_token(b)
        items.accept(b)
    matcher.fill_mask(mask, 0)
    items.apply(mask[0], matcher)
    assert pair in set(legal_ids(mask[0], d.size))  # closes "b", opens the next: fresh
