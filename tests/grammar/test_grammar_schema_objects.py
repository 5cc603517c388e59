"""patternProperties, propertyNames, min/maxProperties, required names outside properties,
dependencies: random legal walks must validate with `jsonschema`; instances it rejects must be
refused; valid instances in the generation layout accepted. Unsupported forms name their pointer.
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

D4 = "http://json-schema.org/draft-04/schema#"

# (name, schema, valid values, invalid values)
CASES = [
    (
        "pattern-properties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "patternProperties": {"^x-": {"type": "string"}, "^n[0-9]$": {"type": "null"}},
            "additionalProperties": False,
        },
        [{}, {"a": 1}, {"x-q": "s"}, {"a": 2, "x-": "", "n1": None}],
        [{"x-q": 1}, {"n10": None}, {"b": 1}, {"n1": 0}],
    ),
    (
        "pattern-meets-declared",
        {
            "type": "object",
            "properties": {"x-a": {"maxLength": 2}},
            "patternProperties": {"^x-": {"type": "string"}},
        },
        [{"x-a": "ab"}, {"x-b": "long string"}, {"other": [1]}],
        [{"x-a": 3}, {"x-a": "abc"}, {"x-b": 1}],
    ),
    (
        "property-names",
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3},
            "additionalProperties": {"type": "boolean"},
        },
        [{}, {"abc": True}, {"a": False, "zz": True}],
        [{"abcd": True}, {"A": True}, {"a": 1}],
    ),
    (
        "property-names-enum",
        {
            "type": "object",
            "properties": {"k": {"type": "integer"}},
            "propertyNames": {"enum": ["k", "m"]},
        },
        [{"k": 1}, {"m": "x"}, {"k": 2, "m": None}],
        [{"n": 1}, {"k": "s"}],
    ),
    (
        "min-max-properties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["b"],
            "minProperties": 2,
            "maxProperties": 3,
        },
        [{"a": 1, "b": 2}, {"b": 1, "c": None}, {"a": 1, "b": 2, "c": 3}],
        [{"b": 1}, {"a": 1, "b": 2, "c": 3, "d": 4}, {"a": 1}],
    ),
    (
        "max-properties-closed",
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "maxProperties": 1,
            "additionalProperties": False,
        },
        [{}, {"a": 1}, {"c": []}],
        [{"a": 1, "b": 2}, {"d": 1}],
    ),
    (
        "required-undeclared",
        {"type": "object", "required": ["id"], "additionalProperties": {"type": "string"}},
        [{"id": "x"}, {"id": "x", "y": "z"}],
        [{}, {"id": 1}, {"y": "z"}],
    ),
    (
        "draft4-pattern",
        {
            "$schema": D4,
            "type": "object",
            "patternProperties": {
                "^[0-9]+$": {"type": "integer", "minimum": 0, "exclusiveMinimum": True}
            },
        },
        [{"1": 1}, {"12": 3, "a": "b"}],
        [{"1": 0}, {"7": "x"}],
    ),
]


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


@pytest.mark.parametrize("name,schema,valid,invalid", CASES, ids=[c[0] for c in CASES])
def test_object_walks_and_instances_agree_with_jsonschema(name, schema, valid, invalid):
    """'Each only where it reduces exactly': every completed walk validates, every instance
    jsonschema rejects is refused, every valid one (in the generation layout) is accepted."""
    v = _validator(schema)
    compiled = compile_schema(schema)
    rng = random.Random(zlib.crc32(name.encode()))
    done = 0
    for _ in range(40):
        walk = random_walk(compiled, byte_domain(), rng, max_tokens=60, end_bias=0.6)
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
        assert not accepts(compiled, json.dumps(value)), value


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "object", "patternProperties": {"^a": {"type": "string"}, "b$": {"type": "integer"}}},
     "/patternProperties/b$"),
    ({"type": "object", "propertyNames": {"anyOf": [{"maxLength": 1}, {"type": "integer"}]},
      "patternProperties": {"x": {}}}, None),
])
def test_overlapping_patterns_are_refused(schema, pointer):
    """'patternProperties when the patterns and the declared names are disjoint or reducible':
    overlapping patterns (on undeclared names) are UnsupportedSchema at the later pattern."""
    if pointer is None:
        check_schema(schema)  # propertyNames of a string branch or non-strings reduces to strings
        return
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer
