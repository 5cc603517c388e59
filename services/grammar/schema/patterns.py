"""String `pattern` support: search semantics through `services.grammar.regex.normalize_regex`.

Until that module provides `normalize_regex` and `regex_json` lowers its output into JSON-escaped
string grammar (not written yet), every pattern is UnsupportedSchema at its pointer.
A pattern together with minLength/maxLength, or several patterns on one string, would need a
string-automaton intersection that is not built yet: UnsupportedSchema too.
"""

from __future__ import annotations

import re
from typing import Callable

from services.grammar.schema.context import Context
from services.grammar.schema.nodes import Pattern, StringType


def _normalizer() -> Callable[..., str] | None:
    """`normalize_regex` when both it and the JSON-string lowering of its output are available."""
    try:
        from services.grammar.regex import normalize_regex  # type: ignore[attr-defined]
        from services.grammar.schema import regex_json  # noqa: F401  # type: ignore[attr-defined]
    except ImportError:
        return None
    return normalize_regex


class PatternSupport:
    """Checks, matches and compiles the patterns of one reduction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._normalized: dict[str, str] = {}

    def normalized(self, pattern: Pattern) -> str:
        if pattern.source in self._normalized:
            return self._normalized[pattern.source]
        try:
            re.compile(pattern.source)
        except re.error as exc:
            raise self.ctx.invalid(pattern.pointer, f"pattern does not parse: {exc}") from None
        normalize = _normalizer()
        if normalize is None:
            raise self.ctx.unsupported(pattern.pointer, "pattern is not supported yet")
        from shared.errors import InvalidRegex

        try:
            text = normalize(pattern.source, search=True)
        except InvalidRegex as exc:
            raise self.ctx.unsupported(pattern.pointer, f"pattern: {exc.message}") from None
        self._normalized[pattern.source] = text
        return text

    def check(self, node: StringType, ctx: Context) -> None:
        if len(node.patterns) > 1:
            raise ctx.unsupported(node.patterns[1].pointer, "several patterns on one string "
                                  "(their intersection is not supported yet)")
        if node.min_length > 0 or node.max_length is not None:
            raise ctx.unsupported(node.patterns[0].pointer, "pattern together with minLength/"
                                  "maxLength (their intersection is not supported yet)")
        self.normalized(node.patterns[0])

    def matches(self, pattern: Pattern, value: str) -> bool:
        return re.fullmatch(self.normalized(pattern), value, re.DOTALL) is not None

    def ebnf(self, node: StringType) -> str:
        from services.grammar.schema.regex_json import regex_to_json_string_ebnf

        self.check(node, self.ctx)
        return regex_to_json_string_ebnf(self.normalized(node.patterns[0]))

