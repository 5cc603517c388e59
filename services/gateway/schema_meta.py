"""Is this a JSON Schema at all? The meta-schema check of a non-strict tool's parameters.

A non-strict tool's argument values are not enforced (design document, section 4: "The non-strict
base argument language allows any order and any representable argument name"), so its schema never
reaches the schema compiler; it must still be a valid JSON Schema (`{"type": "objekt"}` is an
`InvalidSchema` at `/type`, as OpenAI answers). This checks what the 2020-12 and draft-07
meta-schemas assert about each keyword's value, iteratively (no recursion, whatever the nesting)
and without any grammar machinery; keywords the compiler does not support are fine here, since
nothing is compiled. Unknown keywords are allowed, as the meta-schemas allow them. The `format`
annotations of the meta-schemas (regex syntax of `pattern`, URI syntax of `$ref`) are not
asserted: nothing reads those values for a non-strict tool.
"""

from __future__ import annotations

import re
from typing import Any

from shared.errors import InvalidSchema, SchemaSource

TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_DRAFT_07 = frozenset({"http://json-schema.org/draft-07/schema#",
                       "http://json-schema.org/draft-07/schema"})
# keyword -> kind of value the meta-schema asserts
_SCHEMA = ("additionalProperties", "propertyNames", "contains", "not", "if", "then", "else",
           "unevaluatedItems", "unevaluatedProperties", "contentSchema", "additionalItems")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LIST = ("prefixItems", "allOf", "anyOf", "oneOf")
_COUNT = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
          "minContains", "maxContains")
_NUMBER = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_STRING = ("pattern", "format", "title", "description", "$comment", "$id", "$schema", "$ref",
           "$dynamicRef", "$recursiveRef", "contentEncoding", "contentMediaType")
_BOOLEAN = ("uniqueItems", "readOnly", "writeOnly", "deprecated")
_ANCHOR = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*")
# Keywords each dialect's meta-schema does not know: any value is allowed, nothing is descended.
_NOT_IN = {
    "2020-12": frozenset({"additionalItems"}),
    "draft-07": frozenset({"$defs", "prefixItems", "dependentRequired", "dependentSchemas",
                           "unevaluatedItems", "unevaluatedProperties", "minContains",
                           "maxContains", "$anchor", "$dynamicRef", "$dynamicAnchor",
                           "$recursiveRef", "$recursiveAnchor", "$vocabulary", "contentSchema",
                           "deprecated"}),
}


def _child(pointer: str, token: str | int) -> str:
    return f"{pointer}/{str(token).replace('~', '~0').replace('/', '~1')}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
    # The meta-schema's "integer" includes numbers with a zero fraction (2.0).
    return _is_number(v) and v >= 0 and float(v).is_integer()


def _unique(items: list) -> bool:
    seen: list = []
    for item in items:
        if item in seen:
            return False
        seen.append(item)
    return True


def _string_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v) and _unique(v)


def check_meta_schema(schema: Any, *, tool_index: int | None = None,
                      tool_name: str | None = None) -> None:
    """Raise InvalidSchema (source tool_arguments, RFC 6901 pointer into `schema`) at the first
    keyword whose value the JSON Schema meta-schema does not allow."""

    def invalid(pointer: str, message: str) -> InvalidSchema:
        where = f"at {pointer!r}" if pointer else "at the schema root"
        return InvalidSchema(f"invalid JSON Schema {where} of tool {tool_index} ({tool_name!r}) "
                             f"arguments: {message}", pointer=pointer,
                             source=SchemaSource.TOOL_ARGUMENTS, tool_index=tool_index,
                             tool_name=tool_name)

    draft07 = isinstance(schema, dict) and schema.get("$schema") in _DRAFT_07
    unknown = _NOT_IN["draft-07" if draft07 else "2020-12"]
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, pointer = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise invalid(pointer, "a schema must be an object or a boolean")
        subschemas: list[tuple[Any, str]] = []
        for key, value in node.items():
            at = _child(pointer, key)
            if key in unknown:
                continue
            if key == "type":
                names = value if isinstance(value, list) else [value]
                if isinstance(value, list) and (not value or not _unique(value)):
                    raise invalid(at, "type must be a type name or a non-empty array of "
                                      "distinct type names")
                for name in names:
                    if not isinstance(name, str) or name not in TYPES:
                        raise invalid(at, f"{name!r} is not a JSON Schema type "
                                          f"({', '.join(sorted(TYPES))})")
            elif key in _SCHEMA or (key == "items" and not (draft07 and isinstance(value, list))):
                subschemas.append((value, at))
            elif key == "items":
                if not value:
                    raise invalid(at, "items must be a schema or a non-empty array of schemas")
                subschemas += [(v, _child(at, i)) for i, v in enumerate(value)]
            elif key in _SCHEMA_MAP:
                if not isinstance(value, dict):
                    raise invalid(at, f"{key} must be an object of schemas")
                subschemas += [(v, _child(at, k)) for k, v in value.items()]
            elif key in _SCHEMA_LIST:
                if not isinstance(value, list) or not value:
                    raise invalid(at, f"{key} must be a non-empty array of schemas")
                subschemas += [(v, _child(at, i)) for i, v in enumerate(value)]
            elif key in _COUNT:
                if not _is_count(value):
                    raise invalid(at, f"{key} must be a non-negative integer")
            elif key in _NUMBER:
                if not _is_number(value):
                    raise invalid(at, f"{key} must be a number")
            elif key == "multipleOf":
                if not _is_number(value) or value <= 0:
                    raise invalid(at, "multipleOf must be a number greater than 0")
            elif key in _STRING:
                if not isinstance(value, str):
                    raise invalid(at, f"{key} must be a string")
                if key == "$id" and not draft07 and "#" in value[:-1]:
                    raise invalid(at, "$id must not have a non-empty fragment")
            elif key in ("$anchor", "$dynamicAnchor", "$recursiveAnchor"):
                if not isinstance(value, str) or not _ANCHOR.fullmatch(value):
                    raise invalid(at, f"{key} must be a plain name (letters, digits, '-', '.', "
                                      "'_', not starting with a digit)")
            elif key in _BOOLEAN:
                if not isinstance(value, bool):
                    raise invalid(at, f"{key} must be a boolean")
            elif key == "required":
                if not _string_list(value):
                    raise invalid(at, "required must be an array of distinct strings")
            elif key in ("enum", "examples"):
                if not isinstance(value, list):
                    raise invalid(at, f"{key} must be an array")
            elif key == "dependentRequired":
                if not isinstance(value, dict) or not all(_string_list(v) for v in value.values()):
                    raise invalid(at, "dependentRequired must map names to arrays of distinct "
                                      "strings")
            elif key == "dependencies":
                if not isinstance(value, dict):
                    raise invalid(at, "dependencies must be an object")
                for name, dep in value.items():
                    if not _string_list(dep):
                        subschemas.append((dep, _child(at, name)))
            elif key == "$vocabulary":
                if not isinstance(value, dict) or not all(isinstance(v, bool)
                                                          for v in value.values()):
                    raise invalid(at, "$vocabulary must map URIs to booleans")
        stack.extend(reversed(subschemas))
