"""Dialects by `$schema`, annotations and near-misses, `$id`/anchors: each checked against
`jsonschema`'s validator for the same dialect as the independent oracle.
"""

from __future__ import annotations

import jsonschema
import pytest

from services.grammar.engines.matching import accepts
from services.grammar.schema import check_schema, layout_values
from shared.errors import InvalidSchema, UnsupportedSchema
from tests.grammar.test_grammar_schema_walks import compile_schema

URIS = {
    "draft-04": ["http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-04/schema",
                 "https://json-schema.org/draft-04/schema#"],
    "draft-06": ["http://json-schema.org/draft-06/schema#", "https://json-schema.org/draft-06/schema"],
    "draft-07": ["http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-07/schema"],
    "2019-09": ["https://json-schema.org/draft/2019-09/schema", "http://json-schema.org/draft/2019-09/schema#"],
    "2020-12": ["https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#"],
}


def _agree(schema: dict, values: list) -> None:
    """The compiled grammar accepts each value (in the generation layout) exactly when the
    dialect's jsonschema validator does."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema)
    compiled = compile_schema(schema)
    for value, text in zip(values, layout_values(schema, values)):
        assert accepts(compiled, text) == v.is_valid(value), (schema.get("$schema"), value)


@pytest.mark.parametrize("name", list(URIS))
def test_every_spelling_of_each_dialect(name):
    """'Dialects by $schema (draft-04, -06, -07, 2019-09, 2020-12, with/without #, http/https)'."""
    for uri in URIS[name]:
        check_schema({"$schema": uri, "type": "string"})


def test_draft04_boolean_exclusive_bounds():
    """draft-04: exclusiveMinimum/exclusiveMaximum are booleans that make minimum/maximum
    exclusive; a number there is InvalidSchema, as is a boolean in draft-06 and later."""
    d4 = {"$schema": URIS["draft-04"][0], "type": "integer", "minimum": 1, "exclusiveMinimum": True,
          "maximum": 5, "exclusiveMaximum": False}
    _agree(d4, [0, 1, 2, 5, 6])
    with pytest.raises(InvalidSchema) as info:
        check_schema({**d4, "exclusiveMinimum": 1})
    assert info.value.pointer == "/exclusiveMinimum"
    with pytest.raises(InvalidSchema):
        check_schema({"$schema": URIS["draft-07"][0], "minimum": 1, "exclusiveMinimum": True})


def test_items_arrays_before_2020_and_prefix_items_after():
    """draft-04..2019-09: items may be an array (with additionalItems); 2020-12: prefixItems."""
    for uri in (URIS["draft-04"][0], URIS["draft-07"][0], URIS["2019-09"][0]):
        _agree({"$schema": uri, "type": "array", "items": [{"type": "string"}],
                "additionalItems": {"type": "integer"}}, [["a"], ["a", 1], [1], ["a", "b"]])
    _agree({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
           [["a"], ["a", 1], [1], ["a", "b"]])
    with pytest.raises(InvalidSchema):
        check_schema({"items": [{"type": "string"}]})


def test_ref_siblings_refused_before_2019():
    """'Draft-07 sibling assertions next to $ref are unsupported (use allOf for an explicit
    intersection)': draft-04..07 ignore them ('All other properties in a "$ref" object MUST be
    ignored'), so enforcing or dropping either would surprise; annotations there stay allowed.
    2019-09 and 2020-12 apply them next to the reference."""
    defs = {"s": {"type": "string"}}
    for uri in (URIS["draft-04"][0], URIS["draft-07"][0]):
        schema = {"$schema": uri, "definitions": defs,
                  "properties": {"p": {"$ref": "#/definitions/s", "maxLength": 2}}}
        with pytest.raises(UnsupportedSchema) as info:
            check_schema(schema)
        assert info.value.pointer == "/properties/p/maxLength"
        assert "allOf" in info.value.message
        described = {"$schema": uri, "definitions": defs,
                     "properties": {"p": {"$ref": "#/definitions/s", "description": "d"}}}
        _agree(described, [{"p": "abc"}, {"p": 1}])
        explicit = {"$schema": uri, "definitions": defs,
                    "properties": {"p": {"allOf": [{"$ref": "#/definitions/s"}, {"maxLength": 2}]}}}
        _agree(explicit, [{"p": "abc"}, {"p": "a"}, {"p": 1}])
    _agree({"$schema": URIS["2019-09"][0], "$defs": defs,
            "properties": {"p": {"$ref": "#/$defs/s", "maxLength": 2}}}, [{"p": "abc"}, {"p": "a"}])


def test_nested_ids_refused_anchors_kept():
    """'A root $id is only the document identity; nested $id is rejected' (draft-04 `id` too):
    at the identifier's pointer. Fragment-only identifiers open no resource: anchors (`#name`
    ids, `$anchor`) resolve."""
    d4 = {"$schema": URIS["draft-04"][0], "id": "http://x.org/root.json",
          "properties": {"a": {"$ref": "item.json"}, "b": {"$ref": "#/definitions/n"}},
          "definitions": {"item": {"id": "item.json", "type": "integer",
                                   "definitions": {"n": {"type": "null"}}},
                          "n": {"type": "string"}}}
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(d4)
    assert info.value.pointer == "/definitions/item/id"
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"properties": {"a": {"$id": "http://x.org/a.json", "type": "string"}}})
    assert info.value.pointer == "/properties/a/$id"
    generated = {"$schema": URIS["draft-07"][0], "$id": "http://x.org/root.json",
                 "properties": {"a": {"$id": "#/properties/a", "type": "integer"}}}
    _agree(generated, [{"a": 1}, {"a": "x"}])
    d7 = {"$schema": URIS["draft-07"][0], "properties": {"a": {"$ref": "#pos"}},
          "definitions": {"p": {"$id": "#pos", "type": "integer", "minimum": 0}}}
    _agree(d7, [{"a": 1}, {"a": -1}])
    d2020 = {"properties": {"a": {"$ref": "#pos"}},
             "$defs": {"p": {"$anchor": "pos", "type": "integer", "minimum": 0}}}
    _agree(d2020, [{"a": 1}, {"a": -1}])
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"properties": {"a": {"$ref": "http://elsewhere.org/s.json"}}})
    assert info.value.pointer == "/properties/a/$ref"


def test_keywords_in_no_vocabulary_are_annotations():
    """'Annotations: keywords in no vocabulary are annotations (accepted, their names listed in the
    compile result)'; vendor names are never near-misses."""
    schema = {"type": "object", "x-kubernetes-group-version-kind": [{"kind": "Pod"}], "self": {},
              "markdownDescription": "m", "_format": "date", "readonly": True, "example": 1,
              "properties": {"a": {"type": "string", "x-order": 1, "comment": "c"}}}
    reduced = check_schema(schema)
    assert set(reduced.annotations) == {
        "x-kubernetes-group-version-kind",
        "self",
        "markdownDescription",
        "_format",
        "readonly",
        "example",
        "x-order",
        "comment",
    }
    _agree(schema, [{"a": "s"}, {"a": 1}, {}])


@pytest.mark.parametrize("key,meant", [("maxlength", "maxLength"), ("minimun", "minimum"),
                                       ("requried", "required"), ("additionalproperties",
                                                                  "additionalProperties"),
                                       ("Type", "type"), ("patern", "pattern"), ("ENUM", "enum")])
def test_near_misses_of_assertions_are_refused(key, meant):
    """'near-misses of assertion keywords (within one edit or one case change)' that cannot be
    read as the keyword they resemble (here: a value it does not take) are 'UnsupportedSchema
    naming the keyword they resemble' (misspelt.py reads the others as meant)."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"properties": {"p": {key: "x" if key in ("maxlength", "minimun") else 1}}})
    assert info.value.pointer == f"/properties/p/{key}"
    assert repr(meant) in info.value.message


@pytest.mark.parametrize("schema,pointer", [
    ({"$schema": URIS["draft-04"][0], "type": "array", "contains": {}, "minContains": 2},
     "/minContains"),
    ({"$schema": URIS["draft-07"][0], "prefixItems": [{"type": "null"}]}, "/prefixItems"),
    ({"type": "array", "items": [{"type": "null"}], "additionalItems": False}, "/additionalItems"),
])
def test_assertions_of_other_dialects_are_refused(schema, pointer):
    """An assertion keyword of another dialect that changes how the declared dialect's own
    keywords read (the others are enforced in both readings: test_grammar_schema_reach) is
    refused with its pointer, naming the dialects that have it."""
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert info.value.pointer == pointer and "declare that dialect" in info.value.message


def test_no_schema_means_2020_12():
    """'No $schema = 2020-12': items arrays are invalid there, prefixItems applies."""
    _agree({"prefixItems": [{"type": "null"}], "items": False, "type": "array"},
           [[], [None], [None, None], [1]])
    with pytest.raises(InvalidSchema) as info:
        check_schema({"type": "array", "items": [{"type": "null"}]})
    assert info.value.pointer == "/items"
