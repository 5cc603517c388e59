"""A fractional `multipleOf` as the integers both readings take (multiples.py): the decimal one
and `jsonschema`'s, which divides binary64 values."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from services.grammar.engines.matching import accepts
from services.grammar.schema import check_schema
from services.grammar.schema.nodes import IntegerType
from shared.errors import UnsupportedSchema
from tests.grammar.test_grammar_schema_reach import _walks
from tests.grammar.test_grammar_schema_soundness import compiled


@pytest.mark.parametrize("k", [0.1, 0.01, 0.25, 2.5, 0.3, 0.05])
def test_fractional_multiples_generate_integers_both_readings_take(k):
    """Every integer in the generated range that is a multiple of k as written is one for
    jsonschema too (its quotient is exactly integral), including at the range's ends; integers
    that are not multiples, and fractions (0.07 for 0.01, which jsonschema refuses), are not
    generated."""
    schema = {"type": "number", "multipleOf": k}
    node = check_schema(schema).root
    assert isinstance(node, IntegerType)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(5)
    ends = [node.lo, node.hi, node.lo + node.multiple, node.hi - node.multiple, 0]
    for n in ends + [rng.randrange(node.lo, node.hi) // node.multiple * node.multiple
                     for _ in range(20000)]:
        assert validator.is_valid(n), (k, n)
    grammar = compiled(schema)
    for v in [0, node.multiple, -node.multiple, node.hi, node.lo]:
        assert accepts(grammar, json.dumps(v)), v
    for v in [node.hi + node.multiple, 0.07, 0.5, 1.0, 1e2, k, "1"]:
        assert not accepts(grammar, json.dumps(v)), v
    if node.multiple > 1:
        assert not accepts(grammar, json.dumps(node.multiple + 1))
    for value in _walks(schema):
        assert validator.is_valid(value), value


def test_fractional_multiple_within_a_range_and_beside_other_types():
    """`multipleOf` constrains numbers only; with bounds, the multiples inside them."""
    schema = {"type": ["number", "string"], "minimum": -1, "maximum": 7.5, "multipleOf": 2.5}
    grammar, validator = compiled(schema), jsonschema.Draft202012Validator(schema)
    for v in [-5, 0, 5, 10, 7.5, 2.5, 3, "x", 1, -1]:
        if accepts(grammar, json.dumps(v)):
            assert validator.is_valid(v), v
    assert [v for v in (0, 5, "x") if accepts(grammar, json.dumps(v))] == [0, 5, "x"]


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "number", "multipleOf": 0.1001}, "/multipleOf"),  # a numerator past MAX_MODULUS
    ({"not": {"multipleOf": 0.5}}, "/not"),  # the integers are narrower: no exact complement
    ({"if": {"multipleOf": 0.5}, "then": {"type": "string"}}, "/if"),
])
def test_fractional_multiples_that_stay_refused(schema, pointer):
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer, info.value.message
