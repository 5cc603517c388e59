"""JSON Schema grammars against the `jsonschema` library as the independent validator.

Random legal walks must produce instances jsonschema accepts; instances jsonschema rejects must be
rejected by the compiled grammar; valid instances in declared property order must be accepted.
"""

from __future__ import annotations

import json
import random
import zlib
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import json_object_grammar, schema_to_grammar
from tests.support.common import byte_domain


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def compile_schema(schema) -> xgr.CompiledGrammar:
    return _compiler().compile_grammar(schema_to_grammar(schema))


def validator(schema):
    if isinstance(schema, dict) and "draft-07" in str(schema.get("$schema", "")):
        return jsonschema.Draft7Validator(schema)
    return jsonschema.Draft202012Validator(schema)


TREE = {"$defs": {"node": {"type": "object", "additionalProperties": False, "required": ["v"],
                           "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "kids": {"type": "array", "maxItems": 2,
                                                   "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}

# (name, schema, valid instances in generation layout, instances the schema rejects)
CASES = [
    ("empty", {}, ["1", '"x"', "null", '[1, {"a": []}]', '{"a":true}'], []),
    ("type-array", {"type": ["string", "null"]}, ['"a"', "null"], ["1", "true", "[]"]),
    (
        "object-open",
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        ["{}", '{"a": 1}', '{"a": 1, "zz": [1]}', '{"b": null}'],
        ['{"a": "x"}', "[]", '{"a": 1.5}'],
    ),
    (
        "object-closed",
        {
            "type": "object",
            "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
            "required": ["b"],
            "additionalProperties": False,
        },
        ['{"b": null}', '{"a": true, "b": null}'],
        ["{}", '{"a": true}', '{"b": null, "c": 1}'],
    ),
    (
        "object-extra-schema",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        },
        ['{"a": "x", "b": 2}', '{"ab": 3}'],
        ['{"b": "x"}', '{"a": 1}'],
    ),
    (
        "array-items",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": -3, "maximum": 3},
            "minItems": 1,
            "maxItems": 3,
        },
        ["[0]", "[-3, 3, 1]"],
        ["[]", "[4]", "[1,2,3,0]", "[1.5]"],
    ),
    (
        "prefix-items",
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
        ["[]", '["a"]', '["a", false]'],
        ["[1]", '["a", 1]', '["a", true, 1]'],
    ),
    (
        "prefix-tail",
        {"type": "array", "prefixItems": [{"const": 1}], "items": {"type": "null"}, "minItems": 2},
        ["[1, null]", "[1, null, null]"],
        ["[1]", "[2, null]", "[1, 2]"],
    ),
    (
        "draft7-items",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "array",
            "items": [{"type": "integer"}],
            "additionalItems": {"type": "string"},
        },
        ["[1]", '[1, "a", "b"]'],
        ['["a"]', "[1, 2]"],
    ),
    (
        "string-length",
        {"type": "string", "minLength": 2, "maxLength": 4},
        ['"ab"', '"éé"', '"a\\nb"', '"😀😀😀😀"'],
        ['"a"', '"abcde"', "1"],
    ),
    (
        "integer-range",
        {"type": "integer", "minimum": -17, "exclusiveMaximum": 105},
        ["-17", "0", "104", "99"],
        ["-18", "105", "1.5", "1000"],
    ),
    (
        "number-range",
        {"type": "number", "minimum": 0.1, "exclusiveMaximum": 2.5},
        ["0.1", "1", "2", "2.4999999999999", "0.25"],
        ["0.09", "2.5", "3", "-1"],
    ),
    ("number-any", {"type": "number"}, ["0", "-12.5", "3.25"], ['"1"', "true"]),
    (
        "enum",
        {"enum": ["a", 1, None, {"k": [1, 2]}, [True]]},
        ['"a"', "1", "null", '{"k": [1, 2]}', "[true]", '{ "k" : [ 1 , 2 ] }'],
        ['"b"', "2", '{"k": [1]}'],
    ),
    (
        "enum-filtered",
        {"type": "string", "enum": ["a", "bb", 3], "minLength": 2},
        ['"bb"'],
        ['"a"', "3"],
    ),
    ("const", {"const": {"x": 'q"\\'}}, ['{"x": "q\\"\\\\"}'], ['{"x": "q"}']),
    (
        "anyOf",
        {"anyOf": [{"type": "integer", "maximum": 0}, {"type": "string", "maxLength": 1}]},
        ["-4", '""', '"z"'],
        ["1", '"zz"'],
    ),
    ("oneOf-types", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, ["1", '"s"'], ["null"]),
    (
        "oneOf-discriminator",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["kind", "x"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
                    "required": ["kind"],
                },
            ]
        },
        ['{"kind": "a", "x": 1}', '{"kind": "b"}'],
        ['{"kind": "c"}', '{"kind": "a"}'],
    ),
    (
        "allOf",
        {
            "allOf": [
                {
                    "type": "object",
                    "properties": {"a": {"type": "number", "minimum": 0}},
                    "required": ["a"],
                },
                {
                    "properties": {"a": {"type": "integer", "maximum": 5}, "b": {"type": "null"}},
                    "additionalProperties": False,
                },
            ]
        },
        ['{"a": 0}', '{"a": 5, "b": null}'],
        ['{"a": 6}', '{"a": 1.5}', '{"a": 1, "c": 1}', "{}"],
    ),
    (
        "allOf-closed-not-reopened",
        {
            "allOf": [
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}},
                    "additionalProperties": False,
                },
                {"type": "object", "properties": {"b": {"type": "integer"}}},
            ]
        },
        ["{}", '{"a": 1}'],
        ['{"b": 1}'],
    ),
    (
        "recursion",
        TREE,
        ['{"v": 1}', '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}'],
        ['{"v": 10}', '{"kids": []}', '{"v": 1, "kids": [{}]}'],
    ),
    (
        "ref-sibling-2020",
        {"$defs": {"p": {"type": "integer"}}, "$ref": "#/$defs/p", "minimum": 2},
        ["2", "30"],
        ["1", '"a"'],
    ),
    (
        "annotations",
        {
            "title": "t",
            "description": "d",
            "default": 1,
            "examples": [1],
            "$comment": "c",
            "deprecated": True,
            "readOnly": True,
            "type": "boolean",
            "$id": "urn:x",
        },
        ["true"],
        ["1"],
    ),
]


@pytest.mark.parametrize("name,schema,valid,invalid", CASES, ids=[c[0] for c in CASES])
def test_walks_validate_and_instances_agree(name, schema, valid, invalid):
    """'A constrained output that completes normally belongs to the declared language or schema
    subset'; 'a schema is either enforced completely or rejected'."""
    v = validator(schema)
    compiled = compile_schema(schema)
    rng = random.Random(zlib.crc32(name.encode()))
    completed = 0
    for _ in range(24):
        if completed == 5:
            break
        walk = random_walk(compiled, byte_domain(), rng, max_tokens=60, end_bias=0.7)
        assert not walk.dead_end, walk.data
        if walk.completed:
            completed += 1
            instance = json.loads(walk.data.decode("utf-8"))
            assert v.is_valid(instance), (walk.data, list(v.iter_errors(instance)))
    assert completed > 0
    for text in valid:
        assert v.is_valid(json.loads(text)), text  # the fixture itself is right
        assert accepts(compiled, text), text
    for text in invalid:
        assert not v.is_valid(json.loads(text)), text
        assert not accepts(compiled, text), text


def test_whitespace_runs_at_most_32():
    """'JSON ... admits insignificant whitespace between tokens in runs of at most 32
    characters'."""
    compiled = compile_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    for n in (0, 1, 32):
        assert accepts(compiled, '{' + " \n\t\r"[n % 4] * n + '"a":1}')
    assert not accepts(compiled, '{' + " " * 33 + '"a":1}')


def test_missing_additional_properties_allows_extras():
    """'a missing additionalProperties is not turned into false because of the library's internal
    strict_mode'."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    compiled = compile_schema(schema)
    text = '{"a": 1, "other": {"x": [1, "y"]}, "more": null}'
    assert validator(schema).is_valid(json.loads(text))
    assert accepts(compiled, text)


def test_declared_names_never_generated_as_extras():
    """'declared fields generate in a fixed order': an extra key never repeats a declared name, so
    a closed property schema cannot be bypassed through the additional-property path."""
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}, "a\n": {"type": "null"}},
              "additionalProperties": {"type": "string"}}
    compiled = compile_schema(schema)
    assert accepts(compiled, '{"ab": 1, "a\\n": null, "a": "x", "abc": "y"}')
    assert not accepts(compiled, '{"ab": 1, "ab": "x"}')
    assert not accepts(compiled, '{"a\\n": "x"}')


def test_string_length_counts_code_points_and_escapes():
    """'Length counts decoded Unicode characters, independent of escaping; control characters,
    quotes and backslashes in JSON strings must be escaped legally'."""
    schema = {"type": "string", "minLength": 3, "maxLength": 3}
    v, compiled = validator(schema), compile_schema(schema)
    for text in ['"\\"\\\\\\n"', '"é😀x"', '"\\u001fab"', '"abc"', '"ab"', '"abcd"', '"\\ta"']:
        assert accepts(compiled, text) == v.is_valid(json.loads(text)), text
    assert not accepts(compiled, '"a\x01b"')  # raw control character is not JSON
    assert not accepts(compiled, b'"\xed\xa0\x80ab"')  # an encoded surrogate is not UTF-8


@pytest.mark.parametrize("bounds", [
    {"exclusiveMaximum": 0.5}, {"maximum": 0.1}, {"exclusiveMinimum": 0.1}, {"minimum": -0.3},
    {"exclusiveMaximum": 1}, {"exclusiveMinimum": -2.5, "exclusiveMaximum": -2.25},
])
def test_number_bounds_hold_after_binary64_parsing(bounds):
    """'A bounded number constrains both the generated decimal value and the value after protocol
    parsing and re-serialization'. Every accepted decimal near the bound must parse (float64) to a
    value jsonschema accepts."""
    schema = {"type": "number", **bounds}
    v, compiled = validator(schema), compile_schema(schema)
    bound = next(iter(bounds.values()))
    near = []
    for digits in range(1, 19):
        for delta in (-1, 0, 1):
            text = f"{bound:.{digits}f}"
            last = int(text[-1]) + delta
            if 0 <= last <= 9:
                near.append(text[:-1] + str(last))
    near += [repr(bound), repr(float(bound)), "0.49999999999999999", "0.5000000000000001",
             "0.09999999999999999", "0.10000000000000001", "0.99999999999999999"]
    accepted = 0
    for text in near:
        if accepts(compiled, text):
            accepted += 1
            assert v.is_valid(json.loads(text)), text
    assert accepted > 0
    rng = random.Random(7)
    for _ in range(20):
        walk = random_walk(compiled, byte_domain(), rng, max_tokens=40, end_bias=0.3)
        if walk.completed:
            assert v.is_valid(json.loads(walk.data)), walk.data


def test_int64_range_of_integers():
    """'integer is signed 64-bit': the default integer language stops at the int64 limits."""
    compiled = compile_schema({"type": "integer"})
    assert accepts(compiled, str(2**63 - 1)) and accepts(compiled, str(-(2**63)))
    assert not accepts(compiled, str(2**63)) and not accepts(compiled, str(-(2**63) - 1))
    assert not accepts(compiled, "-0") and not accepts(compiled, "01")


def test_json_object_mode():
    """'json_object compiles to the root-object language, not an arbitrary JSON scalar'."""
    compiled = _compiler().compile_grammar(json_object_grammar())
    assert accepts(compiled, '{"a": [1, {"b": null}]}') and accepts(compiled, "{}")
    for text in ['1', '"x"', '[]', 'null']:
        assert not accepts(compiled, text)
    rng = random.Random(3)
    for _ in range(10):
        walk = random_walk(compiled, byte_domain(), rng, max_tokens=80, end_bias=0.6)
        if walk.completed:
            assert isinstance(json.loads(walk.data), dict)
