"""The two grammar syntaxes the schema emitter writes: xgrammar EBNF and llguidance Lark.

Both write the same language. They differ in where the terminals are: in EBNF every string,
number and whitespace run is made of rules and character classes; in Lark each is one lexeme
(a regex terminal), which llguidance's lexer matches in one automaton. The whitespace run between
JSON tokens is at most 32 characters in both (`[ \\t\\n\\r]{0,32}` / an optional
`/[ \\t\\n\\r]{1,32}/`).

A Lark grammar never relies on the lexer's longest-match choice: every terminal here ends where
the next one cannot continue it (a string ends at its closing quote, a number before whitespace,
`,`, `}`, `]` or the end, a whitespace run before a non-whitespace character).
"""

from __future__ import annotations

import json
from typing import Callable

from services.grammar.engines.lark import ebnf_tree, lark_literal, rust_regex
from services.grammar.regex.charset import ANY
from services.grammar.regex.tree import Chars, Literal, Node, Repeat, Seq, ebnf_literal, to_ebnf
from services.grammar.schema.regex_json import lower
from services.grammar.schema.strings import (
    CHAR_RULE,
    MAX_WHITESPACE,
    STRING_SUB_RULE,
    bounded_string_rules,
    key_excluding,
)

NOTHING_TEXT = "\x00\x00"  # the body of a rule no reachable output uses (a NoValue node)


class EbnfSyntax:
    """xgrammar EBNF (rules `name ::= body`)."""

    name = "xgrammar"
    ws = "ws"

    def __init__(self) -> None:
        self.extra: dict[str, str] = {}

    def rule(self, name: str, body: str) -> str:
        return f"{name} ::= {body}\n"

    def lit(self, text: str) -> str:
        return ebnf_literal(text)

    def base(self) -> str:
        return (f"ws ::= [ \\t\\n\\r]{{0,{MAX_WHITESPACE}}}\nchar ::= {CHAR_RULE}\n"
                f'string ::= "\\"" string_sub\nstring_sub ::= {STRING_SUB_RULE}\n')

    def string(self, lo: int, hi: int | None) -> str:
        if lo == 0 and hi is None:
            return "string"
        chained = bounded_string_rules(lo, hi, self.extra)
        if chained is not None:
            return f'"\\"" {chained}'
        return f'"\\"" char{{{lo},{"" if hi is None else hi}}} "\\""'

    def pattern_string(self, body: Node) -> str:
        return to_ebnf(Seq((Literal('"'), body, Literal('"'))))

    def expression(self, ebnf: str) -> str:
        return f"({ebnf})"

    def key(self, names: list[str], fresh: Callable[[str], str]) -> str:
        """A JSON string (quotes included) that is none of `names`."""
        name = fresh("k")
        self.extra.update(key_excluding(names, name))
        return name

    def rules_text(self) -> str:
        return "".join(self.rule(k, v) for k, v in self.extra.items())

    def start(self, root: str) -> str:
        return f"root ::= {root}\n"


class LarkSyntax:
    """llguidance Lark (rules `name: body`, terminals `NAME: /regex/`)."""

    name = "llguidance"
    ws = "WS?"

    def __init__(self) -> None:
        self.terminals: dict[str, str] = {}  # definition -> terminal name
        self.unit = lower(Chars(ANY))  # one canonical JSON string unit

    def rule(self, name: str, body: str) -> str:
        return f"{name}: {body}\n"

    def lit(self, text: str) -> str:
        return lark_literal(text)

    def base(self) -> str:
        return f"WS: /[\\x{{20}}\\x{{9}}\\x{{a}}\\x{{d}}]{{1,{MAX_WHITESPACE}}}/\n"

    def _terminal(self, prefix: str, definition: str) -> str:
        if definition not in self.terminals:
            self.terminals[definition] = f"{prefix}{len(self.terminals)}"
        return self.terminals[definition]

    def _regex(self, prefix: str, node: Node) -> str:
        return self._terminal(prefix, f"/{rust_regex(node)}/")

    def string(self, lo: int, hi: int | None) -> str:
        return self._regex("S", Seq((Literal('"'), Repeat(self.unit, lo, hi), Literal('"'))))

    def pattern_string(self, body: Node) -> str:
        return self._regex("P", Seq((Literal('"'), body, Literal('"'))))

    def expression(self, ebnf: str) -> str:
        return self._regex("N", ebnf_tree(ebnf))

    def key(self, names: list[str], fresh: Callable[[str], str]) -> str:
        any_key = self.string(0, None)
        if not names:
            return any_key
        excluded = " | ".join(lark_literal(json.dumps(n, ensure_ascii=False)) for n in names)
        return self._terminal("K", f"{any_key} & ~({excluded})")

    def rules_text(self) -> str:
        return "".join(f"{name}: {definition}\n" for definition, name in self.terminals.items())

    def start(self, root: str) -> str:
        # no_forcing: where the grammar forces bytes, every token of them stays legal (llguidance
        # otherwise admits only its own tokenization of the forced text there).
        return f'%llguidance {{"no_forcing": true}}\nstart: {root}\n'
