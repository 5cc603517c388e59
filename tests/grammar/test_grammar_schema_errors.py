"""JSON Schema rejection: every keyword outside the enforced subset is an UnsupportedSchema at its
exact RFC 6901 pointer; malformed schemas are InvalidSchema; strict tool roots must be closed
objects.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from services.grammar.schema import check_schema, reduce_tool_arguments, schema_to_grammar
from shared.errors import InvalidSchema, SchemaSource, UnsupportedSchema

D7 = "http://json-schema.org/draft-07/schema#"

UNSUPPORTED = [
    ({"type": "string", "format": "idn-email"}, "/format"),
    ({"type": "string", "format": "idn-hostname"}, "/format"),
    ({"type": "number", "multipleOf": 0.1001}, "/multipleOf"),
    (
        {"type": "object", "patternProperties": {"^a": {}, "b": {"type": "null"}}},
        "/patternProperties/b",
    ),
    ({"$schema": D7, "prefixItems": [{"type": "null"}]}, "/prefixItems"),
    ({"dependentSchemas": {"a": {"not": {"type": "integer"}}}}, "/dependentSchemas/a/not"),
    ({"if": {"minimum": 0, "type": "integer"}, "then": {"maximum": 1}}, "/if"),
    ({"properties": {"a": {"not": {"const": {"k": 1}}}}}, "/properties/a/not"),
    ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
    (
        {"type": "array", "contains": {"type": "integer"}, "prefixItems": [{"type": "string"}]},
        "/contains",
    ),
    ({"type": "array", "contains": {}, "minContains": 2}, "/minContains"),
    ({"type": "object", "properties": {"a": {}}, "required": ["a"], "maxProperties": 0}, ""),
    ({"unevaluatedProperties": False}, "/unevaluatedProperties"),
    ({"items": {"unevaluatedItems": False}}, "/items/unevaluatedItems"),
    # near-misses that cannot be read as the keyword they resemble (misspelt.py)
    ({"type": "string", "maxlength": "1"}, "/maxlength"),
    ({"type": "integer", "minimun": 1, "minimum": 2}, "/minimun"),
    ({"type": "object", "requried": "a"}, "/requried"),
    ({"not": {"type": "string", "properites": {}, "additionalProperties": False}},
     "/not/properites"),
    ({"type": "object", "properties": {"a": {"Type": "text"}}}, "/properties/a/Type"),
    # a nested resource is refused first ('nested $id is rejected')
    (
        {"$defs": {"a": {"$id": "http://x.org/a", "$ref": "b.json"}}, "$ref": "#/$defs/a"},
        "/$defs/a/$id",
    ),
    ({"$ref": "https://example.com/s.json"}, "/$ref"),
    ({"properties": {"a": {"$dynamicRef": "#x"}}}, "/properties/a/$dynamicRef"),
    (
        {"type": "object", "properties": {"a~b/c": {"type": "string", "format": "idn-email"}}},
        "/properties/a~0b~1c/format",
    ),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "/oneOf"),
    (
        {
            "oneOf": [
                # the arrays with a non-integer item would need the non-integral numbers
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "maxItems": 2},
            ]
        },
        "/oneOf",
    ),
    ({"enum": [1, 2**63]}, "/enum/1"),
    ({"const": -(2**63) - 1}, "/const"),
    ({"type": "integer", "minimum": 2**64}, "/minimum"),
    ({"type": "number", "minimum": float("inf")}, "/minimum"),
    ({"$schema": "http://json-schema.org/draft-03/schema#"}, "/$schema"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "array", "contains": {},
      "maxContains": 1}, "/maxContains"),
    ({"$schema": D7, "prefixItems": [{}]}, "/prefixItems"),
    ({"type": "integer", "minimum": 3, "maximum": 2}, ""),  # unsatisfiable: nothing to generate
    ({"allOf": [{"const": 1}, {"const": 2}]}, ""),
]


@pytest.mark.parametrize("schema,pointer", UNSUPPORTED, ids=[p or "root" for _, p in UNSUPPORTED])
def test_unsupported_keywords_name_their_pointer(schema, pointer):
    """'Unrecognized assertion keywords and compositions that would be ignored return an error
    located by JSON Pointer. There is no "compiled but only warned" relaxation.'"""
    if "$schema" not in schema or "draft-04" not in schema["$schema"]:
        meta = (
            jsonschema.Draft7Validator
            if schema.get("$schema") == D7
            else jsonschema.Draft202012Validator
        )
        meta.check_schema(schema)  # the schema is valid: the rejection is ours
    with pytest.raises(UnsupportedSchema) as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer, info.value.message
    assert info.value.source is SchemaSource.CONTENT
    with pytest.raises(UnsupportedSchema):
        check_schema(schema)


INVALID = [
    ({"type": "strin"}, "/type"),
    ({"type": "string", "minLength": -1}, "/minLength"),
    ({"type": "string", "maxLength": "3"}, "/maxLength"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "/properties/a/$ref"),
    ({"properties": []}, "/properties"),
    ({"required": "a"}, "/required"),
    ({"anyOf": []}, "/anyOf"),
    ({"items": {"minimum": "0"}}, "/items/minimum"),
    ({"properties": {"a": 3}}, "/properties/a"),
    ({"enum": "a"}, "/enum"),
    ({"type": "string", "pattern": "("}, "/pattern"),
]


@pytest.mark.parametrize("schema,pointer", INVALID, ids=[p for _, p in INVALID])
def test_malformed_schemas_are_invalid(schema, pointer):
    """'InvalidSchema / UnsupportedSchema with a JSON Pointer': a malformed keyword value or a
    dangling $ref is the schema's own error, not an unsupported feature."""
    with pytest.raises(InvalidSchema) as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer, info.value.message


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^a+$"},
    {"properties": {"s": {"type": "string", "pattern": "b", "minLength": 2, "maxLength": 4}}},
    {"allOf": [{"pattern": "a"}, {"pattern": "b"}], "type": "string"},
])
def test_pattern_and_length_hold_together(schema):
    """'XML excludes and schema pattern/length must hold together': a pattern is never dropped or
    allowed to override a length; through the string-automaton intersection both hold."""
    from services.grammar.engines.matching import accepts
    from tests.grammar.test_grammar_schema_walks import compile_schema

    compiled = compile_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    inner = lambda s: {"s": s} if "properties" in schema else s  # noqa: E731
    for s in ["a", "b", "ab", "ba", "bb", "abab", "ababa", "aaaa", "", "bab"]:
        value = inner(s)
        assert accepts(compiled, json.dumps(value)) == v.is_valid(value), value


def test_tool_arguments_errors_carry_the_tool():
    """'A tool's argument root must reduce to type=object ... it requires
    additionalProperties=false; a root that still reduces to const/enum/anyOf/oneOf is
    unsupported.'"""
    closed = {"$defs": {"args": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"], "additionalProperties": False}},
              "$ref": "#/$defs/args"}
    reduced = reduce_tool_arguments(closed, tool_index=0, tool_name="weather")
    assert [k for k, _ in reduced.root.properties] == ["city"]
    via_all_of = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                            {"additionalProperties": False}]}
    reduce_tool_arguments(via_all_of, tool_index=1, tool_name="t")
    for schema, pointer in [
        ({"type": "object"}, ""),
        ({"type": "object", "additionalProperties": True}, "/additionalProperties"),
        ({"anyOf": [{"type": "object", "additionalProperties": False}, {"type": "null"}]}, ""),
        ({"enum": [{}]}, ""),
        ({"type": "object", "format": "idn-email", "additionalProperties": False}, "/format"),
    ]:
        with pytest.raises(UnsupportedSchema) as info:
            reduce_tool_arguments(schema, tool_index=2, tool_name="f")
        err = info.value
        assert (err.pointer, err.source, err.tool_index, err.tool_name) == \
            (pointer, SchemaSource.TOOL_ARGUMENTS, 2, "f"), err.message


def test_limits_reject_beyond_depth():
    """'finite value recursion depth at most 256 ... Beyond them the schema is unsupported.'"""
    deep: dict = {"type": "integer"}
    for _ in range(300):
        deep = {"type": "array", "items": deep}
    with pytest.raises(UnsupportedSchema):
        check_schema(deep)


def test_error_round_trips_as_dict():
    """'Validation errors are typed ... and travel over gRPC as structured status details'."""
    from shared.errors import error_from_dict

    with pytest.raises(UnsupportedSchema) as info:
        schema_to_grammar(
            {"properties": {"a": {"format": "idn-email"}}},
            source=SchemaSource.TOOL_ARGUMENTS,
            tool_index=3,
            tool_name="mail",
        )
    back = error_from_dict(info.value.to_dict())
    assert isinstance(back, UnsupportedSchema)
    assert (back.pointer, back.tool_index, back.tool_name) == ("/properties/a/format", 3, "mail")
