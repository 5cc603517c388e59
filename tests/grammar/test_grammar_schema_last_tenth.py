"""Reductions of the corpus's last refusals, each checked against `jsonschema`: what generates
nothing is left out (a member, a union branch, a reference to no value), multipleOf up to 256,
pattern/format and length products up to 16,384 states (long character classes shared), and
patternProperties that overlap with the same schema.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import check_schema, layout_values, schema_to_ebnf
from services.grammar.schema.automata import MAX_PRODUCT_STATES, SHARE_UNITS_ABOVE
from shared.errors import UnsupportedSchema
from tests.grammar.test_grammar_schema_soundness import compiled
from tests.support.common import byte_domain


def _check(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _walks(schema, n: int = 24, tokens: int = 40) -> list:
    grammar, rng, out = compiled(schema), random.Random(5), []
    for _ in range(n):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=tokens, end_bias=0.5)
        assert not walk.dead_end, (schema, walk.data)
        if walk.completed:
            out.append(walk.data.decode("utf-8"))
    return out


def assert_sound(schema, valid=(), invalid=()) -> None:
    """Every random walk parses and is valid; `valid` values are accepted (in the generation
    layout), `invalid` ones are not."""
    check, grammar = _check(schema), compiled(schema)
    for text in _walks(schema):
        assert check.is_valid(json.loads(text)), (schema, text)
    for value, text in zip(valid, layout_values(schema, list(valid))):
        assert check.is_valid(value) and accepts(grammar, text), value
    for value, text in zip(invalid, layout_values(schema, list(invalid))):
        assert not check.is_valid(value) and not accepts(grammar, text), value


# ---- what generates nothing ------------------------------------------------------------------

DIGITS = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^\\d+$"}}}


def test_an_optional_member_that_generates_nothing_is_left_out():
    """`s` must match `^\\d+$` and the object must not hold a matching `s`: in the generated
    reading (strings both regex readings accept) no `s` is left, though Python's `\\d` still
    takes "٣" where ECMA's does not, so no emptiness proof holds for the validators. Was an
    'unsatisfiable' refusal of the whole schema (Github_hard o27348's oneOf); now the member is
    left out ('a union alternative whose strings intersect to nothing in the generated reading is
    left out at emission')."""
    schema = {"type": "object", "properties": {"a": {
        **DIGITS, "not": {**DIGITS, "required": ["s"]}}}}
    assert_sound(schema, valid=[{}, {"a": {}}, {"a": {"t": 1}}],
                 invalid=[{"a": {"s": "1"}}, {"a": {"s": "x"}}, {"a": 1}])
    assert not accepts(compiled(schema), '{"a":{"s":"\u0663"}}')


def test_a_union_branch_whose_required_member_generates_nothing_is_left_out():
    """Github_hard o27348's oneOf of two closed objects that overlap on `{"root": ...}`: branch 0
    minus branch 1 takes the union of branch 1's violations, one of which needs `root.size` a
    digit string that is not one: that object branch generates nothing and is left out, where
    the schema was refused as unsatisfiable."""
    part = {"type": "object", "required": ["size"],
            "properties": {"size": {"type": "string", "pattern": "^\\d+([KMGT]i?B|B)$"}}}
    schema = {"oneOf": [
        {"type": "object", "properties": {"root": part, "type": {"enum": ["none"]}},
         "required": ["root"], "additionalProperties": False},
        {"type": "object", "properties": {"boot": part, "root": part,
                                          "type": {"enum": ["msdos", "gpt"]}},
         "required": ["root"], "additionalProperties": False}]}
    assert_sound(schema, valid=[{"root": {"size": "1B"}, "type": "none"},
                                {"root": {"size": "2KiB"}, "type": "gpt"}],
                 invalid=[{"root": {"size": "1B"}}, {"root": {"size": "x"}, "type": "gpt"}, {}])


@pytest.mark.parametrize("schema", [
    {"$defs": {"d": False}, "oneOf": [{"$ref": "#/$defs/d"}, {"type": "number"}]},
    {"$defs": {"d": {"const": "P1D"}}, "if": {"$ref": "#/$defs/d"},
     "then": {"type": "number", "maximum": 1}},
    {"$defs": {"d": {"allOf": [{"type": "integer"}, False]}},
     "anyOf": [{"$ref": "#/$defs/d"}, {"enum": ["#abc"]}]},
    {"$defs": {"d": False}, "type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}},
])
def test_a_reference_to_no_value_is_no_rule(schema):
    """A reference whose definition (or its meet) is no value was emitted as a rule of two NUL
    characters, reachable through a union or an optional member: the fuzzer's new `$defs` draws
    accepted the text NUL NUL (not JSON). A reference to no value is now no value itself."""
    grammar = compiled(schema)
    assert not accepts(grammar, "\x00\x00")
    assert "\\u0000" not in schema_to_ebnf(schema)
    for text in _walks(schema):
        assert _check(schema).is_valid(json.loads(text)), text


# ---- multipleOf and length products ----------------------------------------------------------

def test_multiple_of_256():
    """multipleOf up to 256 (Github_hard o69719's `key_size`): the integers divisible by it."""
    schema = {"type": "number", "minimum": 1024, "multipleOf": 256}
    assert_sound(schema, valid=[1024, 2048, 4096, 256 * 4099],
                 invalid=[1023, 1280.5, 768, 1025, 2047, "2048"])
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "integer", "multipleOf": 257})
    assert info.value.pointer == "/multipleOf"


@pytest.mark.parametrize("schema,valid,invalid", [
    ({"type": "string", "format": "email", "maxLength": 190},
     ["a@b.c", "taro.nihon@example.co.jp", "x" * 60 + "@" + "b" * 120 + ".jp"],
     ["x" * 70 + "@" + "b" * 120 + ".jp", 1]),
    ({"type": "string", "format": "email", "maxLength": 255},
     ["a@b.c", "x" * 64 + "@" + "b" * 186 + ".jp"], ["x" * 64 + "@" + "b" * 188 + ".jp"]),
    ({"type": "string", "maxLength": 128,
      "pattern": "^[^\\.\\s\\\\/:\\*\\?\"<>\\|\\x01-\\x1f]{1,32}"
                 "(\\.[^\\.\\s\\\\/:\\*\\?\"<>\\|\\x01-\\x1f]{1,32}){1,3}$"},
     ["Microsoft.Edge", "a.b.c.d", ".".join(["x" * 32] * 3) + "." + "y" * 29],
     ["a", "a..b", ".".join(["x" * 32] * 4), "a b.c"]),
])
def test_length_products_past_the_former_limit(schema, valid, invalid):
    """Products of a pattern or format automaton with a length counter of more than 4,096 and
    at most MAX_PRODUCT_STATES states compile (they were 'too complex'; the corpus's emails with
    maxLength 190 and 255, winget's package identifier); their long character classes are written
    once, so the grammars are 0.25 to 0.6 MB."""
    assert_sound(schema, valid, invalid)
    assert len(schema_to_ebnf(schema)) < 700_000


def test_smaller_products_keep_their_text_and_larger_ones_stay_refused():
    """A product of at most SHARE_UNITS_ABOVE states writes its classes inline, as before; one
    past MAX_PRODUCT_STATES is refused at its pointer."""
    small = schema_to_ebnf({"type": "string", "format": "email", "maxLength": 20})
    assert "_u0 ::=" not in small and SHARE_UNITS_ABOVE < MAX_PRODUCT_STATES
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "string", "maxLength": 500,
                      "pattern": "^(?:\\S+\\s+){0,49}\\S+$"})
    assert info.value.pointer == "/pattern" and "too complex" in info.value.message


# ---- patternProperties -------------------------------------------------------------------------

def test_overlapping_patterns_with_the_same_schema():
    """`.*` and `^_execute_browser_action$` with the same schema (Github_hard o58639): a name
    both match takes that schema either way, so the overlap is exact; different schemas on an
    overlap stay refused at the later pattern."""
    command = {"type": "object", "properties": {"key": {"type": "string"}},
               "additionalProperties": False}
    schema = {"type": "object", "$defs": {"c": command},
              "patternProperties": {".*": {"$ref": "#/$defs/c"},
                                    "^_execute_browser_action$": {"$ref": "#/$defs/c"}}}
    assert_sound(schema, valid=[{}, {"_execute_browser_action": {"key": "a"}}, {"x": {}}],
                 invalid=[{"_execute_browser_action": {"k": 1}}, {"x": 1}])
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "object", "patternProperties": {"a": {"type": "string"},
                                                              "b": {"type": "integer"}}})
    assert info.value.pointer == "/patternProperties/b"


def test_contains_beside_positional_items_is_refused_before_it_is_met():
    """`contains` met with `items` matched no string, so the array was taken as no value,
    though a prefix item may be the witness (`["a"]` is valid here): under `not` that accepted
    `["a"]` (found by the fuzzer through a near-miss there; main's code has it). The refusal
    of contains beside positional items now comes first."""
    inner = {"type": "array", "items": {"type": "number"}, "prefixItems": [{}],
             "contains": {"type": "string"}}
    assert jsonschema.Draft202012Validator(inner).is_valid(["a"])
    for schema in (inner, {"not": inner}):
        with pytest.raises(UnsupportedSchema) as info:
            check_schema(schema)
        assert "positional items" in info.value.message
