"""String `pattern`: search semantics, enforced in the grammar and in const/enum filtering.

A pattern is parsed by our ECMAScript-style parser (`services.grammar.regex.search_tree`: unanchored
unless ^ / $ at the ends of top-level alternatives; \\d \\w ASCII, \\s and `.` as ECMAScript) and
lowered to a JSON string grammar with canonical escapes (`regex_json`); finite values are filtered
by the same trees (`regex_json.whole_matches`, never backtracking).

Two readings (docs/schema-corpus.md, "Soundness rules"). The specification reads `pattern` as
ECMA-262; the validators users run (Python `jsonschema`) read it with Python's `re`: its `.`
admits \\r and U+2028/9, its \\d \\w \\s are Unicode, its `$` also matches before a final newline.
Every pattern therefore has a second tree, its Python reading (`search_tree(..., python=True)`),
and only strings both readings accept are generated: a positive pattern generates its `meet`
(the readings' classes intersected, or ours alone where it is provably the narrower reading,
`_narrower`), a negated one the strings outside its `join` (classes united, Python's `$`); a
finite value the readings disagree on is refused, and an emptiness proof (`empty`) uses the
`join`, so no conclusion rests on one reading. A pattern whose Python reading differs in
structure (`[^]`, `\\c`, `\\u{..}`, `(?<name>..)`) is UnsupportedSchema. Formats (`formats.py`)
have one tree, ours; where the validators' language is known exactly
(`formats.validator_language`; hostname's up to a length bound, `formats.VALIDATOR_TOO_LONG`,
which a complement adds) it is the `join`, and every other format may only be used
positively: complementing it, or deciding a finite value its automaton refuses, is
UnsupportedSchema at the format's pointer.

A pattern that neither our parser nor Python's `re` can read is InvalidSchema; one that only our
parser refuses (lookaround, back-references, \\b, \\p{..}, ...) is UnsupportedSchema. A pattern
together with minLength/maxLength, several patterns, or a pattern and a `format` on one string go
through the string-automaton intersection (`automata`, with its limits: beyond them
UnsupportedSchema at the last pattern's pointer); finite const/enum candidates are filtered
directly by every pattern and length instead. A pattern that matches no string is
UnsupportedSchema too (unsatisfiable), never a dead end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.grammar.regex import reading_bounds, search_tree, whole_tree
from services.grammar.regex.charset import ANY as ANY_CHAR
from services.grammar.regex.tree import Alt, Chars, Literal, Node, Repeat, Seq
from services.grammar.schema import formats
from services.grammar.schema.automata import Dfa, TooComplex, intersect, json_string_rules, tree_dfa
from services.grammar.schema.context import Context
from services.grammar.schema.dfa_logic import combine
from services.grammar.schema.nodes import ObjectType, Pattern, StringType
from services.grammar.schema.nothing import generates_nothing
from services.grammar.schema.regex_json import json_string_ebnf, lower, whole_matches
from shared.errors import InvalidRegex, InvalidSchema, UnsupportedSchema

# A single pattern or format is emitted as its minimal DFA when the subset construction stays below
# this many states (measured on the Qwen3.5 vocabulary: email mask p50 481 -> 7 us,
# uri 471 -> 14 us, ipv6 156 -> 4 us, compile time comparable), else as the regex tree.
EMIT_DFA_LIMIT = 2048
# The united classes of a `join` tree overlap where the readings differ (U+FEFF is ECMA's \\s and
# Python's \\S), which can make its subset construction explode (`(\\S+\\s+){0,99}`: 130,000
# states, minutes): its automata stop here (an emptiness proof is then not made; a complement is
# refused as too complex).
BOUND_DFA_LIMIT = 2048


@dataclass(frozen=True)
class Readings:
    """A pattern's or format's languages: `trees` holds ours (ECMA-262 / the RFC automaton)
    first, then the validators' where it differs (for deciding finite values); `meet` matches
    only strings every reading matches and `join` every string some reading matches, each one
    tree (`regex.reading_bounds`; a product of the readings' automata can grow to tens of
    thousands of states). `known`: the validators' language is known exactly (every pattern
    Python reads; only `formats.validator_language` among the formats)."""

    trees: tuple[Node, ...]
    meet: Node
    join: Node
    known: bool


class PatternSupport:
    """Checks, matches and compiles the patterns of one reduction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._trees: dict[tuple[str, bool, bool], Node] = {}
        self._readings: dict[Pattern, Readings] = {}
        self._dfas: dict[StringType, Dfa] = {}
        self._regions: dict[ObjectType, list] = {}
        self.defs: dict = {}  # the reduction's definitions (set once it is read)
        self._nothing: dict = {}  # schema/nothing.py's memo

    def tree(self, pattern: Pattern) -> Node:
        """The search-semantics tree of `pattern` (memoized).

        Raises InvalidSchema (malformed) or UnsupportedSchema (outside the supported subset),
        each at the pattern's pointer."""
        key = (pattern.source, pattern.whole, pattern.literal)
        if key in self._trees:
            return self._trees[key]
        try:
            if pattern.literal:
                tree = Literal(pattern.source)
            else:
                tree = whole_tree(pattern.source) if pattern.whole else search_tree(pattern.source)
        except InvalidRegex as exc:
            try:
                re.compile(pattern.source)
            except (re.error, OverflowError, RecursionError) as py_exc:
                raise self.ctx.invalid(pattern.pointer, f"pattern does not parse: {exc.message} "
                                                        f"({py_exc})") from None
            raise self.ctx.unsupported(pattern.pointer, f"pattern: {exc.message}") from None
        self._trees[key] = tree
        return tree

    def readings(self, pattern: Pattern) -> Readings:
        """Our reading and the validators' (see the module docstring), memoized. Raises what
        `tree` raises, and UnsupportedSchema where Python reads the pattern's structure
        differently."""
        key = Pattern(pattern.source, pattern.pointer, pattern.whole, False, pattern.literal,
                      pattern.fmt)
        if key in self._readings:
            return self._readings[key]
        ours = self.tree(pattern)
        if pattern.literal:
            out = Readings((ours,), ours, ours, True)
        elif pattern.whole:  # ours is never wider than the validators' (formats.py)
            theirs = formats.validator_language(pattern.fmt)
            other = ours if theirs is None else whole_tree(theirs)
            out = Readings((ours,) if other == ours else (ours, other), ours, other,
                           theirs is not None)
        else:
            try:
                python = search_tree(pattern.source, python=True)
                meet, join = reading_bounds(pattern.source)
            except InvalidRegex as exc:
                raise self.ctx.unsupported(pattern.pointer, "pattern: Python's re, which the "
                                           "validators use, reads it differently "
                                           f"({exc.message})") from None
            if python == ours:
                out = Readings((ours,), ours, ours, True)
            else:
                out = Readings((ours, python), ours if _narrower(ours, python) else meet, join,
                               True)
        self._readings[key] = out
        return out

    def tree_only(self, node: StringType) -> bool:
        """One positive pattern of one reading and no length: its tree is emitted directly."""
        return _tree_only(node) and self.readings(node.patterns[0]).meet == self.tree(
            node.patterns[0])

    def pattern_check(self, pattern: Pattern, negated: bool = False) -> None:
        """Raise unless `pattern` parses in both readings; with `negated`, also unless its
        complement is exact (the validators' language is known): at the pattern's pointer."""
        r = self.readings(pattern)
        if negated and not r.known:
            raise self.ctx.unsupported(pattern.pointer, f"format {pattern.fmt!r} cannot be "
                                       "negated (under not, oneOf, if/else): its automaton is "
                                       "narrower than what validators accept, so its complement "
                                       "would admit values they take as that format")

    def check(self, node: StringType, ctx: Context) -> None:
        """Raise UnsupportedSchema unless `node`'s patterns (and lengths) can be enforced."""
        if self.tree_only(node):
            if json_string_ebnf(self.tree(node.patterns[0])) is None:
                raise ctx.unsupported(node.patterns[0].pointer, _empty(node.patterns[0]))
            return
        self.string_dfa(node, ctx)

    def string_dfa(self, node: StringType, ctx: Context) -> Dfa:
        """The string-automaton intersection of every pattern/format with the length bounds."""
        if node in self._dfas:
            return self._dfas[node]
        where = node.patterns[-1].pointer if node.patterns else ""
        try:
            positive = [p for p in node.patterns if not p.negated]
            dfas = [] if positive else [tree_dfa(Repeat(Chars(ANY_CHAR), 0, None))]
            for p in positive:  # only strings every reading matches
                dfas.append(tree_dfa(self.readings(p).meet))
                if not dfas[-1].delta:
                    raise ctx.unsupported(p.pointer, _empty(p))
            dfa = intersect(tuple(dfas), node.min_length, _max_length(node))
            negative = []  # a negated pattern: no reading may match
            for p in node.patterns:
                if p.negated:
                    self.pattern_check(p, negated=True)
                    r = self.readings(p)
                    negative.append(tree_dfa(r.join) if r.join == r.trees[0] else
                                    tree_dfa(r.join, BOUND_DFA_LIMIT))
            negative = tuple(negative)
            if negative and dfa.delta:
                dfa = combine((dfa,) + negative, lambda v: v[0] and not any(v[1:]))
        except TooComplex as exc:
            raise ctx.unsupported(where, f"the intersection of pattern/format and length is too "
                                         f"complex: {exc}") from None
        if not dfa.delta:
            raise ctx.unsupported(where, "pattern/format and length together match no string "
                                         "(unsatisfiable)")
        self._dfas[node] = dfa
        return dfa

    def empty(self, node: StringType) -> bool | None:
        """Whether no string satisfies `node` (its patterns, formats and lengths together) in
        either reading, so in the validators' too; None where that is not decided: a format
        whose validators' language is not known, a pattern outside the supported subset, or past
        the automaton limits. Errors are not raised here: the node is checked where it is
        emitted."""
        try:
            groups = [(self.readings(p), p.negated) for p in node.patterns]
            if any(not r.known for r, _ in groups):
                return None
            if len(groups) == 1 and not groups[0][1] and node.min_length == 0 and \
                    node.max_length is None:  # one positive pattern: its tree
                return lower(groups[0][0].join) is None
            # every string some reading accepts: a positive pattern's join, a negated one's
            # complement of its meet
            dfas = tuple(tree_dfa(r.meet if neg else r.join, BOUND_DFA_LIMIT) for r, neg in groups)

            def upper(v: tuple[bool, ...]) -> bool:
                return all(x != neg for x, (_, neg) in zip(v, groups))

            either = combine(dfas, upper)
            if either.delta and (node.min_length or node.max_length is not None):
                either = intersect((either,), node.min_length, node.max_length)
            return not either.delta
        except (UnsupportedSchema, InvalidSchema, TooComplex):
            return None

    def generates_nothing(self, node) -> bool:
        """A node whose generated language is empty though `empty` could not prove it for the
        validators (schema/nothing.py: a string node whose `string_dfa`, both readings
        intersected, is empty, and the nodes that cannot avoid one): a union branch or an
        optional member the emitter may leave out, narrowing only what is generated."""
        return generates_nothing(node, self.defs, self._string_nothing, self._nothing)

    def _string_nothing(self, node: StringType) -> bool:
        if not node.patterns:
            return False
        try:
            self.check(node, self.ctx)
        except UnsupportedSchema as exc:
            return exc.message.endswith("(unsatisfiable)")
        except InvalidSchema:
            return False
        return False

    def matches(self, pattern: Pattern, value: str) -> bool:
        """True when `value` satisfies `pattern` (a search match, or for a format, a whole
        match; negated: none) in both readings. Raises UnsupportedSchema at the pattern where the
        readings disagree on `value`, or a format's automaton refuses it while the validators'
        language is not known: a decision either way could be wrong for the validators."""
        r = self.readings(pattern)
        found = [whole_matches(t, value) for t in r.trees]
        limit = formats.STRING_FORMATS.get(pattern.fmt, (None, None))[1] if pattern.whole else None
        if limit is not None and len(value) > limit:
            found[0] = False  # the format's length bound, folded into maxLength where it is used
        if not r.known and not found[0]:
            raise self.ctx.unsupported(pattern.pointer, f"whether validators accept {value!r} as "
                                       f"format {pattern.fmt!r} is not known here (its automaton "
                                       "is narrower than their checker)")
        if len(set(found)) > 1:
            raise self.ctx.unsupported(pattern.pointer, f"the pattern decides {value!r} "
                                       "differently under ECMA-262 and Python's re (which the "
                                       "validators use)")
        return found[0] != pattern.negated

    def ebnf(self, node: StringType, prefix: str) -> tuple[str, dict[str, str]]:
        """EBNF for the JSON strings (quotes included, canonical escapes) `node` allows: an
        expression and the rules it uses (named `prefix`...)."""
        self.check(node, self.ctx)
        if self.tree_only(node):
            tree = self.tree(node.patterns[0])
            try:  # an unambiguous right-linear grammar: masks ~5-70x faster than the tree's
                dfa = tree_dfa(tree, EMIT_DFA_LIMIT)
            except TooComplex:
                dfa = None
            if dfa is None or not dfa.delta:
                text = json_string_ebnf(tree)
                assert text is not None  # check() refused empty languages
                return text, {}
            return json_string_rules(dfa, prefix)
        return json_string_rules(self.string_dfa(node, self.ctx), prefix)


    def regions(self, obj: ObjectType) -> list:
        """The name regions of an extended object (see `objects.regions`), memoized."""
        if obj not in self._regions:
            from services.grammar.schema.objects import regions

            self._regions[obj] = regions(obj, self, self.ctx)
        return self._regions[obj]


_FINAL_NEWLINE = Repeat(Literal("\n"), 0, 1)  # what Python's `$` adds (regex.search_tree)


def _narrower(a: Node, b: Node) -> bool:
    """True when tree `a`'s language is provably a subset of `b`'s: the same structure with each
    class of `a` inside the one of `b`, where `b` may end sequences with an optional final
    newline (Python's `$`). False where this is not shown (never wrongly True)."""
    if isinstance(b, Seq) and b.items and b.items[-1] == _FINAL_NEWLINE:
        rest = b.items[:-1]
        inner = rest[0] if len(rest) == 1 else Seq(rest)
        if _narrower(a, inner):
            return True
    if type(a) is not type(b):
        return False
    if isinstance(a, Chars):
        return all(any(r0 <= lo and hi <= r1 for r0, r1 in b.charset.ranges)
                   for lo, hi in a.charset.ranges)
    if isinstance(a, Literal):
        return a == b
    if isinstance(a, (Seq, Alt)):
        return len(a.items) == len(b.items) and \
            all(_narrower(x, y) for x, y in zip(a.items, b.items))
    if isinstance(a, Repeat):
        return a.lo == b.lo and a.hi == b.hi and _narrower(a.item, b.item)
    return a == b


def _tree_only(node: StringType) -> bool:
    """One positive pattern and no length: the regex tree is emitted directly."""
    return len(node.patterns) == 1 and not node.patterns[0].negated and node.min_length == 0 and \
        _max_length(node) is None


def _max_length(node: StringType) -> int | None:
    """maxLength and the length bounds of the positive formats' automata (hostname's, which
    narrows what fqdn accepts to names of at most 63 characters)."""
    bounds = [node.max_length] + [formats.STRING_FORMATS.get(p.fmt, (None, None))[1]
                                  for p in node.patterns if p.whole and not p.negated]
    return min((b for b in bounds if b is not None), default=None)


def _empty(p: Pattern) -> str:
    what = "format" if p.whole else "pattern"
    return f"the {what} matches no string (unsatisfiable)"
