"""oneOf proofs beyond type domains and discriminators, each exact, against `jsonschema`.

- objects told apart by a member one branch requires and the other refuses (a closed object
  without that name, or a discriminator value of any disjoint schema);
- oneOf read one JSON type at a time: where two branches accept every value of a type (object
  keywords without `type` leave null, strings, numbers ... unconstrained) or every branch that has
  a part of that type has the same part, no value of that type is valid; the rest must be
  provably disjoint;
- strings whose patterns/formats cannot match together (the string-automaton intersection is
  empty), and string intersections that match nothing become no value (a oneOf branch's format
  under the parent's pattern) instead of refusing the schema.

Design document: "oneOf must prove its branches exclusive ... A composition that cannot be proved
is unsupported." Every accepted schema here is checked value by value against jsonschema, and by
random walks; the unprovable ones keep their typed error at the oneOf's pointer.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import check_schema, schema_to_grammar
from shared.errors import UnsupportedSchema
from tests.support.common import byte_domain


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _valid(schema: dict, value) -> bool:
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).is_valid(value)


CLOSED = {
    "oneOf": [
        {
            "properties": {
                "s": {"type": "string", "maxLength": 2},
                "args": {"type": "array", "maxItems": 1},
            },
            "required": ["s", "args"],
            "additionalProperties": False,
        },
        {
            "properties": {"s": {"type": "string", "maxLength": 2}},
            "required": ["s"],
            "additionalProperties": False,
        },
    ]
}
DISCRIMINATOR = {"type": "object", "oneOf": [
    {"properties": {"kind": {"type": "string", "pattern": "^ok$"}, "v": {"type": "integer"}},
     "required": ["kind"]},
    {"properties": {"kind": {"type": "string", "pattern": "^err$"}, "v": {"type": "string"}},
     "required": ["kind"]},
    {"properties": {"kind": {"type": "integer"}}, "required": ["kind"]},
]}
IDENTICAL = {
    "type": "object",
    "properties": {
        "a": {
            "oneOf": [
                {"type": "object", "properties": {"id": {"type": "string"}}},
                {"type": "object", "properties": {"id": {"type": "string"}}},
                {"type": "null"},
            ]
        },
        "b": {"type": "boolean"},
    },
    "additionalProperties": False,
}
PATTERNS = {"oneOf": [{"type": "integer"}, {"type": "string", "pattern": "^-?[0-9]+/[0-9]+$"},
                      {"type": "string", "pattern": "^0x[0-9a-f]{2}$"}]}
EMPTY_BRANCH = {"type": "string", "pattern": "^https?://", "maxLength": 30,
                "oneOf": [{"format": "uri"}, {"format": "ipv4"}]}

VALUES = [None, True, 0, 7, -3, 1.5, "", "ab", "1/2", "-10/3", "0x1f", "0x1F", "x/y", [], [1],
          {}, {"s": "ab"}, {"s": "abc"}, {"s": "a", "args": []}, {"s": "a", "args": [1, 2]},
          {"s": "a", "x": 1}, {"kind": "ok"}, {"kind": "ok", "v": 1}, {"kind": "ok", "v": "x"},
          {"kind": "err", "v": "x"}, {"kind": "err", "v": 1}, {"kind": 3}, {"kind": "other"},
          {"a": None}, {"a": {}}, {"a": {"id": "x"}}, {"b": True}, {"a": 1},
          "http://a.b/c", "https://x", "ftp://a", "1.2.3.4", "http://1.2.3.4"]


@pytest.mark.parametrize("schema", [CLOSED, DISCRIMINATOR, IDENTICAL, PATTERNS, EMPTY_BRANCH],
                         ids=["closed", "discriminator", "identical", "patterns", "empty-branch"])
def test_proved_one_of_agrees_with_jsonschema(schema):
    grammar = _compiler().compile_grammar(schema_to_grammar(schema))
    outcomes = set()
    for value in VALUES:
        expected = _valid(schema, value)
        outcomes.add(expected)
        assert accepts(grammar, json.dumps(value, separators=(",", ":"))) == expected, value
    assert outcomes == {True, False}
    rng = random.Random(11)
    done = 0
    for _ in range(40):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=60, end_bias=0.5)
        assert not walk.dead_end, walk.data
        if walk.completed:
            done += 1
            assert _valid(schema, json.loads(walk.data.decode("utf-8"))), walk.data
    assert done >= 5


def test_types_two_branches_accept_fully_drop_out():
    """Object keywords without `type`: null, booleans, numbers, strings and arrays satisfy both
    branches, so the oneOf accepts none of them (jsonschema agrees)."""
    root = check_schema(CLOSED).root
    kinds = {type(b).__name__ for b in root.branches}
    assert kinds == {"ObjectType"}
    assert not any(_valid(CLOSED, v) for v in [None, True, 1, "a", []])


@pytest.mark.parametrize("schema", [
    # open objects requiring different names ({"a": 1, "b": 1} satisfies two), more branches than
    # the complement form takes (one_of.MAX_ONE_OF_COMPLEMENTS)
    {"oneOf": [{"type": "object", "required": [n]} for n in "abcdefg"]},
    # a discriminator that is not required ({} satisfies every branch), likewise
    {"oneOf": [{"type": "object", "properties": {"k": {"const": i}}} for i in range(7)]},
    # overlapping patterns, and every value minus arrays of integers (the arrays with a
    # non-integer item would need the numbers that are not integers)
    {"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"},
               {"type": "string", "pattern": "c"}, {"type": "string", "pattern": "d"},
               {"type": "string", "pattern": "e"}, {"type": "string", "pattern": "f"},
               {"type": "string", "pattern": "g"}]},
    {"oneOf": [{"required": ["a"]}, {"type": "array", "items": {"type": "integer"}}]},
])
def test_unprovable_one_of_stays_refused(schema):
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == "/oneOf"


POOL = [
    {
        "type": "object",
        "properties": {"k": {"const": "a"}, "v": {"type": "integer"}},
        "required": ["k"],
    },
    {
        "type": "object",
        "properties": {"k": {"const": "b"}},
        "required": ["k"],
        "additionalProperties": False,
    },
    {"properties": {"x": {"type": "string"}}, "required": ["x"], "additionalProperties": False},
    {"properties": {"y": {}}, "required": ["y"]},
    {"type": "string", "pattern": "^a"},
    {"type": "string", "pattern": "^b"},
    {"type": "string", "maxLength": 1},
    {"type": "integer", "maximum": 0},
    {"type": "number", "minimum": 1},
    {"type": "null"},
    {},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "minItems": 1},
    {"enum": ["a", 1, None]},
    {"required": ["k"]},
    {"properties": {"k": {"type": "string"}}},
    {"type": ["string", "null"], "minLength": 2},
]
POOL_VALUES = [None, True, 0, -1, 1, 2.5, "", "a", "ab", "b", "ba", [], [1], ["x"], {}, {"k": "a"},
               {"k": "b"}, {"k": "a", "v": 1}, {"k": "a", "v": "s"}, {"k": "b", "z": 1}, {"x": "s"},
               {"x": 1}, {"y": 1}, {"x": "s", "y": 1}, {"k": 3}]


def test_random_one_of_compositions_agree_with_jsonschema():
    """Random oneOf of 2-3 schemas from a pool mixing every proof (types, discriminators, closed
    objects, patterns, ranges, full types): each that compiles accepts exactly what jsonschema
    accepts (valid values in the generation layout; invalid ones in neither text)."""
    from services.grammar.schema import layout_values
    from shared.errors import InvalidSchema

    rng = random.Random(5)
    compiled = 0
    for _ in range(60):
        schema = {"oneOf": rng.sample(POOL, rng.choice([2, 2, 3]))}
        try:
            grammar = _compiler().compile_grammar(schema_to_grammar(schema))
        except (UnsupportedSchema, InvalidSchema):
            continue
        compiled += 1
        for value, text in zip(POOL_VALUES, layout_values(schema, POOL_VALUES)):
            raw = json.dumps(value, separators=(",", ":"))
            if _valid(schema, value):
                assert accepts(grammar, text), (schema, value)
            else:
                assert not accepts(grammar, text) and not accepts(grammar, raw), (schema, value)
    assert compiled >= 30
