"""JSON Schema dialects (draft-04, -06, -07, 2019-09, 2020-12): their keywords and differences.

A dialect is chosen by the root `$schema` (http or https, with or without the empty fragment `#`);
no `$schema` means 2020-12. A subschema's own `$schema` switches the dialect for its subtree and
for the references followed from there, as `jsonschema` reads it (`Reader._nested_dialect`; a
definition reached in two dialects, or identifiers inside a subtree of another dialect than the
document's, are refused). What differs between them and what the reader does with it:

- draft-04: `id` (not `$id`) names a resource; `exclusiveMinimum`/`exclusiveMaximum` are booleans
  that make `minimum`/`maximum` exclusive; no `const`, `contains`, `propertyNames`, `if`.
- draft-06/07: `$id`; numeric exclusive bounds; draft-07 adds `if`/`then`/`else`.
- draft-04..07: `dependencies` (names or a schema per property); `items` may be an array with
  `additionalItems`; keywords next to `$ref` are ignored, as the specification says ("All other
  properties in a "$ref" object MUST be ignored", draft-07 Core 8.3) and every validator does;
  their names are listed with the annotations of the compile result.
- 2019-09: `$defs`, `dependentRequired`/`dependentSchemas`, `$anchor`; `items` arrays remain.
- 2020-12: `prefixItems` + `items` (a schema only).

A keyword in no vocabulary of the dialect is an annotation (the specification's rule), except a
near-miss of an assertion keyword (one case change, or one edit: insertion, deletion, substitution
or transposition of adjacent letters, for keywords of four or more letters), whose author meant
the assertion: it is read as that assertion where that only narrows (`misspelt.py`), else
refused; and except an assertion keyword of another dialect (e.g.
`const` in draft-04, `dependencies` in 2020-12), which the declared dialect would ignore: where it
only narrows the values and reads the same in every dialect that has it
(`dialects.READ_IN_EVERY_DIALECT`), it is enforced as defined, so that each generated value is
valid in both readings, and listed as `foreign:<keyword>`; the others (prefixItems, minContains,
$recursiveRef, additionalItems beside an items array, ...) change how the declared dialect's own
keywords read and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

# Assertion keywords of other dialects that only narrow the values and mean the same in every
# dialect that defines them: in a dialect without them they are enforced as defined, so that every
# generated value is valid in both readings (the declared dialect's, which ignores the keyword, and
# the author's evident one). The others (prefixItems, minContains, $recursiveRef, ...) change how
# the declared dialect's own keywords read, and stay refused.
READ_IN_EVERY_DIALECT = frozenset({
    "const", "contains", "propertyNames", "if", "then", "else", "dependencies",
    "dependentRequired", "dependentSchemas",
})

# Keywords that assert or apply subschemas, per dialect.
_D4_ASSERT = frozenset({
    "$ref", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "additionalItems", "items", "maxItems", "minItems", "uniqueItems",
    "maxProperties", "minProperties", "required", "additionalProperties", "properties",
    "patternProperties", "dependencies", "enum", "type", "allOf", "anyOf", "oneOf", "not", "format",
})
_D6_ASSERT = _D4_ASSERT | {"const", "contains", "propertyNames"}
_D7_ASSERT = _D6_ASSERT | {"if", "then", "else"}
_D2019_ASSERT = (_D7_ASSERT - {"dependencies"}) | {
    "dependentRequired", "dependentSchemas", "minContains", "maxContains", "unevaluatedItems",
    "unevaluatedProperties", "$recursiveRef"}
_D2020_ASSERT = (_D2019_ASSERT - {"$recursiveRef", "additionalItems"}) | {
    "prefixItems",
    "$dynamicRef",
}
ALL_ASSERTIONS = _D2020_ASSERT | _D2019_ASSERT | _D7_ASSERT | _D4_ASSERT | {"additionalItems"}

# Descriptive keywords of the meta-data and content vocabularies, and identifiers/containers.
_D4_ANNOT = frozenset({"title", "description", "default"})
_D6_ANNOT = _D4_ANNOT | {"examples"}
_D7_ANNOT = _D6_ANNOT | {"$comment", "readOnly", "writeOnly", "contentMediaType", "contentEncoding"}
_D2019_ANNOT = _D7_ANNOT | {"deprecated", "contentSchema"}


@dataclass(frozen=True)
class Dialect:
    """The keywords of one dialect and the rules in which dialects differ."""

    name: str
    assertions: frozenset[str]  # keywords that assert or apply subschemas
    annotations: frozenset[str]  # vocabulary keywords that never assert
    core: frozenset[str]  # identifiers, anchors, containers of definitions
    id_keyword: str  # "id" (draft-04) or "$id"
    boolean_exclusive: bool  # draft-04: exclusiveMinimum/Maximum are booleans
    items_array: bool  # items may be an array of positional schemas (with additionalItems)
    ref_overrides_siblings: bool  # draft-04..07: keywords next to $ref are ignored by the spec

    @property
    def keywords(self) -> frozenset[str]:
        return self.assertions | self.annotations | self.core


DRAFT_04 = Dialect("draft-04", _D4_ASSERT, _D4_ANNOT, frozenset({"$schema", "id", "definitions"}),
                   "id", True, True, True)
DRAFT_06 = Dialect("draft-06", _D6_ASSERT, _D6_ANNOT, frozenset({"$schema", "$id", "definitions"}),
                   "$id", False, True, True)
DRAFT_07 = Dialect("draft-07", _D7_ASSERT, _D7_ANNOT, frozenset({"$schema", "$id", "definitions"}),
                   "$id", False, True, True)
DRAFT_2019 = Dialect("2019-09", _D2019_ASSERT, _D2019_ANNOT, frozenset({
    "$schema", "$id", "$defs", "definitions", "$anchor", "$recursiveAnchor", "$vocabulary"}),
    "$id", False, True, False)
DRAFT_2020 = Dialect("2020-12", _D2020_ASSERT, _D2019_ANNOT, frozenset({
    "$schema", "$id", "$defs", "definitions", "$anchor", "$dynamicAnchor", "$vocabulary"}),
    "$id", False, False, False)

_BY_PATH = {
    "json-schema.org/draft-04/schema": DRAFT_04,
    "json-schema.org/draft-06/schema": DRAFT_06,
    "json-schema.org/draft-07/schema": DRAFT_07,
    "json-schema.org/draft/2019-09/schema": DRAFT_2019,
    "json-schema.org/draft/2020-12/schema": DRAFT_2020,
}


def dialect_of(uri: str) -> Dialect | None:
    """The dialect a `$schema` URI names (http/https, optional empty fragment), else None."""
    for scheme in ("https://", "http://"):
        if uri.startswith(scheme):
            path = uri[len(scheme):]
            if path.endswith("#"):
                path = path[:-1]
            return _BY_PATH.get(path)
    return None


def one_edit(a: str, b: str) -> bool:
    """True when a and b differ by exactly one insertion, deletion, substitution or transposition
    of two adjacent characters."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and \
            a[diff[1]] == b[diff[0]]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long[i]:
        i += 1
    return short[i:] == long[i + 1:]


def _vendor(name: str) -> bool:
    """Extension names by convention (`x-...`, `_...`, `@...`) are never near-misses."""
    return name.startswith(("x-", "x_", "_", "@"))


def near_miss(name: str, dialect: Dialect) -> str | None:
    """The assertion keyword `name` resembles (see the module docstring), or None."""
    if _vendor(name):
        return None
    for kw in sorted(dialect.assertions):
        if name.lower() == kw.lower() or (len(kw) >= 4 and one_edit(name, kw)):
            return kw
    return None


def foreign_dialects(name: str) -> list[str]:
    """The dialects in which `name` is an assertion keyword."""
    return [
        d.name
        for d in (DRAFT_04, DRAFT_06, DRAFT_07, DRAFT_2019, DRAFT_2020)
        if name in d.assertions
    ]
