"""`not`, `if`/`then`/`else`, dependencies, integer `multipleOf`, finite `uniqueItems`: random legal
walks validate with `jsonschema`, instances it rejects are refused, valid ones accepted; the forms
that do not reduce exactly are UnsupportedSchema at their pointer.
"""

from __future__ import annotations

import json
import random
import zlib

import jsonschema
import pytest

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import check_schema, layout_values
from shared.errors import UnsupportedSchema
from tests.grammar.test_grammar_schema_walks import compile_schema
from tests.support.common import byte_domain

D7 = "http://json-schema.org/draft-07/schema#"

CASES = [
    ("not-type", {"not": {"type": ["null", "string"]}}, [1, True, [], {}], [None, "a"]),
    ("not-enum", {"type": "string", "not": {"enum": ["a", "b"]}}, ["", "c", "ab"], ["a", "b", 1]),
    ("not-const-bool", {"not": {"const": True}}, [False, None, 0], [True]),
    ("not-pattern", {"type": "string", "not": {"pattern": "^x"}}, ["", "ax", "yx"], ["x", "xy"]),
    (
        "not-bounds",
        {"type": "number", "not": {"minimum": 2, "maximum": 5}},
        [1, 5.5, -3],
        [2, 3.5, 5],
    ),
    ("not-length", {"type": "string", "not": {"maxLength": 2}}, ["abc", "abcd"], ["", "ab"]),
    ("not-required", {"type": "object", "not": {"required": ["x"]}}, [{}, {"y": 1}], [{"x": 1}]),
    (
        "not-anyof-required",
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        },
        [{}, {"c": 1}],
        [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}],
    ),
    (
        "if-then-else",
        {
            "type": "object",
            "properties": {"k": {"enum": ["a", "b"]}, "x": {}, "y": {}},
            "if": {"properties": {"k": {"const": "a"}}},
            "then": {"required": ["x"]},
            "else": {"required": ["y"]},
        },
        [{"k": "a", "x": 1}, {"k": "b", "y": 1}, {"x": 1}],
        [{"k": "a"}, {"k": "b", "x": 1}, {}, {"y": 1}],
    ),
    ("if-then", {"if": {"type": "string"}, "then": {"minLength": 2}}, ["ab", 1, None], ["a", ""]),
    (
        "dependent-required",
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "dependentRequired": {"a": ["b"], "c": ["a"]},
        },
        [{}, {"b": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 2, "c": 3}],
        [{"a": 1}, {"c": 1, "b": 1}],
    ),
    (
        "dependent-schemas",
        {
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}},
            "dependentSchemas": {"a": {"required": ["b"], "properties": {"b": {"minimum": 5}}}},
        },
        [{}, {"b": 1}, {"a": 0, "b": 7}],
        [{"a": 0}, {"a": 0, "b": 1}],
    ),
    (
        "dependencies-draft7",
        {
            "$schema": D7,
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "dependencies": {"a": ["b"], "c": {"properties": {"a": {"type": "null"}}}},
        },
        [{}, {"a": 1, "b": 1}, {"c": 1}, {"c": 1, "a": None, "b": 0}],
        [{"a": 1}, {"c": 1, "a": 1, "b": 1}],
    ),
    (
        "multiple-of",
        {"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 100},
        [0, 7, -28, 98],
        [1, 105, -35, 8],
    ),
    ("multiple-of-number", {"type": "number", "multipleOf": 3}, [0, 3, -9, 300], [1, 1.5, 4]),
    (
        "unique-enum",
        {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True, "minItems": 1},
        [["a"], ["c", "a"], ["b", "a", "c"]],
        [[], ["a", "a"], ["a", "b", "a"], ["d"]],
    ),
    (
        "one-of-required",
        {
            "type": "object",
            "properties": {"e": {"type": "string"}, "ok": {"type": "boolean"}},
            "oneOf": [{"required": ["e"]}, {"required": ["ok"]}],
        },
        [{"e": "x"}, {"ok": True}],
        [{}, {"e": "x", "ok": True}, {"e": 1}],
    ),
    (
        "one-of-closed",
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "additionalProperties": False,
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        [{"a": 1}, {"b": [2]}],
        [{}, {"a": 1, "b": 2}, {"c": 1}],
    ),
    (
        "not-numbers",
        {"type": "integer", "not": {"enum": [0, 5]}, "minimum": -2, "maximum": 6},
        [-2, 1, 4, 6],
        [0, 5, 7],
    ),
    (
        "one-of-ranges",
        {"oneOf": [{"type": "integer", "maximum": 0}, {"type": "number", "exclusiveMinimum": 0}]},
        [-3, 0, 0.5, 7],
        [None, "0"],
    ),
    (
        "one-of-overlap",
        {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "^a"}]},
        ["", "bcd", "abcd"],
        ["abc", "a", "bcde", 1],
    ),
    (
        "contains",
        {
            "type": "array",
            "items": {"type": ["integer", "string"]},
            "contains": {"type": "integer"},
            "maxItems": 3,
        },
        [[1], ["a", 2], ["a", "b", 3], [1, 2, 3]],
        [[], ["a"], ["a", "b", "c"], [1, 2, 3, 4], [None]],
    ),
    (
        "unique-booleans",
        {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
        [[], [True], [False, True]],
        [[True, True], [False, True, False]],
    ),
]


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


@pytest.mark.parametrize("name,schema,valid,invalid", CASES, ids=[c[0] for c in CASES])
def test_applicator_walks_and_instances_agree_with_jsonschema(name, schema, valid, invalid):
    """'Each only where it reduces exactly': walks validate, jsonschema's verdicts are ours."""
    v = _validator(schema)
    compiled = compile_schema(schema)
    rng = random.Random(zlib.crc32(name.encode()))
    done = 0
    for _ in range(40):
        walk = random_walk(compiled, byte_domain(), rng, max_tokens=50, end_bias=0.6)
        assert not walk.dead_end, walk.data
        if walk.completed:
            done += 1
            value = json.loads(walk.data)
            assert v.is_valid(value), (walk.data, [e.message for e in v.iter_errors(value)])
    assert done > 0
    for value, text in zip(valid, layout_values(schema, valid)):
        assert v.is_valid(value), value
        assert accepts(compiled, text), text
    for value, text in zip(invalid, layout_values(schema, invalid)):
        assert not v.is_valid(value), value
        assert not accepts(compiled, text), text


@pytest.mark.parametrize("schema,pointer", [
    ({"not": {"type": "integer"}}, "/not"),
    ({"not": {"const": [1]}}, "/not"),
    ({"type": "number", "multipleOf": 0.1001}, "/multipleOf"),  # a numerator past MAX_MODULUS
    ({"not": {"multipleOf": 0.01}}, "/not"),
    ({"type": "integer", "multipleOf": 1001}, "/multipleOf"),  # past MAX_MODULUS (256)
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "/uniqueItems"),
    ({"if": {"type": "integer"}, "then": {"minimum": 1}}, "/if"),
    ({"type": "array", "contains": {"type": "integer"}, "maxContains": 2}, "/maxContains"),
])
def test_inexact_forms_are_refused(schema, pointer):
    """'Each only where it reduces exactly; otherwise rejected with pointer'."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer, info.value.message
