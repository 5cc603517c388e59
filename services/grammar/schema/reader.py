"""Read a caller's JSON Schema into the reduced graph, validating every keyword where it stands.

Each schema object becomes one node: the type-specific assertions per allowed type (`typed`), then
const/enum filtered by them, then allOf intersected, anyOf distributed, oneOf proved exclusive, and
the other applicators (`applicators`). Keywords are classified by the schema's dialect
(`dialects`): a keyword the contract does not enforce is an UnsupportedSchema at its pointer, never
silently dropped; a keyword in no vocabulary is an annotation (listed in `annotations`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from services.grammar.schema import applicators
from services.grammar.schema.algebra import Graph
from services.grammar.schema.context import MAX_DEPTH, Context, child
from services.grammar.schema.dialects import (
    ALL_ASSERTIONS,
    DRAFT_2020,
    READ_IN_EVERY_DIALECT,
    Dialect,
    dialect_of,
    foreign_dialects,
    near_miss,
)
from services.grammar.schema.misspelt import declared_only, read_as_meant
from services.grammar.schema.nodes import (
    ANY,
    INT64_MAX,
    INT64_MIN,
    NEVER,
    Literals,
    Node,
    Ref,
    make_union,
)
from services.grammar.schema.one_of import one_of
from services.grammar.schema.refs import Document
from services.grammar.schema.typed import own_node, rounded

# Keywords that name resources or anchors (refs.Document indexes them by the root's dialect).
_IDENTIFIERS = ("$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor")

# Assertion keywords this reduction enforces (each where it reduces exactly; see their modules).
ENFORCED = frozenset({
    "$ref", "type", "const", "enum", "allOf", "anyOf", "oneOf", "properties", "required",
    "additionalProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "format", "patternProperties", "propertyNames", "minProperties",
    "maxProperties", "contains", "minContains", "maxContains",
}) | applicators.KEYWORDS


class Reader:
    """One reduction: `read(schema)` returns the root node; `graph.defs` holds the references."""

    def __init__(self, root: Any, ctx: Context, graph: Graph) -> None:
        self.root = root
        self.ctx = ctx
        self.graph = graph
        self.annotations: set[str] = set()
        self.dialect: Dialect = DRAFT_2020
        if isinstance(root, dict) and "$schema" in root:
            uri = root["$schema"]
            if not isinstance(uri, str):
                raise ctx.invalid("/$schema", "$schema must be a string")
            dialect = dialect_of(uri)
            if dialect is None:
                raise ctx.unsupported(
                    "/$schema",
                    f"dialect {uri!r} is not supported (use draft-04, "
                    "draft-06, draft-07, 2019-09 or 2020-12)",
                )
            self.dialect = dialect
        self.doc = Document(root, self.dialect, ctx)
        self._def_dialects: dict[str, Dialect] = {}  # definition pointer -> dialect it was read in
        self.foreign: list[str] = []  # pointers of the enforced keywords of other dialects
        self.complemented: set[str] = set()  # pointers of the schemas taken a complement of
        # Under an odd number of complements the schema is read as an upper bound of every
        # reading (`flipped`): the keywords that only narrow where they are enforced are left
        # out there (misspelt.declared_only), their pointers listed here
        self.upper = False
        self.ignored: list[str] = []
        # each definition read once per bound (bounds.py), where one bound alone would not do
        self.split_bounds = False

    # -- entry -------------------------------------------------------------------------------
    def read(self, schema: Any, pointer: str = "", depth: int = 0) -> Node:
        if depth > MAX_DEPTH:
            raise self.ctx.unsupported(pointer, f"schema nesting deeper than {MAX_DEPTH}")
        if isinstance(schema, bool):
            return ANY if schema else NEVER
        if not isinstance(schema, dict):
            raise self.ctx.invalid(pointer, f"a schema must be an object or a boolean, got "
                                            f"{type(schema).__name__}")
        outer = self.dialect
        if "$schema" in schema and pointer:
            self.dialect = self._nested_dialect(schema, pointer)
        try:
            if self.dialect is not self.doc.dialect:
                for key in _IDENTIFIERS:
                    if key in schema:
                        raise self.ctx.unsupported(
                            child(pointer, key),
                            f"{key} inside a subschema of "
                            f"dialect {self.dialect.name} (the document's is "
                            f"{self.doc.dialect.name}) is not supported",
                        )
            d = depth + 1
            if pointer:
                self._nested_id(schema, pointer)
            if "$ref" in schema and self.dialect.ref_overrides_siblings:
                # draft-04..07: "All other properties in a "$ref" object MUST be ignored." An
                # assertion written there would be silently dropped: refused (the design's rule),
                # pointing to allOf, which intersects explicitly.
                for k in schema:
                    if k != "$ref" and k in ALL_ASSERTIONS:
                        raise self.ctx.unsupported(child(pointer, k), f"{k!r} next to $ref is "
                                                   f"ignored in {self.dialect.name}; write the "
                                                   "intersection explicitly with allOf")
                self.annotations.update(k for k in schema if k != "$ref" and k not in
                                        self.dialect.annotations | self.dialect.core)
                return self._ref(schema["$ref"], pointer, d)
            if self._ignoring(pointer):
                schema = declared_only(self, schema, pointer)
            else:
                schema = read_as_meant(self, schema, pointer)
            self._classify(schema, pointer)
            node = own_node(self, schema, pointer, d)
            if "$ref" in schema:
                node = self.graph.meet(self._ref(schema["$ref"], pointer, d), node, pointer)
            for key in ("const", "enum"):
                if key in schema:
                    node = self.graph.meet(
                        self._literals(schema, key, pointer), node, child(pointer, key)
                    )
            if "allOf" in schema:
                for i, sub in enumerate(self._subschemas(schema, "allOf", pointer)):
                    at = child(child(pointer, "allOf"), i)
                    if self._only_one_of(sub):
                        # node and oneOf(X): exactly one X_i holds, which for a value of node is
                        # exactly one of (node and X_i): the oneOf read met with node, so that
                        # its proofs see node's assertions (a discriminator required beside it)
                        one = child(at, "oneOf")
                        node = one_of(self, node, self._subschemas(sub, "oneOf", at), one, d)
                        continue
                    node = self.graph.meet(node, self.read(sub, at, d), at)
            if "anyOf" in schema:
                subs = self._subschemas(schema, "anyOf", pointer)
                node = make_union(
                    [
                        self.graph.meet(
                            node, self.read(s, child(child(pointer, "anyOf"), i), d), pointer
                        )
                        for i, s in enumerate(subs)
                    ]
                )
            if "oneOf" in schema:
                at = child(pointer, "oneOf")
                node = one_of(self, node, self._subschemas(schema, "oneOf", pointer), at, d)
            return applicators.apply(self, schema, node, pointer, d)
        finally:
            self.dialect = outer

    def flipped(self, schema: Any, pointer: str, depth: int) -> Node:
        """`schema` read for a complement: as the other bound. A keyword that only narrows
        where it is enforced (another dialect's, a near-miss read as meant) makes the readings'
        languages nest, enforced one inside ignored one; the generated values must hold in
        both, so the lower bound enforces such a keyword and a complement takes the upper bound,
        which leaves it out. The language is monotone in each keyword that is not complemented
        and antitone in each that is, so reading every complemented schema as the other bound
        gives values valid in every reading (and exactly their intersection under `not`)."""
        self.upper = not self.upper
        try:
            return self.read(schema, pointer, depth)
        finally:
            self.upper = not self.upper

    def marks(self) -> int:
        """How many narrowing keywords of other readings were met (enforced or left out)."""
        return len(self.foreign) + len(self.ignored)

    def _ignoring(self, pointer: str) -> bool:
        """Upper bound, and not inside an enforced foreign keyword: the declared reading ignores
        such a keyword whole, so below it only the defining reading counts and is exact."""
        return self.upper and not any(pointer == f or pointer.startswith(f + "/")
                                      for f in self.foreign)

    def _only_one_of(self, sub: Any) -> bool:
        """An allOf item that asserts nothing but its oneOf (other keys are annotations of the
        dialect)."""
        return isinstance(sub, dict) and "oneOf" in sub and all(
            k == "oneOf" or k in self.dialect.annotations for k in sub)

    def _nested_id(self, schema: dict, pointer: str) -> None:
        """A root `$id` is only the document's identity; one inside a subschema would open a new
        resource with its own base URI: refused (the design's rule). An identifier that is only a
        fragment ("#name", a draft-06/07 plain-name anchor, or the "#/properties/x" generators
        write) opens no resource and is kept."""
        key = self.dialect.id_keyword
        value = schema.get(key)
        if key in schema and not (isinstance(value, str) and value.startswith("#")):
            raise self.ctx.unsupported(child(pointer, key), f"{key} inside a subschema (a nested "
                                       "resource) is not supported; only the root may name the "
                                       "document")

    def _nested_dialect(self, schema: dict, pointer: str) -> Dialect:
        """A subschema declaring its own `$schema`: its subtree is read in that dialect, as
        `jsonschema` does (a validator for the subschema's `$schema`, kept below it and through
        its references). Identifiers inside a subtree of another dialect than the root's are
        refused: the document's resources are indexed by the root's dialect."""
        at = child(pointer, "$schema")
        uri = schema["$schema"]
        if not isinstance(uri, str):
            raise self.ctx.invalid(at, "$schema must be a string")
        dialect = dialect_of(uri)
        if dialect is None:
            raise self.ctx.unsupported(at, f"dialect {uri!r} is not supported (use draft-04, "
                                           "draft-06, draft-07, 2019-09 or 2020-12)")
        return dialect

    def _classify(self, schema: dict, pointer: str) -> None:
        """Raise for keywords outside the enforced subset; record annotations."""
        dialect = self.dialect
        for key, value in schema.items():
            at = child(pointer, key)
            if key in dialect.annotations:
                continue
            if key in dialect.core:
                self._check_core(key, value, pointer, at)
                continue
            if key in dialect.assertions:
                if key == "uniqueItems" and value is False:
                    continue  # asserts nothing
                if key not in ENFORCED:
                    raise self.ctx.unsupported(at, f"keyword {key!r} is not supported")
                continue
            if key in ALL_ASSERTIONS:
                if key in READ_IN_EVERY_DIALECT:
                    # The declared dialect ignores it, the dialects that define it assert it:
                    # enforced, so every generated value is valid in both readings. Listed, since
                    # the declared dialect's validators accept more.
                    self.annotations.add(f"foreign:{key}")
                    self.foreign.append(at)
                    continue
                if key == "additionalItems" and not isinstance(schema.get("items"), list):
                    # Without an items array it asserts nothing in the dialects that define it
                    # either ("MUST be ignored", draft-07 6.4.2): an annotation in every reading.
                    self.annotations.add(key)
                    continue
                raise self.ctx.unsupported(at, f"{key!r} is not a keyword of {dialect.name} (the "
                                               f"declared dialect would ignore it); it is one of "
                                               f"{', '.join(foreign_dialects(key))}: declare that "
                                               "dialect with $schema")
            meant = near_miss(key, dialect)
            if meant is not None:
                raise self.ctx.unsupported(at, f"unknown keyword {key!r} looks like the assertion "
                                               f"{meant!r} (it would be ignored as an annotation)")
            self.annotations.add(key)

    def check_foreign_complements(self) -> None:
        """After the whole schema is read (bounds.check_references)."""
        from services.grammar.schema.bounds import check_references

        check_references(self)

    def _check_core(self, key: str, value: Any, pointer: str, at: str) -> None:
        if key in ("$id", "id", "$anchor", "$dynamicAnchor", "$schema") and not isinstance(
            value, str
        ):
            raise self.ctx.invalid(at, f"{key} must be a string")
        if key in ("$defs", "definitions") and not isinstance(value, dict):
            raise self.ctx.invalid(at, f"{key} must be an object")
        if key == "$vocabulary" and pointer:
            raise self.ctx.unsupported(at, "$vocabulary is only meaningful in a meta-schema")

    def _subschemas(self, schema: dict, key: str, pointer: str) -> list:
        subs = schema[key]
        if not isinstance(subs, list) or not subs:
            raise self.ctx.invalid(
                child(pointer, key), f"{key} must be a non-empty array of schemas"
            )
        return subs

    # -- references --------------------------------------------------------------------------
    def _ref(self, ref: Any, pointer: str, depth: int) -> Node:
        at = child(pointer, "$ref")
        if not isinstance(ref, str):
            raise self.ctx.invalid(at, "$ref must be a string")
        target_ptr = self.doc.resolve(ref, pointer, at)
        target = self.doc.lookup(target_ptr, at)
        name = target_ptr + " (upper bound)" if self.split_bounds and self.upper else target_ptr
        # The dialect the target is read in: its own $schema, else the one in force here.
        own = target.get("$schema") if isinstance(target, dict) else None
        dialect = (dialect_of(own) if isinstance(own, str) else None) or self.dialect
        if name not in self.graph.defs:
            self._def_dialects[name] = dialect
            self.graph.begin(name)
            outer, self.dialect = self.dialect, dialect
            try:
                self.graph.defs[name] = self.read(target, target_ptr, depth)
            finally:
                self.dialect = outer
            self.graph.settle()
        elif self._def_dialects.get(name, dialect) is not dialect:
            raise self.ctx.unsupported(at, f"reference {ref!r} is reached in dialects "
                                           f"{self._def_dialects[name].name} and "
                                           f"{dialect.name}, which read it differently")
        if self.graph.accepts_nothing(name):
            return NEVER  # no value: unions, members and items see it as such (no rule)
        return Ref(name)

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
            self.check_value(v, at if key == "const" else child(at, i), 0)
            texts.append(json.dumps(v, ensure_ascii=False, allow_nan=False))
        return Literals(tuple(dict.fromkeys(texts))) if texts else NEVER

    def check_value(self, v: Any, at: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.ctx.unsupported(at, f"value nesting deeper than {MAX_DEPTH}")
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise self.ctx.unsupported(at, f"integer literal {v} is outside signed 64-bit")
        elif isinstance(v, float):
            rounded(self, v, at)
            if not math.isfinite(v):
                raise self.ctx.unsupported(
                    at, "a numeric value JSON parsing would round to infinity"
                )
        elif isinstance(v, str):
            self.check_text(v, at)
        elif isinstance(v, list):
            for x in v:
                self.check_value(x, at, depth + 1)
        elif isinstance(v, dict):
            for k, x in v.items():
                self.check_text(k, at)
                self.check_value(x, at, depth + 1)
        else:
            raise self.ctx.invalid(at, f"{type(v).__name__} is not a JSON value")

    def check_text(self, text: str, at: str) -> None:
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            raise self.ctx.unsupported(at, "a string with a lone surrogate is not a Unicode scalar "
                                           "sequence")
