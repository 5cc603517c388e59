"""Near-misses of assertion keywords and formats, read as what they resemble (misspelt.py), and
exclusivity proofs as complements: each language checked against `jsonschema` in both readings,
the declared one (the near-miss is an annotation) and the author's (the keyword spelt right).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from services.grammar.engines.matching import accepts
from services.grammar.schema import check_schema, layout_values
from shared.errors import UnsupportedSchema
from tests.grammar.test_grammar_schema_reach import _walks, assert_accepted_as_all_check
from tests.grammar.test_grammar_schema_soundness import compiled

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"

VALUES = [None, True, 0, 1, -1, 7, 255, 256, -129, 2**32 - 1, 2**32, 1.5, "", "a", "ab", "abc",
          "abcd", "a\n", [], {}, {"a": 1}, {"a": "x"}, {"a": "xyz"}, {"a": "xyz", "b": 1},
          {"b": 1}, {"a": "xy"}, {"a": 5}, {"a": None},
          "2024-02-29T10:00:00Z", "2023-02-29T10:00:00Z", "2024-02-29T10:00:00Z\n",
          "2024-13-01T10:00:00Z", "2024-01-01t10:00:00z", "2024-01-01 10:00:00Z",
          "https://example.com/a?b#c", "example.com", "a b", "http://[::1]/", "x:", ":x",
          "example.com", "a-b.c", "-a.b", "a..b", "a_b", "a.", "1.2.3.4", "1.2.3.256"]


def _spelt(schema, renames):
    """The author's reading: each near-miss key renamed to the keyword it resembles."""
    if isinstance(schema, dict):
        return {renames.get(k, k): _spelt(v, renames) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_spelt(v, renames) for v in schema]
    return schema


def _checker(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def assert_both(schema, author, values=VALUES):
    """Accepted (in the generation layout) exactly when the declared validator accepts the
    schema as written and as the author meant it; random walks hold in both."""
    assert_accepted_as_all_check(schema, [_checker(schema), _checker(author)], values)


@pytest.mark.parametrize("schema,renames", [
    ({"type": "object", "additonalProperties": False, "properties": {"a": {"type": "string"}}},
     {"additonalProperties": "additionalProperties"}),
    ({"$schema": D4, "type": "object", "properties": {"a": {"type": "string", "minLenght": 3}}},
     {"minLenght": "minLength"}),
    ({"$schema": D7, "type": "object", "properites": {"a": {"type": "string"}},
      "require": ["a"]}, {"properites": "properties", "require": "required"}),
    ({"type:": "string", "maxlength": 2}, {"type:": "type", "maxlength": "maxLength"}),
    ({"type": "object", "properties": {"a": {"enume": ["x", "xyz"]}}}, {"enume": "enum"}),
    # nested: a near-miss inside a near-miss's subschema
    ({"type": "object", "additionalproperties": {"type": "string", "minLenght": 2}},
     {"additionalproperties": "additionalProperties", "minLenght": "minLength"}),
])
def test_near_miss_keywords_are_read_as_meant(schema, renames):
    """A near-miss of an assertion keyword (dialects.near_miss) is enforced as the keyword it
    resembles: every generated value is valid as written (the near-miss an annotation) and as
    meant, and it is listed `near-miss:<name>=<keyword>` (misspelt.py)."""
    assert_both(schema, _spelt(schema, renames))
    annotations = check_schema(schema).annotations
    for key, meant in renames.items():
        assert f"near-miss:{key}={meant}" in annotations


@pytest.mark.parametrize("schema,renames", [
    ({"type": "string", "format": "datetime"}, {"datetime": "date-time"}),
    ({"$schema": D4, "type": ["string", "null"], "format": "url"}, {"url": "uri"}),
    ({"type": "string", "formate": "date-time"}, {"formate": "format"}),
])
def test_near_miss_formats_are_enforced_as_meant(schema, renames):
    """A near-miss of a reduced format is enforced as that format (formats.py): valid both as an
    unknown format (any string) and as the format it resembles (jsonschema's checker)."""
    author = json.loads(json.dumps(schema))
    for key in ("format", "formate"):
        if key in author:
            author["format"] = renames.get(author.pop(key), schema[key])
    checks = [_checker(schema), _checker(author)]
    grammar, meant = compiled(schema), compiled(author)
    values = VALUES + _walks(schema)
    for value, text in zip(values, layout_values(schema, values)):
        # the language of the format spelt right (narrower than its checker where formats.py
        # says so), and so valid in both readings
        assert accepts(grammar, text) == accepts(meant, text), value
        assert not accepts(grammar, text) or all(c.is_valid(value) for c in checks), value


def test_draft03_host_name_is_a_hostname():
    """`host-name` in draft-04 (whose checker knows only `hostname`) is read as hostname: every
    generated value is one jsonschema's hostname checker (fqdn) accepts."""
    schema = {"$schema": D4, "type": "string", "format": "host-name"}
    author = {"$schema": D4, "type": "string", "format": "hostname"}
    grammar, meant, checker = compiled(schema), compiled(author), _checker(author)
    values = VALUES + _walks(schema)
    assert any(isinstance(v, str) and v for v in values[len(VALUES):])
    for value, text in zip(values, layout_values(schema, values)):
        assert accepts(grammar, text) == accepts(meant, text), value
        assert not accepts(grammar, text) or checker.is_valid(value), value
    assert "format:host-name=hostname" in check_schema(schema).annotations


@pytest.mark.parametrize("schema", [
    {"type": "integer", "format": "uint32"}, {"type": "integer", "format": "int8"},
    {"type": "number", "format": "uint8"},
])
def test_openapi_integer_widths(schema):
    """OpenAPI's registry widths are integer ranges (jsonschema checks none: both readings)."""
    lo, hi = {"uint32": (0, 2**32 - 1), "int8": (-128, 127), "uint8": (0, 255)}[schema["format"]]
    grammar = compiled(schema)
    for value, text in zip(VALUES, layout_values(schema, VALUES)):
        ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
        assert accepts(grammar, text) == ok, value


@pytest.mark.parametrize("schema,pointer", [
    # it would admit `a`, which additionalProperties false refuses as written
    ({"type": "object", "properites": {"a": {}}, "additionalProperties": False}, "/properites"),
    # not a value additionalItems takes
    ({"$schema": D4, "items": [{}], "aditionalItems": "false"}, "/aditionalItems"),
    # spelt right too, with another value
    ({"type": "object", "type:": "string"}, "/type:"),
    # an error inside a near-miss's subschema names the key as the source spells it
    ({"type": "object", "additonalProperties": {"type": "string", "pattern": "(?<=a)b"}},
     "/additonalProperties/pattern"),
])
def test_near_misses_that_stay_refused(schema, pointer):
    """Where reading the near-miss as meant would widen what the declared reading accepts, or
    its value does not fit, it is UnsupportedSchema at the source's pointer (misspelt.py)."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer, info.value.message


@pytest.mark.parametrize("schema,renames", [
    # as written `not` rejects every string; as meant, only those of 2 characters or more
    ({"not": {"type": "string", "minLenght": 2}}, {"minLenght": "minLength"}),
    ({"not": {"type": "string", "format": "datetime"}}, {}),
    ({"oneOf": [{"type": "string", "maxLenght": 1}, {"type": "integer"}]},
     {"maxLenght": "maxLength"}),
    ({"oneOf": [{"type": "string", "maxLenght": 1}, {"type": "string", "pattern": "^a"}]},
     {"maxLenght": "maxLength"}),
])
def test_near_misses_under_a_complement_hold_in_both_readings(schema, renames):
    """Under a complement the author's reading of a near-miss widens: the complemented schema
    is read as the upper bound of the readings there, the near-miss left out (bounds.py), so the
    values accepted are those the schema as written and as meant both accept."""
    author = _spelt(schema, renames)
    if "format" in json.dumps(schema):
        author = {"not": {"type": "string", "format": "date-time"}}
    assert_both(schema, author)


def test_exclusivity_proof_is_made_on_the_upper_bounds():
    """A proof that oneOf branches are disjoint must hold in the declared reading: draft-04
    ignores propertyNames, so branch 0 accepts every object there and `{"b": 1}` matches both
    branches (invalid), although enforcing propertyNames makes them disjoint. The proof is made
    on the upper bounds (propertyNames left out), which fails, and the complement form takes
    branch 0 enforced minus branch 1, branch 1 minus every object: accepted exactly where the
    draft-04 and the draft-06 validators both accept."""
    schema = {"$schema": D4, "type": "object",
              "oneOf": [{"propertyNames": {"const": "a"}}, {"required": ["b"]}]}
    assert not jsonschema.Draft4Validator(schema).is_valid({"b": 1})
    assert_both(schema, {**schema, "$schema": "http://json-schema.org/draft-06/schema#"})
    assert not accepts(compiled(schema), '{"b":1}')
