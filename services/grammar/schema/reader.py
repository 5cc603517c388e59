"""Read a caller's JSON Schema into the reduced graph, validating every keyword where it stands.

Each schema object becomes one node: the type-specific assertions per allowed type, then const/enum
filtered by them, then allOf intersected, anyOf distributed, oneOf proved exclusive. A keyword the
contract does not enforce is an UnsupportedSchema at its pointer, never silently dropped.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

from services.grammar.schema.algebra import Graph, array_type, integer_bounds, number_empty, object_type, string_type
from services.grammar.schema.context import MAX_DEPTH, Context, child
from services.grammar.schema.nodes import (
    ANY, INT64_MAX, INT64_MIN, NEVER, BooleanType, Literals, Node, NullType, NumberType,
    Pattern, Ref, Required, TYPE_NAMES, make_union,
)

DRAFT_2020 = "2020-12"
DRAFT_07 = "draft-07"
_DRAFTS = {
    "https://json-schema.org/draft/2020-12/schema": DRAFT_2020,
    "https://json-schema.org/draft/2020-12/schema#": DRAFT_2020,
    "http://json-schema.org/draft-07/schema#": DRAFT_07,
    "http://json-schema.org/draft-07/schema": DRAFT_07,
}

# Descriptive keywords: never sampling assertions.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "readOnly", "writeOnly", "deprecated",
    "contentEncoding", "contentMediaType", "contentSchema", "$defs", "definitions",
})
# Assertions and applicators outside the enforced subset: rejected where they stand.
UNSUPPORTED = frozenset({
    "format", "multipleOf", "patternProperties", "propertyNames", "dependencies",
    "dependentRequired", "dependentSchemas", "if", "then", "else", "not", "uniqueItems", "contains",
    "minContains", "maxContains", "minProperties", "maxProperties", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor",
    "$anchor", "$vocabulary",
})
_COMMON = {"type", "const", "enum", "allOf", "anyOf", "oneOf", "$ref", "$schema", "$id",
           "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
           "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
           "exclusiveMaximum"}
_TYPE_SPECIFIC = _COMMON - {"type", "const", "enum", "allOf", "anyOf", "oneOf", "$ref", "$schema",
                             "$id"} | {"prefixItems", "additionalItems"}
KNOWN = {DRAFT_2020: frozenset(_COMMON | {"prefixItems"}),
         DRAFT_07: frozenset(_COMMON | {"additionalItems"})}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Reader:
    """One reduction: `read(schema)` returns the root node; `graph.defs` holds the references."""

    def __init__(self, root: Any, ctx: Context, graph: Graph) -> None:
        self.root = root
        self.ctx = ctx
        self.graph = graph
        self.annotations: set[str] = set()
        self.draft = DRAFT_2020
        if isinstance(root, dict) and "$schema" in root:
            uri = root["$schema"]
            if not isinstance(uri, str):
                raise ctx.invalid("/$schema", "$schema must be a string")
            if uri not in _DRAFTS:
                raise ctx.unsupported("/$schema", f"dialect {uri!r} is not supported "
                                                  "(use 2020-12 or draft-07)")
            self.draft = _DRAFTS[uri]

    # -- entry -------------------------------------------------------------------------------
    def read(self, schema: Any, pointer: str = "", depth: int = 0) -> Node:
        if depth > MAX_DEPTH:
            raise self.ctx.unsupported(pointer, f"schema nesting deeper than {MAX_DEPTH}")
        if isinstance(schema, bool):
            return ANY if schema else NEVER
        if not isinstance(schema, dict):
            raise self.ctx.invalid(pointer, f"a schema must be an object or a boolean, got "
                                            f"{type(schema).__name__}")
        known = KNOWN[self.draft]
        for key in schema:
            at = child(pointer, key)
            if key in ANNOTATIONS:
                if key in ("$defs", "definitions") and not isinstance(schema[key], dict):
                    raise self.ctx.invalid(at, f"{key} must be an object")
                continue
            if key == "uniqueItems" and schema[key] is False:
                continue  # asserts nothing
            if key in UNSUPPORTED:
                raise self.ctx.unsupported(at, f"keyword {key!r} is not supported")
            if key not in known:
                raise self.ctx.unsupported(at, f"unknown keyword {key!r}")
            if key == "$schema" and pointer:
                raise self.ctx.unsupported(at, "$schema is only allowed at the root")
            if key == "$id" and pointer:
                raise self.ctx.unsupported(at, "nested $id is not supported")
            if key == "$id" and not isinstance(schema[key], str):
                raise self.ctx.invalid(at, "$id must be a string")
        if "$ref" in schema and self.draft == DRAFT_07:
            for key in schema:
                if key not in ANNOTATIONS and key not in ("$ref", "$schema", "$id"):
                    raise self.ctx.unsupported(child(pointer, key), "draft-07 ignores assertions "
                                               "next to $ref; use allOf for an intersection")
        d = depth + 1
        node = self._own(schema, pointer, d)
        if "$ref" in schema:
            node = self.graph.meet(self._ref(schema["$ref"], child(pointer, "$ref"), d), node, pointer)
        for key in ("const", "enum"):
            if key in schema:
                node = self.graph.meet(self._literals(schema, key, pointer), node, child(pointer, key))
        if "allOf" in schema:
            for i, sub in enumerate(self._subschemas(schema, "allOf", pointer)):
                at = child(child(pointer, "allOf"), i)
                node = self.graph.meet(node, self.read(sub, at, d), at)
        if "anyOf" in schema:
            subs = self._subschemas(schema, "anyOf", pointer)
            node = make_union([self.graph.meet(node, self.read(s, child(child(pointer, "anyOf"), i), d),
                                               pointer) for i, s in enumerate(subs)])
        if "oneOf" in schema:
            at = child(pointer, "oneOf")
            subs = self._subschemas(schema, "oneOf", pointer)
            branches = [self.graph.meet(node, self.read(s, child(at, i), d), pointer)
                        for i, s in enumerate(subs)]
            self.graph.prove_exclusive(branches, at)
            node = make_union(branches)
        return node

    def _subschemas(self, schema: dict, key: str, pointer: str) -> list:
        subs = schema[key]
        if not isinstance(subs, list) or not subs:
            raise self.ctx.invalid(child(pointer, key), f"{key} must be a non-empty array of schemas")
        return subs

    # -- references --------------------------------------------------------------------------
    def _ref(self, ref: Any, at: str, depth: int) -> Node:
        if not isinstance(ref, str):
            raise self.ctx.invalid(at, "$ref must be a string")
        root_id = self.root.get("$id") if isinstance(self.root, dict) else None
        target_ptr = ref
        if isinstance(root_id, str) and ref.startswith(root_id.split("#")[0]) and root_id:
            target_ptr = ref[len(root_id.split("#")[0]):]
        if not target_ptr.startswith("#"):
            raise self.ctx.unsupported(at, f"external reference {ref!r} is not supported "
                                           "(external documents are never fetched)")
        fragment = target_ptr[1:]
        if fragment and not fragment.startswith("/"):
            raise self.ctx.unsupported(at, f"anchor reference {ref!r} is not supported")
        from urllib.parse import unquote
        fragment = unquote(fragment)
        if fragment not in self.graph.defs:
            target = self._lookup(fragment, at)
            self.graph.begin(fragment)
            self.graph.defs[fragment] = self.read(target, fragment, depth)
        return Ref(fragment)

    def _lookup(self, fragment: str, at: str) -> Any:
        node = self.root
        if not fragment:
            return node
        for raw in fragment[1:].split("/"):
            token = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise self.ctx.invalid(at, f"$ref target '#{fragment}' does not exist")
        return node

    # -- finite values -----------------------------------------------------------------------
    def _literals(self, schema: dict, key: str, pointer: str) -> Node:
        at = child(pointer, key)
        if key == "const":
            values = [schema["const"]]
        else:
            values = schema["enum"]
            if not isinstance(values, list):
                raise self.ctx.invalid(at, "enum must be an array")
        texts = []
        for i, v in enumerate(values):
            self._check_value(v, at if key == "const" else child(at, i), 0)
            texts.append(json.dumps(v, ensure_ascii=False, allow_nan=False))
        return Literals(tuple(dict.fromkeys(texts))) if texts else NEVER

    def _check_value(self, v: Any, at: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.ctx.unsupported(at, f"value nesting deeper than {MAX_DEPTH}")
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise self.ctx.unsupported(at, f"integer literal {v} is outside signed 64-bit")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise self.ctx.unsupported(at, "a numeric value JSON parsing would round to infinity")
        elif isinstance(v, str):
            _check_text(self.ctx, v, at)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                self._check_value(x, at, depth + 1)
        elif isinstance(v, dict):
            for k, x in v.items():
                _check_text(self.ctx, k, at)
                self._check_value(x, at, depth + 1)
        else:
            raise self.ctx.invalid(at, f"{type(v).__name__} is not a JSON value")

    # -- type-specific assertions ------------------------------------------------------------
    def _own(self, s: dict, pointer: str, depth: int) -> Node:
        if "type" not in s and not any(k in s for k in _TYPE_SPECIFIC):
            return ANY
        types = self._types(s, pointer)
        branches: list[Node] = []
        for t in types:
            if t == "integer" and "number" in types:
                continue  # integers are numbers: the number branch covers them
            if t == "null":
                branches.append(NullType())
            elif t == "boolean":
                branches.append(BooleanType())
            elif t in ("integer", "number"):
                num = self._number(s, pointer)
                branches.append(integer_bounds(num, INT64_MIN, INT64_MAX) if t == "integer"
                                else (NEVER if number_empty(num) else num))
            elif t == "string":
                branches.append(self._string(s, pointer))
            elif t == "array":
                branches.append(self._array(s, pointer, depth))
            else:
                branches.append(self._object(s, pointer, depth))
        return make_union(branches)

    def _types(self, s: dict, pointer: str) -> list[str]:
        if "type" not in s:
            return [t for t in TYPE_NAMES]
        t = s["type"]
        at = child(pointer, "type")
        names = [t] if isinstance(t, str) else t
        if not isinstance(names, list) or not names:
            raise self.ctx.invalid(at, "type must be a type name or a non-empty array of them")
        for n in names:
            if n not in TYPE_NAMES:
                raise self.ctx.invalid(at, f"unknown type {n!r}")
        if len(set(names)) != len(names):
            raise self.ctx.invalid(at, "type array has duplicates")
        return names

    def _count(self, s: dict, key: str, pointer: str) -> int | None:
        if key not in s:
            return None
        v = s[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise self.ctx.invalid(child(pointer, key), f"{key} must be a non-negative integer")
        return v

    def _bound(self, s: dict, key: str, pointer: str) -> Fraction | None:
        if key not in s:
            return None
        v = s[key]
        at = child(pointer, key)
        if not _is_number(v):
            raise self.ctx.invalid(at, f"{key} must be a number")
        if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX:
            raise self.ctx.unsupported(at, f"{key} {v} is outside signed 64-bit")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.ctx.unsupported(at, f"{key} is a value JSON parsing would round to infinity")
        return Fraction(v)

    def _number(self, s: dict, pointer: str) -> NumberType:
        lo, lo_ex = self._bound(s, "minimum", pointer), False
        hi, hi_ex = self._bound(s, "maximum", pointer), False
        elo = self._bound(s, "exclusiveMinimum", pointer)
        ehi = self._bound(s, "exclusiveMaximum", pointer)
        if elo is not None and (lo is None or elo >= lo):
            lo, lo_ex = elo, True
        if ehi is not None and (hi is None or ehi <= hi):
            hi, hi_ex = ehi, True
        return NumberType(lo, lo_ex, hi, hi_ex)

    def _string(self, s: dict, pointer: str) -> Node:
        lo = self._count(s, "minLength", pointer) or 0
        hi = self._count(s, "maxLength", pointer)
        patterns: tuple[Pattern, ...] = ()
        if "pattern" in s:
            at = child(pointer, "pattern")
            if not isinstance(s["pattern"], str):
                raise self.ctx.invalid(at, "pattern must be a string")
            patterns = (Pattern(s["pattern"], at),)
        return string_type(lo, hi, patterns)

    def _array(self, s: dict, pointer: str, depth: int) -> Node:
        prefix: list[Node] = []
        items: Node = ANY
        items_at = child(pointer, "items")
        if self.draft == DRAFT_2020:
            if "prefixItems" in s:
                at = child(pointer, "prefixItems")
                if not isinstance(s["prefixItems"], list) or not s["prefixItems"]:
                    raise self.ctx.invalid(at, "prefixItems must be a non-empty array of schemas")
                prefix = [self.read(x, child(at, i), depth) for i, x in enumerate(s["prefixItems"])]
            if "items" in s:
                if isinstance(s["items"], list):
                    raise self.ctx.invalid(items_at, "items must be a schema in 2020-12 "
                                                     "(use prefixItems for positions)")
                items = self.read(s["items"], items_at, depth)
        else:
            if isinstance(s.get("items"), list):
                prefix = [self.read(x, child(items_at, i), depth) for i, x in enumerate(s["items"])]
                if "additionalItems" in s:
                    items = self.read(s["additionalItems"], child(pointer, "additionalItems"), depth)
            elif "items" in s:
                items = self.read(s["items"], items_at, depth)
            # additionalItems without an items array asserts nothing (draft-07), but is still read
            elif "additionalItems" in s:
                self.read(s["additionalItems"], child(pointer, "additionalItems"), depth)
        return array_type(prefix, items, self._count(s, "minItems", pointer) or 0,
                          self._count(s, "maxItems", pointer))

    def _object(self, s: dict, pointer: str, depth: int) -> Node:
        props: list[tuple[str, Node]] = []
        if "properties" in s:
            at = child(pointer, "properties")
            if not isinstance(s["properties"], dict):
                raise self.ctx.invalid(at, "properties must be an object of schemas")
            for name, sub in s["properties"].items():
                _check_text(self.ctx, name, child(at, name))
                props.append((name, self.read(sub, child(at, name), depth)))
        required: list[Required] = []
        if "required" in s:
            at = child(pointer, "required")
            names = s["required"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise self.ctx.invalid(at, "required must be an array of strings")
            if len(set(names)) != len(names):
                raise self.ctx.invalid(at, "required has duplicate names")
            required = [Required(n, child(at, i)) for i, n in enumerate(names)]
        additional = ANY
        if "additionalProperties" in s:
            additional = self.read(s["additionalProperties"], child(pointer, "additionalProperties"),
                                   depth)
        return object_type(tuple(props), tuple(required), additional)


def _check_text(ctx: Context, text: str, at: str) -> None:
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise ctx.unsupported(at, "a string with a lone surrogate is not a Unicode scalar sequence")
