"""Near-misses of assertion keywords, read as the assertion they resemble.

A keyword in no vocabulary of the dialect is an annotation for every validator; one within one
case change or one edit of an assertion keyword (`additonalProperties`, `minLenght`, `type:`:
`dialects.near_miss`) was meant as that assertion by its author. Ignoring it would be the looser
reading the design refuses; enforcing the assertion it resembles generates only values valid in
both readings, the declared one (which accepts every value whatever the annotation holds) and the
author's, as for the assertions of another dialect (`dialects.READ_IN_EVERY_DIALECT`). So it is
read under the resembled name, listed in the annotations as `near-miss:<name>=<keyword>`, and
treated as those keywords are under a complement (`Reader.check_foreign_complements`: there the
intersection of the readings needs it ignored, so it is refused).

A near-miss repeating the value of the keyword it resembles (`"type": "object", "type:": "object"`)
asserts nothing more in either reading. Still refused, at the misspelt name: a name that resembles
two keywords, a keyword the schema also spells correctly with another value, a value the resembled
keyword does not take (`"aditionalItems": "false"`), a keyword outside `ENFORCEABLE` (applicators
whose reading takes complements or that other keywords read: `not`, `if`, `oneOf`, `$ref`, ...),
and a keyword that would change how a sibling reads (`properites` beside `additionalProperties`
would admit the names it declares, which the declared reading refuses: wider, not narrower).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.grammar.schema.context import child
from services.grammar.schema.dialects import near_miss, one_edit

if TYPE_CHECKING:
    from services.grammar.schema.reader import Reader

_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _schema(v: Any) -> bool:
    return isinstance(v, (dict, bool))


def _type(v: Any) -> bool:
    names = [v] if isinstance(v, str) else v
    return isinstance(names, list) and bool(names) and all(n in _TYPES for n in names) and \
        len(set(names)) == len(names)


# The resembled keywords read here, each with the shape of value it takes: conjuncts that only
# narrow the values of the schema they stand in.
ENFORCEABLE = {
    "type": _type, "enum": lambda v: isinstance(v, list), "const": lambda v: True,
    "required": lambda v: isinstance(v, list) and bool(v) and all(isinstance(n, str) for n in v)
    and len(set(v)) == len(v),
    "minLength": _count, "maxLength": _count, "minItems": _count, "maxItems": _count,
    "minProperties": _count, "maxProperties": _count,
    "minimum": _number, "maximum": _number,
    "pattern": lambda v: isinstance(v, str), "format": lambda v: isinstance(v, str),
    "additionalProperties": _schema, "propertyNames": _schema,
    "properties": lambda v: isinstance(v, dict) and all(_schema(x) for x in v.values()),
    "items": _schema,
}
# keyword -> siblings whose reading it changes (present, they make the keyword widen them)
_READ_BY = {
    "properties": ("additionalProperties", "unevaluatedProperties"),
    "items": ("additionalItems", "unevaluatedItems"),
}


def _meant(r: "Reader", schema: dict) -> tuple[dict[str, str], list[str]]:
    """The near-misses of `schema` read as the keyword they resemble ({name: keyword}) and those
    repeating that keyword's own value (asserting nothing more)."""
    dialect = r.dialect
    renamed: dict[str, str] = {}
    same: list[str] = []  # near-misses that repeat the resembled keyword's own value
    for key in schema:
        if key in dialect.annotations or key in dialect.core or key in dialect.assertions:
            continue
        meant = near_miss(key, dialect)
        if meant is not None and meant in schema and schema[meant] == schema[key]:
            same.append(key)  # both readings assert the same: nothing to choose between
            continue
        if meant is None or meant not in ENFORCEABLE or meant in schema or \
                meant in renamed.values() or not ENFORCEABLE[meant](schema[key]):
            continue
        if any(s in schema for s in _READ_BY.get(meant, ())):
            continue
        if len([k for k in dialect.assertions if k.lower() == key.lower() or
                (len(k) >= 4 and one_edit(key, k))]) > 1:
            continue  # resembles two keywords: which one was meant is not known
        renamed[key] = meant
    return renamed, same


def read_as_meant(r: "Reader", schema: dict, pointer: str) -> dict:
    """`schema` with each enforceable near-miss renamed to the keyword it resembles (its pointer
    aliased, so errors name the source's key); `schema` itself where there is none. Other
    near-misses stay, for `Reader._classify` to refuse."""
    renamed, same = _meant(r, schema)
    for key in same:
        r.annotations.add(f"near-miss:{key}={near_miss(key, r.dialect)}")
    if not renamed and not same:
        return schema
    for key, meant in renamed.items():
        r.ctx.aliases[child(pointer, meant)] = child(pointer, key)
        r.annotations.add(f"near-miss:{key}={meant}")
        r.foreign.append(child(pointer, meant))
    return {renamed.get(k, k): v for k, v in schema.items() if k not in same}


def declared_only(r: "Reader", schema: dict, pointer: str) -> dict:
    """`schema` as its declared dialect reads it, for an upper bound of every reading
    (`Reader.upper`, under a complement): the keywords that only narrow in the reading that
    enforces them (another dialect's, READ_IN_EVERY_DIALECT; the near-misses read as meant; a
    format read as the one it resembles) are left out, as that dialect's validators ignore them.
    The near-misses that would widen stay, for `Reader._classify` to refuse."""
    from services.grammar.schema import formats
    from services.grammar.schema.dialects import ALL_ASSERTIONS, READ_IN_EVERY_DIALECT

    dialect = r.dialect
    renamed, same = _meant(r, schema)
    drop = set(renamed) | set(same)
    for key in schema:
        if key in READ_IN_EVERY_DIALECT and key in ALL_ASSERTIONS and \
                key not in dialect.assertions and key not in dialect.core:
            drop.add(key)
    name = schema.get("format")
    if isinstance(name, str) and name not in formats.KNOWN and \
            (formats.READ_AS.get(name) or formats.resembles(name)) in formats.KNOWN:
        drop.add("format")
    if not drop:
        return schema
    r.ignored.extend(child(pointer, k) for k in sorted(drop))
    return {k: v for k, v in schema.items() if k not in drop}
