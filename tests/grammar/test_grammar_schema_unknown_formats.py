"""Unknown `format` names are annotations (listed, never silent); defined formats we cannot reduce
and near-misses of known formats stay UnsupportedSchema at their pointer.

The rule implemented (services/grammar/schema/formats.py): no JSON Schema specification makes an
unknown format an assertion, and `jsonschema`'s format checker ignores such names, so the language
is the schema without the `format`; the independent base here is `jsonschema` with its format
checker deciding every value. The design rule that stays: "returning structured errors for
assertions the compiler cannot execute, instead of a warning and looser semantics" - a defined
format we do not reduce (regex, uri-template, idn-*, iri*, draft-03's color ...) is such an
assertion and is refused; so is a name one edit from a format, whose author meant the assertion.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import check_schema, schema_to_grammar
from shared.errors import UnsupportedSchema
from tests.support.common import byte_domain


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _valid(schema: dict, value) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value)


SCHEMAS = [
    {"type": "string", "format": "path", "minLength": 2, "maxLength": 4},
    {
        "type": "object",
        "properties": {
            "p": {"type": "string", "format": "html-selector"},
            "n": {"type": "integer", "format": "ports", "maximum": 9},
        },
        "required": ["p"],
        "additionalProperties": False,
    },
    {"$schema": "http://json-schema.org/draft-04/schema#", "format": "topic", "enum": ["a", 3]},
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": {"type": "string", "format": "semver-requirement", "pattern": "^[0-9]$"},
        "maxItems": 2,
    },
]
VALUES = ["", "ab", "abcd", "abcde", 3, "a", "b", None, {"p": "x"}, {"p": "x", "n": 9},
          {"p": "x", "n": 10}, {"n": 1}, {"p": 1}, [], ["1"], ["1", "2"], ["1", "2", "3"], ["x"]]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_unknown_format_is_listed_and_the_language_is_jsonschemas(schema):
    """An unknown format is listed as `format:<name>` and constrains nothing: every value is
    accepted exactly when jsonschema (with format checking) accepts it, and random walks give
    only values jsonschema accepts."""
    reduced = check_schema(schema)
    names = {a for a in reduced.annotations if a.startswith("format:")}
    assert names and all(a.split(":", 1)[1] in json.dumps(schema) for a in names)
    grammar = _compiler().compile_grammar(schema_to_grammar(schema))
    for value in VALUES:
        assert accepts(grammar, json.dumps(value, separators=(",", ":"))) == _valid(
            schema, value
        ), value
    rng = random.Random(7)
    done = 0
    for _ in range(40):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=60, end_bias=0.4)
        assert not walk.dead_end, walk.data
        if walk.completed:
            done += 1
            assert _valid(schema, json.loads(walk.data.decode("utf-8"))), walk.data
    assert done >= 5


@pytest.mark.parametrize(
    "name,meant",
    [
        ("url", "uri"),
        ("datetime", "date-time"),
        ("host-name", "hostname"),
        ("ip-address", "ipv4"),
        ("Date-Time", "date-time"),
        ("guid", "uuid"),
        ("emial", "email"),
        ("IPv4", "ipv4"),
        ("uri_reference", "uri-reference"),
    ],
)
def test_near_miss_of_a_format_is_enforced_as_meant(name, meant):
    """A name within one edit or one case change of a reduced format (and draft-03's renamed
    names) is enforced as that format, listed `format:<name>=<format>`. Under a complement the
    readings differ (the declared one ignores the name), so the complemented schema is read as
    the upper bound of the two, the format left out (bounds.py): `not` of the plain string,
    which is what both readings accept there."""
    schema = {"properties": {"a": {"type": "string", "format": name}}}
    reduced = check_schema(schema)
    assert f"format:{name}={meant}" in reduced.annotations
    assert reduced.root == check_schema(
        {"properties": {"a": {"type": "string", "format": meant}}}).root
    negated = check_schema({"properties": {"a": {"not": {"type": "string", "format": name}}}})
    assert negated.root == check_schema({"properties": {"a": {"not": {"type": "string"}}}}).root


def test_near_miss_of_a_format_not_reduced_is_refused_naming_it():
    """'a name within one edit or one case change of an assertion keyword is an UnsupportedSchema
    naming the keyword it resembles' - the same guard for format names we do not reduce."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"properties": {"a": {"type": "string", "format": "uri_template"}}})
    assert info.value.pointer == "/properties/a/format" and "'uri-template'" in info.value.message


@pytest.mark.parametrize("name", ["uri-template", "idn-email", "idn-hostname", "iri",
                                  "iri-reference", "style", "phone"])
def test_defined_formats_we_cannot_reduce_stay_unsupported(name):
    """A format a specification defines is an assertion validators check: without an exact
    reduction it is refused at its pointer, never read as an annotation."""
    schema = {"type": "object", "properties": {"v": {"format": name}}}
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == "/properties/v/format" and f"{name!r}" in info.value.message


def test_unknown_format_inside_not_and_one_of_keeps_jsonschemas_meaning():
    """`not: {format: unknown}` is `not: {}` (nothing); oneOf branches differing only by an
    unknown format are the same language, so exactly-one holds for no value: unsatisfiable."""
    schema = {"anyOf": [{"type": "integer"}, {"not": {"format": "path"}}]}
    grammar = _compiler().compile_grammar(schema_to_grammar(schema))
    for value in [1, "x", None]:
        assert accepts(grammar, json.dumps(value)) == _valid(schema, value), value
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"oneOf": [{"type": "string", "format": "path"}, {"type": "string"}]})
    assert info.value.pointer == "" and "unsatisfiable" in info.value.message
    assert not any(_valid({"oneOf": [{"type": "string", "format": "path"}, {"type": "string"}]}, v)
                   for v in ["", "a/b", 1, None])
