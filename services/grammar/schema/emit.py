"""The reduced schema graph as a grammar in the generation layout, in xgrammar EBNF or llguidance
Lark (`syntax.py`; both write the same language).

Layout: declared properties in declared order (optional ones may be skipped), then any additional
properties; canonical string escapes; numbers as in `numbers`. Whitespace between tokens follows
the request's profile (`WHITESPACE_PROFILES`), never around the root value:

- `any`: a run of at most 32 of space, tab, newline, carriage return between any two tokens;
- `compact`: none (`{"a":1,"b":[1,2]}`, Python's separators `(",", ":")`);
- `indented`: the canonical 2-space layout of `json.dumps(value, indent=2)`: a newline and two
  spaces per nesting level before each member or element and before the closing bracket of a
  non-empty container, `": "` between a key and its value, empty containers as `{}` / `[]`.
  Containers nested deeper than `MAX_INDENT_DEPTH` levels are written compact.

One rule per (node, nesting level) (memoized; the level only matters for `indented`), one per
definition.

Node forms emitted elsewhere (schema/arrays.py, schema/objects.py: patternProperties, property
counts, contains, uniqueItems, integer multipleOf) and strings whose patterns, formats and lengths
intersect into one automaton (schema/patterns.py) are written in xgrammar EBNF only, with the
`any` layout inside them (those emitters separate tokens with `ws`). A Lark emission that meets
one raises `NeedsXgrammar` (the compiler then compiles on xgrammar); an explicitly requested
`compact` or `indented` profile that meets one is refused (`UnsupportedSchema`), since the
layout could not be kept; the model's default profile takes the `any` layout inside them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Callable

from services.grammar.schema import numbers
from services.grammar.schema.nodes import (
    AnyValue,
    ArrayType,
    BooleanType,
    IntegerType,
    Literals,
    Node,
    NoValue,
    NullType,
    NumberType,
    ObjectType,
    ReducedSchema,
    Ref,
    StringType,
    Union,
)
from services.grammar.schema.syntax import NOTHING_TEXT, EbnfSyntax, LarkSyntax

WHITESPACE_PROFILES = ("any", "compact", "indented")
MAX_INDENT_DEPTH = 16


@lru_cache(maxsize=4096)
def _integer_ebnf(node: IntegerType) -> str:
    return numbers.integer_ebnf(node)


@lru_cache(maxsize=4096)
def _number_ebnf(node: NumberType) -> str | None:
    return numbers.number_ebnf(node)  # exact binary64 bounds: milliseconds each, so memoized


class _Layout:
    """The whitespace text around JSON punctuation for one profile (joined with spaces)."""

    def __init__(self, profile: str, syntax: EbnfSyntax | LarkSyntax) -> None:
        if profile not in WHITESPACE_PROFILES:
            raise ValueError(f"unknown whitespace profile {profile!r}")
        self.profile, self.s = profile, syntax
        self.w = syntax.ws if profile == "any" else ""

    def indented(self, d: int) -> bool:
        return self.profile == "indented" and d < MAX_INDENT_DEPTH

    def level(self, d: int) -> int:
        """The memo key of nesting level d (0 unless it changes the layout)."""
        return min(d, MAX_INDENT_DEPTH) if self.profile == "indented" else 0

    def _nl(self, d: int) -> str:
        return "\n" + "  " * d

    def after_open(self, d: int) -> str:  # after "{" / "[", before a member or the close
        return "" if self.indented(d) else self.w

    def first(self, d: int) -> str:  # before the first member or element
        return self.s.lit(self._nl(d + 1)) if self.indented(d) else ""

    def after_value(self, d: int) -> str:  # after a member's value or an element
        return "" if self.indented(d) else self.w

    def sep(self, d: int) -> str:
        if self.indented(d):
            return self.s.lit("," + self._nl(d + 1))
        return _join(self.s.lit(","), self.w)

    def close(self, d: int, ch: str, empty: bool) -> str:
        if self.indented(d) and not empty:
            return self.s.lit(self._nl(d) + ch)
        return self.s.lit(ch)

    def colon(self, d: int) -> str:
        if self.indented(d):
            return self.s.lit(": ")
        return _join(self.w, self.s.lit(":"), self.w)


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _repeat(body: str, lo: int, hi: int | None) -> str:
    """`body` repeated lo..hi times (hi None: unbounded); "" for exactly zero times."""
    if hi == 0:
        return ""
    if lo == hi == 1:
        return body
    return f"({body}){{{lo},{'' if hi is None else hi}}}"


class NeedsXgrammar(Exception):
    """The schema uses a form the Lark emission does not write (see the module docstring)."""


class _AnyLayoutView:
    """What the xgrammar-only emitters call (`rule(node)`, `_value_literal(v)`, `_fresh`, `rules`):
    this emitter at the `any` layout's level 0."""

    def __init__(self, em: "Emitter") -> None:
        self._em = em
        self.rules = em.rules
        self._fresh = em._fresh
        self.generates_nothing = em.generates_nothing

    def rule(self, node: Node) -> str:
        return self._em.rule(node, 0)

    def _value_literal(self, v: Any) -> str:
        return self._em._value_literal(v, 0)


class Emitter:
    """Builds the grammar text. `pattern_tree(node) -> tree` gives a one-pattern string's body (the
    canonical JSON string units of the matching strings, `regex_json.lower`); `pattern_ebnf(node,
    prefix) -> (expression, rules)` the xgrammar EBNF of any pattern/format/length string;
    `extended(em, node) -> body | None` the xgrammar-only node forms; `explicit_layout`: the
    whitespace profile was requested, not the model's default."""

    def __init__(
        self,
        schema: ReducedSchema,
        pattern_tree: Callable[[StringType], Any],
        *,
        syntax: str = "xgrammar",
        whitespace: str = "any",
        pattern_ebnf: Callable[[StringType, str], tuple[str, dict[str, str]]] | None = None,
        one_pattern: Callable[[StringType], bool] = lambda node: True,
        generates_nothing: Callable[[Node], bool] = lambda node: False,
        extended: Callable[[Any, Node], str | None] | None = None,
        explicit_layout: bool = False,
        context=None,
    ) -> None:
        self.schema = schema
        self.pattern_tree = pattern_tree
        self.pattern_ebnf = pattern_ebnf
        self.one_pattern = one_pattern
        self.generates_nothing = generates_nothing
        self.extended = extended
        self.explicit_layout = explicit_layout
        self.context = context
        self.s: EbnfSyntax | LarkSyntax = EbnfSyntax() if syntax == "xgrammar" else LarkSyntax()
        self.layout = _Layout(whitespace, self.s)
        self.rules: dict[str, str] = {}
        self.memo: dict[tuple[Node, int], str] = {}
        self._counter = 0
        self._nothing = self.s.lit(NOTHING_TEXT)

    def grammar(self) -> str:
        root = self.rule(self.schema.root, 0)
        body = "".join(self.s.rule(k, v) for k, v in self.rules.items())
        assert "(nothing)" not in body, "a rule placeholder survived"
        return self.s.start(root) + self.s.base() + body + self.s.rules_text()

    def _fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _define(self, name: str, make: Callable[[], str]) -> str:
        if name not in self.rules:
            self.rules[name] = "(nothing)"  # placeholder against recursion
            self.rules[name] = make()
        return name

    def rule(self, node: Node, d: int) -> str:
        """The name of a rule for `node` at nesting level `d` (a NEVER node only appears where it
        is unreachable)."""
        lv = self.layout.level(d)
        if isinstance(node, AnyValue):
            return self._any_value(lv)
        if isinstance(node, Ref):
            name = f"d{list(self.schema.defs).index(node.name)}_{lv}"
            return self._define(name, lambda: self.rule(self.schema.defs[node.name], lv))
        key = (node, lv)
        if key not in self.memo:
            name = self._fresh("n")
            self.memo[key] = name
            self._define(name, lambda: self._body(node, lv))
        return self.memo[key]

    # ---- any JSON value ------------------------------------------------------------------

    def _any_value(self, d: int) -> str:
        """Rules value_d, member_d, object_d, array_d: any JSON value at nesting level d."""
        s, lay = self.s, self.layout
        name = f"value_{d}"
        if name in self.rules:
            return name
        self.rules[name] = "(nothing)"
        inner = self._any_value(lay.level(d + 1))  # this rule itself when the level is capped
        member = self._define(f"member_{d}", lambda: _join(
            s.string(0, None), lay.colon(d), inner, lay.after_value(d)))
        element = _join(inner, lay.after_value(d))
        obj = self._define(f"object_{d}", lambda: self._container(
            "{", "}", d, _join(member, f"({_join(lay.sep(d), member)})*")))
        arr = self._define(f"array_{d}", lambda: self._container(
            "[", "]", d, _join(element, f"({_join(lay.sep(d), element)})*")))
        number = self._define("number", lambda: s.expression(
            _number_ebnf(numbers.NumberType())))
        self.rules[name] = " | ".join([obj, arr, s.string(0, None), number, s.lit("true"),
                                       s.lit("false"), s.lit("null")])
        return name

    def _container(self, open_ch: str, close_ch: str, d: int, items: str) -> str:
        """`open items close` or `open close`; `items` ends with its own after-value text."""
        lay, s = self.layout, self.s
        if lay.indented(d):
            full = _join(s.lit(open_ch), lay.first(d), items, lay.close(d, close_ch, False))
            return f"{full} | {_join(s.lit(open_ch), lay.close(d, close_ch, True))}"
        return _join(s.lit(open_ch), lay.after_open(d),
                     f"({_join(items, s.lit(close_ch))} | {s.lit(close_ch)})")

    # ---- schema nodes --------------------------------------------------------------------

    def _xgrammar_only(self, what: str) -> None:
        if isinstance(self.s, LarkSyntax):
            raise NeedsXgrammar(what)
        if self.explicit_layout and self.layout.profile != "any" and self.context is not None:
            raise self.context.unsupported("", f"{what} cannot be written in the "
                                               f"{self.layout.profile!r} whitespace profile; use "
                                               "'any' or leave the profile to the model")

    def _body(self, node: Node, d: int) -> str:
        s = self.s
        if self.extended is not None:
            body = self.extended(_AnyLayoutView(self), node)
            if body is not None:
                self._xgrammar_only(f"a {type(node).__name__} with patternProperties, property "
                                    "counts, contains, uniqueItems or multipleOf")
                return body
        if isinstance(node, NoValue):
            return self._nothing  # unreachable in a satisfiable graph
        if isinstance(node, Union):
            # A branch whose strings intersect to nothing in the generated reading is left out
            # here, after every reduction (a complement still sees the branch as written).
            kept = [b for b in node.branches if not self.generates_nothing(b)] or node.branches
            return " | ".join(self.rule(b, d) for b in kept)
        if isinstance(node, Literals):
            return " | ".join(self._value_literal(json.loads(t), d) for t in node.texts)
        if isinstance(node, NullType):
            return s.lit("null")
        if isinstance(node, BooleanType):
            return f"{s.lit('true')} | {s.lit('false')}"
        if isinstance(node, IntegerType):
            return s.expression(_integer_ebnf(node))
        if isinstance(node, NumberType):
            text = _number_ebnf(node)
            return s.expression(text) if text else self._nothing
        if isinstance(node, StringType):
            if not node.patterns:
                return s.string(node.min_length, node.max_length)
            if isinstance(s, EbnfSyntax) and self.pattern_ebnf is not None:
                body, rules = self.pattern_ebnf(node, self._fresh("p") + "_")
                self.rules.update(rules)
                return body
            if not self.one_pattern(node):
                raise NeedsXgrammar("a string whose patterns, formats and lengths intersect")
            return s.pattern_string(self.pattern_tree(node))
        if isinstance(node, ArrayType):
            return self._array(node, d)
        assert isinstance(node, ObjectType)
        return self._object(node, d)

    def _value_literal(self, v: Any, d: int) -> str:
        s, lay = self.s, self.layout
        if isinstance(v, dict):
            if not v:
                return _join(s.lit("{"), lay.after_open(d), lay.close(d, "}", True))
            members = [_join(s.lit(json.dumps(k, ensure_ascii=False)), lay.colon(d),
                             self._value_literal(x, d + 1), lay.after_value(d))
                       for k, x in v.items()]
            return "(" + _join(s.lit("{"), lay.after_open(d), lay.first(d),
                               f" {lay.sep(d)} ".join(members), lay.close(d, "}", False)) + ")"
        if isinstance(v, list):
            if not v:
                return _join(s.lit("["), lay.after_open(d), lay.close(d, "]", True))
            items = [_join(self._value_literal(x, d + 1), lay.after_value(d)) for x in v]
            return "(" + _join(s.lit("["), lay.after_open(d), lay.first(d),
                               f" {lay.sep(d)} ".join(items), lay.close(d, "]", False)) + ")"
        if isinstance(v, str):
            return s.lit(json.dumps(v, ensure_ascii=False))
        return s.lit(json.dumps(v))

    def _array(self, node: ArrayType, d: int) -> str:
        lay = self.layout
        prefix, lo, hi = node.prefix, node.min_items, node.max_items
        k = len(prefix)
        items = None if isinstance(node.items, NoValue) else self.rule(node.items, d + 1)
        item = None if items is None else _join(items, lay.after_value(d))
        close = lay.close(d, "]", False)

        def tail(first: bool) -> str | None:
            # what follows after k prefix elements: more items, then "]" (None: only "]")
            if item is None or hi == k:
                return None if first else close
            need = max(lo - k, 0)
            more = _join(lay.sep(d), item)
            if first:  # k == 0: no separator before the first item
                return _join(item, _repeat(more, max(need - 1, 0), None if hi is None else hi - 1),
                             close)
            return _join(_repeat(more, need, None if hi is None else hi - k), close)

        def seq(i: int) -> str:  # after i >= 1 elements of the prefix
            if i == k:
                return tail(False) or close
            step = _join(lay.sep(d), self.rule(prefix[i], d + 1), lay.after_value(d), seq(i + 1))
            return f"({step} | {close})" if i >= lo else f"({step})"

        if k == 0:
            body = tail(True)
            must = item is not None and hi != 0 and lo > 0
        else:
            body = _join(self.rule(prefix[0], d + 1), lay.after_value(d), seq(1))
            must = lo > 0
        return self._open_close("[", "]", d, body, must)

    def _open_close(self, open_ch: str, close_ch: str, d: int, body: str | None, must: bool) -> str:
        """`open` then `body` (which closes itself), or the empty container unless `must`."""
        s, lay = self.s, self.layout
        empty = lay.close(d, close_ch, True)
        if body is None:
            return _join(s.lit(open_ch), lay.after_open(d), empty)
        if lay.indented(d):
            full = _join(s.lit(open_ch), lay.first(d), body)
            return full if must else f"{full} | {_join(s.lit(open_ch), empty)}"
        inner = body if must else f"({body} | {empty})"
        return _join(s.lit(open_ch), lay.after_open(d), inner)

    def _object(self, node: ObjectType, d: int) -> str:
        s, lay = self.s, self.layout
        required = node.required_names
        # an optional member whose value generates nothing (`generates_nothing`) is left out
        props = [(k, v) for k, v in node.properties if not isinstance(v, NoValue) and (
            k in required or not self.generates_nothing(v))]
        names = [k for k, _ in node.properties] + [n for n in required if
                                                    n not in dict(node.properties)]
        extra = None
        if not isinstance(node.additional, NoValue):
            key = self.s.key(names, self._fresh)
            extra = _join(key, lay.colon(d), self.rule(node.additional, d + 1), lay.after_value(d))
        prefix = self._fresh("o")

        def name(i: int, started: bool) -> str:  # state (i, started): rule o{n}_{i}_{started}
            return f"{prefix}_{i}_{int(started)}"

        indent = lay.indented(d)
        first = lay.first(d)  # "" unless indented: then what precedes the first member
        close, empty = lay.close(d, "}", False), lay.close(d, "}", True)
        n = len(props)
        for started in (False, True):
            if started:
                more = "" if extra is None else f"({_join(lay.sep(d), extra)})*"
                self.rules[name(n, True)] = _join(more, close)
            elif extra is None:
                self.rules[name(n, False)] = empty
            else:
                self.rules[name(n, False)] = \
                    f"{_join(first, extra, f'({_join(lay.sep(d), extra)})*', close)} | {empty}"
        for i in range(n - 1, -1, -1):
            key, sub = props[i]
            for started in (False, True):
                lead = lay.sep(d) if started else first
                take = _join(lead, s.lit(json.dumps(key, ensure_ascii=False)), lay.colon(d),
                             self.rule(sub, d + 1), lay.after_value(d), name(i + 1, True))
                self.rules[name(i, started)] = take if key in required else \
                    f"{take} | {name(i + 1, started)}"
        return _join(s.lit("{"), "" if indent else lay.after_open(d), name(0, False))

