"""Complements of arrays by `items` / `contains`, and of objects by a finite set of names outside
`propertyNames`, each compared with `jsonschema` on adversarial values and random walks.

- an array violates `items: X` exactly when some item is outside X (`contains: not X`), and
  `contains: C` exactly when every item is outside C (`items: not C`);
- an object violates `propertyNames: N` where the strings outside N are a finite set L exactly
  when it has some name of L (`required: [l]` for one l in L);
- oneOf branch i minus branch j where i's objects have finitely many names W (closed, or a
  finite propertyNames): j's undeclared names are then one of W, so "an undeclared name with a
  value outside additionalProperties" is a finite union of required names.

Design document: "oneOf must prove its branches exclusive ... A composition that cannot be proved
is unsupported"; a complement without an exact reduction keeps its typed error at its pointer.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import layout_values
from tests.grammar.test_grammar_schema_soundness import assert_refused, compiled
from tests.support.common import byte_domain

SCALARS = [None, True, False, 0, 1, 2, -3, 1.5, "", "a", "b", "c", "ab", "0", "a4", "1"]


def _values(rng: random.Random) -> list:
    """Scalars, arrays mixing them (empty, one item, several), objects over the names the
    schemas below mention."""
    out: list = list(SCALARS)
    out += [[], [[]], [{}], [[1], "a"]]
    for _ in range(120):
        out.append([rng.choice(SCALARS) for _ in range(rng.randint(1, 4))])
    names = ["a", "b", "c", "0", "1", "a4", "x", "ab", "kind", "kind"]
    out += [{}]
    for _ in range(80):
        out.append({n: rng.choice(SCALARS) for n in rng.sample(names, rng.randint(1, 3))})
    return out


def _walks(schema, rng: random.Random, n: int = 30) -> list:
    grammar, out = compiled(schema), []
    for _ in range(n):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=40, end_bias=0.5)
        assert not walk.dead_end, (schema, walk.data)
        if walk.completed:
            out.append(json.loads(walk.data))
    return out


def assert_same_language(schema) -> None:
    """Accepted (in the generation layout) exactly when Draft202012Validator accepts; every
    random walk is valid."""
    rng = random.Random(27)
    check = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    grammar = compiled(schema)
    values = _values(rng) + _walks(schema, rng)
    assert any(check.is_valid(v) for v in values) and not all(check.is_valid(v) for v in values)
    for value, text in zip(values, layout_values(schema, values)):
        assert accepts(grammar, text) == check.is_valid(value), (schema, value)


@pytest.mark.parametrize("schema", [
    {"not": {"type": "array", "items": {"type": "string"}}},
    {"not": {"items": {"enum": ["a", "b"]}, "maxItems": 2}},
    {"type": "array", "not": {"items": {"type": ["string", "null"]}, "minItems": 1}},
    {"not": {"type": "array", "contains": {"const": 1}}},
    {"not": {"contains": {"type": "string"}, "items": {"type": ["string", "boolean"]}}},
    {"not": {"items": {"not": {"type": "string"}}}},
    # oneOf shapes of the corpus: arrays whose item schemas overlap (the empty array is in both)
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
               {"type": "string", "enum": ["a", "b"]},
               {"type": "array", "items": {"type": "string", "enum": ["a", "c"]}}]},
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}},
               {"type": "array", "items": {"type": "string"}}]},
    {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "array", "maxItems": 2}]},
    # every value but arrays of strings (they are non-objects, so in both branches)
    {"oneOf": [{"required": ["a"]}, {"type": "array", "items": {"type": "string"}}]},
])
def test_array_complements_match_jsonschema(schema):
    assert_same_language(schema)


@pytest.mark.parametrize("schema", [
    {"not": {"propertyNames": {"not": {"const": "a4"}}}},
    {"type": "object", "not": {"propertyNames": {"not": {"const": "0"}}},
     "patternProperties": {"\\d": {"type": "boolean"}}},
    {"type": "object", "not": {"propertyNames": {"not": {"enum": ["a", "b"]}}},
     "maxProperties": 2},
    {"type": "object", "maxProperties": 2, "not": {"anyOf": [
        {"propertyNames": {"not": {"enum": ["0", "1"]}}},
        {"propertyNames": {"not": {"enum": ["a", "1"]}}}]}},
])
def test_property_name_complements_match_jsonschema(schema):
    assert_same_language(schema)


def _closed(**props) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": props}


STR = {"type": "string"}


@pytest.mark.parametrize("schema", [
    # closed objects that share only {} (jsonschema: {} is in both, so in neither)
    {"oneOf": [_closed(a=STR), _closed(b=STR)]},
    {"oneOf": [STR, _closed(a=STR), _closed(b=STR)]},
    {"oneOf": [_closed(a={"type": "string", "maxLength": 1}), _closed(a=STR, b={"const": True})]},
    {"oneOf": [_closed(a=STR, b=STR), {"type": "object", "required": ["a"],
                                       "additionalProperties": False,
                                       "properties": {"a": STR, "c": {"enum": [0, 1]}}}]},
    # a finite propertyNames and an additionalProperties schema on the other side
    {"oneOf": [_closed(a=STR, c={}),
               {"type": "object", "propertyNames": {"enum": ["a", "b"]},
                "additionalProperties": {"type": "boolean"}}]},
])
def test_closed_one_of_matches_jsonschema(schema):
    assert_same_language(schema)


@pytest.mark.parametrize("schema,pointer", [
    # an open branch minus a closed one needs "some name outside a finite set": infinitely many
    ({"oneOf": [_closed(a=STR, b=STR), {"type": "object", "required": ["a"]}]}, "/oneOf"),
    ({"oneOf": [_closed(a=STR), {"type": "object", "additionalProperties": STR}]}, "/oneOf"),
    # the names outside propertyNames are infinite (every string containing "a"): no union of
    # required names covers them
    ({"not": {"propertyNames": {"not": {"pattern": "a"}}}}, "/not"),
    ({"not": {"propertyNames": {"maxLength": 2}}}, "/not"),
    # positional items and uniqueItems have no complement read here
    ({"not": {"prefixItems": [{"type": "string"}]}}, "/not"),
    ({"not": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}}, "/not"),
    # the complement of the items is not exact (integers outside a multiple)
    ({"not": {"type": "array", "items": {"type": "integer"}}}, "/not"),
])
def test_inexact_complements_stay_refused(schema, pointer):
    assert_refused(schema, pointer)


# ---- a oneOf alone in an allOf item, read with the assertions beside the allOf ------------------

# integer members: no exact complement, so only the required discriminator tells them apart
KIND = {"oneOf": [{"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}},
                  {"description": "the b form", "properties": {"kind": {"const": "b"}}}]}


@pytest.mark.parametrize("schema", [
    # the discriminator is required by the parent, not by the branches ({} is in both alone)
    {"type": "object", "required": ["kind"], "allOf": [KIND]},
    {"type": "object", "required": ["kind"], "allOf": [{"properties": {"x": {"maximum": 1}}},
                                                       {"description": "by kind", **KIND}]},
    # an anyOf of the parent comes after the allOf and still intersects
    {"required": ["kind"], "allOf": [KIND], "anyOf": [{"required": ["x"]}, {"maxProperties": 1}]},
])
def test_one_of_in_all_of_sees_the_parent(schema):
    """Design document: "allOf intersects ..."; "oneOf proves exclusivity by ... the finite
    values of a common required discriminator". node and oneOf(X) is exactly one of (node and
    X_i) for each value of node."""
    assert_same_language(schema)


def test_one_of_in_all_of_without_the_parent_stays_refused():
    # nothing beside the allOf requires the discriminator: {} satisfies both branches' open
    # objects, and the complement of an open object's undeclared names is not finite
    assert_refused({"allOf": [{"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}},
                                         {"type": "object", "additionalProperties": STR}]}]},
                   "/allOf/0/oneOf")
