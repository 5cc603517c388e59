"""In-document `$ref` resolution: resources named by `$id` / `id`, anchors, base URIs.

A `$ref` is resolved against the base URI of the schema object it stands in (the nearest enclosing
`$id`, draft-04 `id`, resolved against its parent's base) and must land inside this document: on a
resource of it (the root, or a subschema that declares an identifier), then on a JSON Pointer
fragment or an anchor (`$anchor`, `$dynamicAnchor`, or draft-06/07 `$id: "#name"`, draft-04
`id: "#name"`). Anything else is an external document, which is never fetched (UnsupportedSchema).
The result is a JSON Pointer from the document root, which the reader uses as the definition name.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urljoin

from services.grammar.schema.context import Context, child
from services.grammar.schema.dialects import Dialect

# Keywords whose values are schemas (dicts of schemas / arrays of schemas / one schema).
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "$defs", "dependencies",
                "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "items", "prefixItems")
_SCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else",
               "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")


def _strip(uri: str) -> str:
    return uri.split("#", 1)[0]


def _join(base: str, ref: str) -> str:
    """RFC 3986 reference resolution, also for non-hierarchical bases (urn:) where a fragment-only
    reference keeps the base document."""
    if ref.startswith("#"):
        return _strip(base) + ref
    return urljoin(base, ref) if base else ref


class Document:
    """The resources and anchors of one schema document, and `$ref` resolution in it."""

    def __init__(self, root: Any, dialect: Dialect, ctx: Context) -> None:
        self.root = root
        self.dialect = dialect
        self.ctx = ctx
        self.resources: dict[str, str] = {}  # absolute URI (no fragment) -> pointer
        self.anchors: dict[tuple[str, str], str] = {}  # (resource URI, name) -> pointer
        self._scan(root, "", "")

    def _own_id(self, node: dict) -> str | None:
        """The identifier a schema object declares, unless the dialect ignores it next to $ref."""
        value = node.get(self.dialect.id_keyword)
        if not isinstance(value, str):
            return None
        if "$ref" in node and self.dialect.ref_overrides_siblings:
            return None
        return value

    def _enter(self, node: dict, base: str) -> str:
        """The base URI inside `node` given its parent's base."""
        ident = self._own_id(node)
        if ident is not None and not ident.startswith("#"):
            return _strip(_join(base, ident))
        return base

    def _scan(self, node: Any, pointer: str, base: str) -> None:
        if not isinstance(node, dict):
            return
        base = self._enter(node, base)
        self.resources.setdefault(base, pointer)
        ident = self._own_id(node)
        if (
            ident is not None
            and ident.startswith("#")
            and not ident.startswith("#/")
            and len(ident) > 1
        ):
            self.anchors.setdefault((base, ident[1:]), pointer)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str) and key in self.dialect.core:
                self.anchors.setdefault((base, node[key]), pointer)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for name, sub in node[key].items():
                    self._scan(sub, child(child(pointer, key), name), base)
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                for i, sub in enumerate(node[key]):
                    self._scan(sub, child(child(pointer, key), i), base)
        for key in _SCHEMA_ONE:
            if isinstance(node.get(key), dict):
                self._scan(node[key], child(pointer, key), base)

    def base_at(self, pointer: str) -> str:
        """The base URI in force at `pointer` (a pointer from the document root)."""
        node, base = self.root, ""
        if isinstance(node, dict):
            base = self._enter(node, base)
        if not pointer:
            return base
        for raw in pointer[1:].split("/"):
            token = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                break
            if isinstance(node, dict):
                base = self._enter(node, base)
        return base

    def resolve(self, ref: str, at: str, ref_at: str) -> str:
        """The document pointer `ref` (written in the schema object at `at`) refers to.

        Raises UnsupportedSchema (external document) or InvalidSchema (no such target), at
        `ref_at`."""
        base = self.base_at(at)
        target = _join(base, ref)
        uri, _, fragment = target.partition("#")
        if uri not in self.resources:
            raise self.ctx.unsupported(ref_at, f"external reference {ref!r} is not supported "
                                               "(external documents are never fetched)")
        start = self.resources[uri]
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            if (uri, fragment) not in self.anchors:
                raise self.ctx.invalid(ref_at, f"$ref anchor {fragment!r} does not exist")
            return self.anchors[(uri, fragment)]
        pointer = start + fragment
        self.lookup(pointer, ref_at)  # the target must exist
        return pointer

    def lookup(self, pointer: str, ref_at: str) -> Any:
        node = at_pointer(self.root, pointer, _MISSING)
        if node is _MISSING:
            raise self.ctx.invalid(ref_at, f"$ref target '#{pointer}' does not exist")
        return node


_MISSING = object()


def at_pointer(root: Any, pointer: str, missing: Any = None) -> Any:
    """The raw value at a JSON pointer of the document ("" the root), or `missing` where it
    names nothing."""
    node = root
    for raw in pointer.split("/")[1:] if pointer else ():
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return missing
    return node
