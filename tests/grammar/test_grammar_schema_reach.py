"""Reductions that widen which real-world schemas compile, each checked against `jsonschema`:
assertion keywords of another dialect (enforced, so values hold in both readings), `^`/`$` inside
a group that is a whole top-level alternative, a literal `]`, and the `regex`, draft-03 `color`
and `utc-millisec` formats.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.regex.parser import parse_regex
from services.grammar.schema import check_schema, layout_values
from services.grammar.schema.formats import REGEX
from shared.errors import UnsupportedSchema
from tests.grammar.test_grammar_schema_soundness import _walk as _dfa_walk
from tests.grammar.test_grammar_schema_soundness import compiled
from tests.support.common import byte_domain

D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"

VALUES = [None, True, 0, 1, 2, -1, 1.5, "", "a", "b", "ab", "a\n", [], [1], ["a"], [1, "a"],
          {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"a": "x", "c": None}, {"ab": 1},
          {"x": [], "a": {}}, {"b": "a", "a": "b"}]


def _validators(schema, *classes):
    return [cls(schema, format_checker=cls.FORMAT_CHECKER) for cls in classes]


def _walks(schema, n: int = 24) -> list:
    grammar, rng, out = compiled(schema), random.Random(11), []
    for _ in range(n):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=40, end_bias=0.5)
        assert not walk.dead_end, (schema, walk.data)
        if walk.completed:
            out.append(json.loads(walk.data))
    return out


def assert_both_readings(schema, defining, values=VALUES):
    """Accepted exactly when the declared dialect's validator and the defining dialect's both
    accept (a value checked in the generation layout); random walks hold in both."""
    declared = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    assert_accepted_as_all_check(schema, _validators(schema, declared, defining), values)


def assert_accepted_as_all_check(schema, checks, values) -> None:
    """`schema`'s grammar accepts each of `values` and of its own random walks (each checked in
    the generation layout) exactly when every validator of `checks` accepts it."""
    grammar = compiled(schema)
    values = list(values) + _walks(schema)
    for value, text in zip(values, layout_values(schema, values)):
        both = all(c.is_valid(value) for c in checks)
        assert accepts(grammar, text) == both, (schema, value)


# ---- assertion keywords of another dialect --------------------------------------------------

@pytest.mark.parametrize("schema,defining", [
    ({"dependencies": {"a": ["b"]}}, jsonschema.Draft7Validator),
    ({"type": "object", "dependencies": {"a": {"required": ["c"]}, "b": ["a"]}},
     jsonschema.Draft7Validator),
    ({"$schema": D2019, "dependencies": {"a": ["b"]}}, jsonschema.Draft7Validator),
    ({"$schema": D4, "if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "array"}},
     jsonschema.Draft7Validator),
    ({"$schema": D6, "if": {"maximum": 1}, "then": {"type": "integer"}},
     jsonschema.Draft7Validator),
    ({"$schema": D4, "type": "object", "propertyNames": {"maxLength": 1}},
     jsonschema.Draft6Validator),
    ({"$schema": D4, "const": "a"}, jsonschema.Draft6Validator),
    ({"$schema": D4, "type": "array", "contains": {"type": "string"}}, jsonschema.Draft6Validator),
    ({"$schema": D7, "dependentRequired": {"a": ["b"]}}, jsonschema.Draft202012Validator),
    ({"$schema": D7, "dependentSchemas": {"b": {"required": ["a"]}}},
     jsonschema.Draft202012Validator),
    ({"properties": {"p": {"dependencies": {"a": ["b"]}}},
      "oneOf": [{"required": ["p"]}, {"type": "array"}]}, jsonschema.Draft7Validator),
    # a foreign keyword inside a foreign applicator's complemented condition: draft-04 ignores
    # the `if` whole, so enforcing it exactly is the intersection of the readings
    ({"$schema": D4, "type": "object", "if": {"properties": {"t": {"const": "a"}}},
      "then": {"required": ["x"]}}, jsonschema.Draft7Validator),
])
def test_foreign_assertions_hold_in_both_readings(schema, defining):
    """An assertion keyword of another dialect that only narrows the values is enforced as that
    dialect defines it: every generated value is valid for the declared dialect's validator
    (which ignores the keyword) and for the defining one's, and it is listed (`foreign:`)."""
    assert_both_readings(schema, defining)
    key = next(k for k in ("dependencies", "if", "propertyNames", "const", "contains",
                           "dependentRequired", "dependentSchemas") if k in json.dumps(schema))
    assert f"foreign:{key}" in check_schema(schema).annotations


@pytest.mark.parametrize("schema,defining", [
    ({"not": {"type": "object", "dependencies": {"b": ["a"]}}}, jsonschema.Draft7Validator),
    ({"$schema": "http://json-schema.org/draft-04/schema#",
      "not": {"type": "string", "const": "x"}}, jsonschema.Draft6Validator),
    ({"oneOf": [{"type": "object", "dependencies": {"b": ["a"]}}, {"required": ["a"]}]},
     jsonschema.Draft7Validator),
    ({"$defs": {"d": {"type": "object", "dependencies": {"b": ["a"]}}},
      "not": {"$ref": "#/$defs/d"}}, jsonschema.Draft7Validator),
])
def test_foreign_assertions_under_a_complement_take_the_declared_reading(schema, defining):
    """Under a complement the narrowing reading of a foreign keyword widens the values: the
    declared dialect ignores the keyword, so `{"not": {"type": "object", "dependencies": ...}}` in
    2020-12 rejects every object, while enforcing it would accept `{"b": "_"}`. So a complemented
    schema is read as the upper bound of the readings, the keyword left out (bounds.py): the
    values accepted are exactly those both validators accept; a definition reached in both
    bounds is read in each. What each reading says of that instance is checked too, so the case
    is a real one."""
    assert_both_readings(schema, defining, VALUES + [{"b": "_"}, {"b": 1, "a": 2}, "x", "y"])
    first = {"not": {"type": "object", "dependencies": {"b": ["a"]}}}
    assert not jsonschema.Draft202012Validator(first).is_valid({"b": "_"})
    assert jsonschema.Draft7Validator(first).is_valid({"b": "_"})


def test_a_keyword_in_both_polarities_generates_a_subset_of_both_readings():
    """A definition used both plainly and under a complement is read in each bound; the values
    generated hold in both readings ('only values every reading accepts are generated'), though
    not all of their intersection: `d or (object and not d)` is every object in each reading,
    but the lower bound of d enforces `dependencies` and the upper bound of `not d` is no object,
    so `{"b": 1}` (valid in both) is not generated."""
    schema = {"$defs": {"d": {"type": "object", "dependencies": {"b": ["a"]}}},
              "anyOf": [{"$ref": "#/$defs/d"}, {"not": {"$ref": "#/$defs/d"}, "type": "object"}]}
    checks = _validators(schema, jsonschema.Draft202012Validator, jsonschema.Draft7Validator)
    grammar = compiled(schema)
    values = VALUES + _walks(schema)
    for value, text in zip(values, layout_values(schema, values)):
        if accepts(grammar, text):
            assert all(c.is_valid(value) for c in checks), value
    assert all(c.is_valid({"b": 1}) for c in checks) and not accepts(grammar, '{"b":1}')


def test_additional_items_without_an_items_array_asserts_nothing_in_any_reading():
    """draft-07 6.4.2: without an items array additionalItems 'MUST be ignored'; 2020-12 does not
    have it: an annotation in both readings. Beside an items array (invalid in 2020-12) it stays
    refused, naming the dialects that have it."""
    schema = {"type": "array", "items": {"type": "string"}, "additionalItems": False}
    assert_both_readings(schema, jsonschema.Draft7Validator)
    assert "additionalItems" in check_schema(schema).annotations
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "array", "items": [{"type": "string"}], "additionalItems": False})
    assert info.value.pointer == "/additionalItems" and "declare that dialect" in info.value.message


@pytest.mark.parametrize("schema,pointer", [
    ({"$schema": D7, "prefixItems": [{"type": "string"}]}, "/prefixItems"),
    ({"$schema": D7, "type": "array", "contains": {}, "minContains": 2}, "/minContains"),
    ({"$schema": D7, "$recursiveRef": "#"}, "/$recursiveRef"),
])
def test_foreign_keywords_that_change_other_keywords_stay_refused(schema, pointer):
    """prefixItems changes what `items` means, min/maxContains what `contains` means: no reading
    enforces both, so they stay refused with their pointer."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer


# ---- patterns --------------------------------------------------------------------------------

STRINGS = ["", "a", "b", "ab", "ba", "a\n", "\na", "b\n", "xa", "ax", "[a]", "[x", "_ab", "$ab",
           "a]", "]", "]]", "[a-b]]", "a]]]", "ab]", "[[", "-", "é", "a b", "a b\n", "c\n", "c"]


def _ecma(pattern: str) -> re.Pattern:
    """ECMAScript's reading of these ASCII patterns in Python terms: `$` only at the very end,
    ASCII classes."""
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern), re.ASCII)


@pytest.mark.parametrize("pattern", [
    "(^a$)|(^b$)", "(?:^a)|b$", "^$|(^(?:\\S+\\s+){0,3}\\S+$)", "((^a$)|(^b))|c$",
    "(^[_\\$]?[a-z]\\w+$)|(^\\[.*\\]$)", "a]", "^[a-z]*[-]?[a-z]*]*$", "^]+$",
])
def test_group_anchors_and_literal_brackets_agree_with_jsonschema(pattern):
    """`(^a$)|(^b$)` searches for either alternative with its anchors ('^/$ ... at the ends of
    top-level alternatives'), and `]` outside a class is a literal in ECMAScript (Annex B) and in
    Python: the strings accepted are exactly those jsonschema's 2020-12 validator (Python's
    reading) and the ECMAScript reading both accept ('only strings both readings accept')."""
    schema = {"type": "string", "pattern": pattern}
    check, ecma = jsonschema.Draft202012Validator(schema), _ecma(pattern)
    grammar = compiled(schema)
    walks = _walks(schema)
    for s in STRINGS + walks:
        both = check.is_valid(s) and ecma.search(s) is not None
        assert accepts(grammar, json.dumps(s, ensure_ascii=False)) == both, (pattern, s)


@pytest.mark.parametrize("pattern", ["(^a$)+", "(^a)b", "(?:^a|b)$", "(?=^a)", "a{", "a}"])
def test_anchors_and_braces_elsewhere_stay_refused(pattern):
    """An anchor inside a repeated group or followed by more of its alternative, and a stray
    brace (whose reading differs between the dialects), stay refused at the pattern."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "string", "pattern": pattern})
    assert info.value.pointer == "/pattern"


# ---- formats ---------------------------------------------------------------------------------

REGEX_PROBES = ["", "a", "^a$", "a|b", "(a", "a)", "[a", "a]", "a{", "a{1,2}", "a**", "*a", "\\",
                "[b-a]", "(?<n>a)", "(?P<n>a)", "(?i)a", "a{2,1}", "^*", "\\-", "[\\-]", "[a-z]",
                "a+?", "(?:ab)+c{2,}", "\\d\\w\\s.", "$^", "a||b", "()", "\\/"]


def test_regex_format_generates_only_what_both_dialects_compile():
    """The `regex` format generates expressions `re.compile` (jsonschema's checker) accepts: random
    walks and the adversarial probes the grammar accepts all compile; the grammar rejects what
    the checker refuses; negation stays refused (the automaton is narrower than the checker)."""
    schema = {"type": "string", "format": "regex"}
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    grammar = compiled(schema)
    accepted = 0
    for s in REGEX_PROBES + _walks(schema, 60):
        if accepts(grammar, json.dumps(s, ensure_ascii=False)):
            accepted += 1
            assert check.is_valid(s), s
        elif not check.is_valid(s):
            continue
    assert accepted >= 10
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "string", "not": {"format": "regex"}})
    assert info.value.pointer == "/not/format"


def test_every_expression_of_the_regex_format_compiles():
    """Every string of the format's language (walks through its automaton) compiles with Python's
    `re` and parses in our ECMAScript and Python readings."""
    from services.grammar.regex import whole_tree
    from services.grammar.schema.automata import tree_dfa

    dfa, rng, seen = tree_dfa(whole_tree(REGEX)), random.Random(5), 0
    for _ in range(400):
        expr = _dfa_walk(dfa, rng)
        if expr is None:
            continue
        seen += 1
        re.compile(expr)
        parse_regex(expr)
        parse_regex(expr, python=True)
    assert seen > 100


def test_color_and_utc_millisec_hold_for_the_draft03_checker():
    """draft-03 color is checked by webcolors in jsonschema's draft-03 checker: our hex triplets
    and CSS 2.1 names are a subset; utc-millisec asserts nothing (any number) in every reading."""
    schema = {"type": "string", "format": "color"}
    check = jsonschema.Draft3Validator(schema,
                                  format_checker=jsonschema.Draft3Validator.FORMAT_CHECKER)
    grammar = compiled(schema)
    for s in ["red", "#abc", "#AbCdEf", "teal", "Red", "#abcd", "rgb(0,0,0)", "", "reds", "#ab"]:
        if accepts(grammar, json.dumps(s, ensure_ascii=False)):
            assert check.is_valid(s), s
    for s in _walks(schema):
        assert check.is_valid(s), s
    for s in ["red", "#abc", "#AbCdEf", "teal"]:
        assert accepts(grammar, json.dumps(s, ensure_ascii=False)), s
    for schema in ({"type": "number", "format": "utc-millisec"},
                   {"type": "string", "format": "utc-millisec"}):
        grammar = compiled(schema)
        values = [0, 1.5, -3, 1e3, "x", ""]
        for value, text in zip(values, layout_values(schema, values)):
            assert accepts(grammar, text) == jsonschema.Draft202012Validator(schema).is_valid(value)


# ---- references intersected while they are being defined -------------------------------------

RESOURCE = {"$ref": "#/$defs/resource", "$defs": {"resource": {
    "type": "object",
    "additionalProperties": {"minProperties": 1, "anyOf": [{"type": "string"},
                                                           {"$ref": "#/$defs/resource"}]}}}}
CONFIG = {"$ref": "#/$defs/config", "$defs": {
    "config": {"type": "object", "properties": {"t": {"type": "integer"},
                                                "inner": {"$ref": "#/$defs/inner"}}},
    "inner": {"allOf": [{"$ref": "#/$defs/config"},
                        {"properties": {"os": {"additionalProperties": {"$ref": "#/$defs/config"}}},
                         "required": ["t"]}]}}}


@pytest.mark.parametrize("schema,values", [
    (RESOURCE, [{}, {"a": "x"}, {"a": {}}, {"a": {"b": "y"}}, {"a": {"b": {}}}, {"a": 1},
                {"a": {"b": {"c": "z"}}}, {"a": ""}, {"a": {"b": 2}}]),
    (CONFIG, [{}, {"t": 1}, {"inner": {}}, {"inner": {"t": 1}}, {"inner": {"t": "x"}},
              {"inner": {"t": 1, "os": {"l": {"t": 2}}}}, {"inner": {"t": 1, "os": {"l": 3}}},
              {"inner": {"t": 1, "inner": {"t": 2}}}, {"inner": {"t": 1, "inner": {}}}]),
])
def test_a_reference_met_while_it_is_defined_is_met_once_it_is_read(schema, values):
    """'recursion stays a reference graph': an allOf/anyOf member that refers to the definition
    being read is intersected with the finished definition, as jsonschema's 2020-12 validator
    reads it (values in the generation layout, and random walks)."""
    check = jsonschema.Draft202012Validator(schema)
    grammar = compiled(schema)
    values = values + _walks(schema)
    for value, text in zip(values, layout_values(schema, values)):
        assert accepts(grammar, text) == check.is_valid(value), value
