"""String `pattern`: search semantics, enforced in the grammar and in const/enum filtering.

A pattern is parsed by our ECMAScript-style parser (`services.grammar.regex.search_tree`: unanchored
unless ^ / $ at the ends of top-level alternatives; \\d \\w ASCII, \\s and `.` as ECMAScript) and
lowered to a JSON string grammar with canonical escapes (`regex_json`); finite values are filtered
by the same tree (`regex_json.whole_matches`), never by Python's `re`, whose \\d \\w \\s `.` and `$`
differ from ECMAScript's.

A pattern that neither our parser nor Python's `re` can read is InvalidSchema; one that only our
parser refuses (lookaround, back-references, \\b, \\p{..}, ...) is UnsupportedSchema. A pattern
together with minLength/maxLength, or several patterns on one string, would need the
string-automaton intersection, which is not built yet: UnsupportedSchema at the pattern's pointer
(finite const/enum candidates are filtered directly by every pattern and length instead). A
pattern that matches no string is UnsupportedSchema too (unsatisfiable), never a dead end.
"""

from __future__ import annotations

import re

from services.grammar.regex import search_tree
from services.grammar.regex.tree import Node
from services.grammar.schema.context import Context
from services.grammar.schema.nodes import Pattern, StringType
from services.grammar.schema.regex_json import json_string_ebnf, whole_matches
from shared.errors import InvalidRegex


class PatternSupport:
    """Checks, matches and compiles the patterns of one reduction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._trees: dict[str, Node] = {}

    def tree(self, pattern: Pattern) -> Node:
        """The search-semantics tree of `pattern` (memoized).

        Raises InvalidSchema (malformed) or UnsupportedSchema (outside the supported subset),
        each at the pattern's pointer."""
        if pattern.source in self._trees:
            return self._trees[pattern.source]
        try:
            tree = search_tree(pattern.source)
        except InvalidRegex as exc:
            try:
                re.compile(pattern.source)
            except (re.error, OverflowError, RecursionError) as py_exc:
                raise self.ctx.invalid(pattern.pointer, f"pattern does not parse: {exc.message} "
                                                        f"({py_exc})") from None
            raise self.ctx.unsupported(pattern.pointer, f"pattern: {exc.message}") from None
        self._trees[pattern.source] = tree
        return tree

    def check(self, node: StringType, ctx: Context) -> None:
        """Raise UnsupportedSchema unless `node`'s patterns can be enforced by `ebnf`."""
        if len(node.patterns) > 1:
            raise ctx.unsupported(node.patterns[1].pointer, "several patterns on one string "
                                  "(their intersection is not supported yet)")
        if node.min_length > 0 or node.max_length is not None:
            raise ctx.unsupported(node.patterns[0].pointer, "pattern together with minLength/"
                                  "maxLength (their intersection is not supported yet)")
        if json_string_ebnf(self.tree(node.patterns[0])) is None:
            raise ctx.unsupported(node.patterns[0].pointer, "the pattern matches no string "
                                  "(unsatisfiable)")

    def matches(self, pattern: Pattern, value: str) -> bool:
        """True when `pattern` finds a match in `value` (ECMAScript semantics, search)."""
        return whole_matches(self.tree(pattern), value)

    def ebnf(self, node: StringType) -> str:
        """EBNF for the JSON strings (quotes included, canonical escapes) `node` allows."""
        self.check(node, self.ctx)
        text = json_string_ebnf(self.tree(node.patterns[0]))
        assert text is not None  # check() refused empty languages
        return text
