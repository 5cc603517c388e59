"""A subschema's own `$schema` switches the dialect for its subtree, as `jsonschema` reads it.

`jsonschema` (the independent base) validates a subschema that declares `$schema` with that
dialect's validator, and keeps it below the subschema and through references followed from there.
The reader does the same; where one definition would be read in two dialects, or a subtree of
another dialect than the document's declares identifiers (the document's resources are indexed by
the root's dialect), the schema is refused at the pointer: "a schema is enforced completely or
rejected".
"""

from __future__ import annotations

import json
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts
from services.grammar.schema import check_schema, schema_to_grammar
from shared.errors import UnsupportedSchema
from tests.support.common import byte_domain

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _valid(schema: dict, value) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value)


CASES = [
    # draft-04 boolean exclusiveMaximum inside a 2020-12 document, reached by $ref and directly.
    (
        {
            "type": "object",
            "properties": {
                "a": {"$ref": "#/definitions/n"},
                "b": {
                    "$schema": D4,
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 3,
                    "exclusiveMaximum": True,
                },
            },
            "definitions": {
                "n": {
                    "$schema": D4,
                    "type": "number",
                    "maximum": 2,
                    "exclusiveMaximum": True,
                    "minimum": 0,
                }
            },
            "additionalProperties": False,
        },
        [{"a": 1}, {"a": 2}, {"a": 1.5}, {"b": 2}, {"b": 3}, {"b": -1}, {"a": 0, "b": 0}, {"c": 1}],
    ),
    # draft-07 document with a 2020-12 subtree: prefixItems there, items arrays outside.
    (
        {
            "$schema": D7,
            "type": "object",
            "properties": {
                "t": {"type": "array", "items": [{"type": "string"}], "additionalItems": False},
                "p": {
                    "$schema": D2020,
                    "type": "array",
                    "prefixItems": [{"type": "integer"}],
                    "items": {"type": "boolean"},
                },
            },
        },
        [
            {"t": ["x"]},
            {"t": ["x", 1]},
            {"p": [1, True]},
            {"p": ["x"]},
            {"p": [1, 2]},
            {"t": [], "p": []},
        ],
    ),
    # draft-04 subtree: a $ref sibling there may only annotate (an assertion is refused, see
    # test_grammar_schema_dialects); the 2020-12 document outside it applies its siblings.
    (
        {
            "properties": {
                "v": {
                    "$schema": D4,
                    "type": "object",
                    "properties": {"w": {"$ref": "#/$defs/s4", "description": "d"}},
                },
                "u": {"$ref": "#/$defs/s", "maxLength": 1},
            },
            "$defs": {"s": {"type": "string"}, "s4": {"type": "string"}},
        },
        [{"v": {"w": "abc"}}, {"u": "abc"}, {"u": "a"}, {"v": {"w": 1}}],
    ),
]


@pytest.mark.parametrize("schema,values", CASES, ids=range(len(CASES)))
def test_nested_dialect_agrees_with_jsonschema(schema, values):
    """Every value is accepted exactly when jsonschema accepts it (checked so that each case has
    both outcomes, and a difference between the dialects decides some value)."""
    grammar = _compiler().compile_grammar(schema_to_grammar(schema))
    outcomes = set()
    for value in values:
        expected = _valid(schema, value)
        outcomes.add(expected)
        assert accepts(grammar, json.dumps(value, separators=(",", ":"))) == expected, value
    assert outcomes == {True, False}


def test_a_definition_reached_in_two_dialects_is_refused():
    """jsonschema reads a definition in the dialect of the path that reaches it: one definition
    reached from a draft-04 subtree and from the 2020-12 document would need two readings."""
    schema = {"properties": {"x": {"$ref": "#/$defs/c"},
                             "y": {"$schema": D4, "additionalProperties": {"$ref": "#/$defs/c"}}},
              "$defs": {"c": {"type": "string"}}}
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == "/properties/y/additionalProperties/$ref"


@pytest.mark.parametrize(
    "schema,pointer",
    [
        (
            {"properties": {"a": {"$schema": D4, "id": "http://x.org/a", "type": "string"}}},
            "/properties/a/id",
        ),
        ({"properties": {"a": {"$schema": D4, "items": {"$id": "b"}}}}, "/properties/a/items/$id"),
        (
            {"properties": {"a": {"$schema": "http://json-schema.org/draft-03/schema#"}}},
            "/properties/a/$schema",
        ),
        ({"properties": {"a": {"$schema": D4, "prefixItems": [{}]}}}, "/properties/a/prefixItems"),
    ],
)
def test_nested_dialect_refusals_name_their_pointer(schema, pointer):
    """Identifiers inside a subtree of another dialect, unknown nested dialects, and keywords the
    nested dialect does not have are UnsupportedSchema at their pointer."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer, info.value.message
