"""String `pattern`: search semantics, enforced in the grammar and in const/enum filtering.

A pattern is parsed by our ECMAScript-style parser (`services.grammar.regex.search_tree`: unanchored
unless ^ / $ at the ends of top-level alternatives; \\d \\w ASCII, \\s and `.` as ECMAScript) and
lowered to a JSON string grammar with canonical escapes (`regex_json`); finite values are filtered
by the same tree (`regex_json.whole_matches`), never by Python's `re`, whose \\d \\w \\s `.` and `$`
differ from ECMAScript's.

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

from services.grammar.regex import search_tree, whole_tree
from services.grammar.regex.charset import ANY as ANY_CHAR
from services.grammar.regex.tree import Chars, Literal, Node, Repeat
from services.grammar.schema.automata import Dfa, TooComplex, combine, intersect, json_string_rules, tree_dfa
from services.grammar.schema.context import Context
from services.grammar.schema.nodes import ObjectType, Pattern, StringType
from services.grammar.schema.regex_json import json_string_ebnf, whole_matches
from shared.errors import InvalidRegex, InvalidSchema, UnsupportedSchema


# A single pattern or format is emitted as its minimal DFA when the subset construction stays below
# this many states (measured on the Qwen3.5 vocabulary: email mask p50 481 -> 7 us, uri 471 -> 14 us,
# ipv6 156 -> 4 us, compile time comparable), else as the regex tree.
EMIT_DFA_LIMIT = 2048


class PatternSupport:
    """Checks, matches and compiles the patterns of one reduction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._trees: dict[tuple[str, bool, bool], Node] = {}
        self._dfas: dict[StringType, Dfa] = {}
        self._regions: dict[ObjectType, list] = {}

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

    def check(self, node: StringType, ctx: Context) -> None:
        """Raise UnsupportedSchema unless `node`'s patterns (and lengths) can be enforced."""
        if _tree_only(node):
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
            for p in positive:
                dfas.append(tree_dfa(self.tree(p)))
                if not dfas[-1].delta:
                    raise ctx.unsupported(p.pointer, _empty(p))
            dfa = intersect(tuple(dfas), node.min_length, node.max_length)
            negative = tuple(tree_dfa(self.tree(p)) for p in node.patterns if p.negated)
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
        """Whether no string satisfies `node` (its patterns, formats and lengths together); None
        where that is not decided: a pattern outside the supported subset, or past the automaton
        limits. Errors are not raised here: the node is checked where it is emitted."""
        try:
            self.string_dfa(node, self.ctx)
        except UnsupportedSchema as exc:
            return True if exc.message.endswith("(unsatisfiable)") else None
        except InvalidSchema:
            return None
        return False

    def matches(self, pattern: Pattern, value: str) -> bool:
        """True when `pattern` finds a match in `value` (ECMAScript semantics, search), or for a
        format, when the whole value matches."""
        return whole_matches(self.tree(pattern), value) != pattern.negated

    def ebnf(self, node: StringType, prefix: str) -> tuple[str, dict[str, str]]:
        """EBNF for the JSON strings (quotes included, canonical escapes) `node` allows: an
        expression and the rules it uses (named `prefix`...)."""
        self.check(node, self.ctx)
        if _tree_only(node):
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


def _tree_only(node: StringType) -> bool:
    """One positive pattern and no length: the regex tree is emitted directly."""
    return len(node.patterns) == 1 and not node.patterns[0].negated and node.min_length == 0 and \
        node.max_length is None


def _empty(p: Pattern) -> str:
    what = "format" if p.whole else "pattern"
    return f"the {what} matches no string (unsatisfiable)"
