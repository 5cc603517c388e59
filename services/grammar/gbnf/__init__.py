"""User GBNF -> xgrammar EBNF with the same language (design document: GBNF paragraphs).

We parse the text ourselves (`lexer.py`, `parser.py`) instead of handing it to xgrammar: that
gives exact line/column errors, structural checks of `Token` ids and forbidden constructors, the
llama.cpp dialect (empty alternatives, `.`, `{,n}`, `<[id]>`, two-digit `\\x`), and control over
constructs where xgrammar's reading differs from the contract (negated classes admitting
surrogates, `ExcludeToken` admitting control tokens). What xgrammar receives is regenerated text
built only from constructs whose language the tests enumerate, after the language-preserving
rewrites of `rewrite.py` (character-set merging, repetitions as annotated right recursion) that
keep xgrammar's masks cheap.
"""

from __future__ import annotations

from services.grammar.gbnf.lexer import Lexer
from services.grammar.gbnf.parser import Rule, parse_rules
from services.grammar.gbnf.rewrite import optimize
from services.grammar.regex.tree import to_ebnf
from shared.frontends.token_domain import TokenDomain


def gbnf_to_ebnf(text: str, domain: TokenDomain) -> str:
    """Validate user GBNF (entry rule `root`) and return equivalent xgrammar 0.2.8 EBNF text.

    `Token(...)` / `ExcludeToken(...)` ids must be ordinary tokens of `domain`; `ExcludeToken`
    never admits the domain's control tokens. Raises InvalidGrammar with 1-based `line` and
    `column` (none for a missing `root`)."""
    return rules_to_ebnf(optimize(parse_rules(Lexer(text).tokens(), domain)))


def rules_to_ebnf(rules) -> str:
    """xgrammar EBNF text of rules (`name`, `body`, `lookahead` trees), the first one `root`."""
    lines = []
    for rule in rules:
        line = f"{rule.name} ::= {to_ebnf(rule.body)}"
        if rule.lookahead is not None:
            line += f" (= {to_ebnf(rule.lookahead)})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def regex_to_optimized_ebnf(pattern: str) -> str:
    """A whole-content regex as EBNF (entry `root`) after the same language-preserving rewrites.
    Raises InvalidRegex (0-based position)."""
    from services.grammar.regex.parser import parse_regex
    from services.grammar.regex.tree import alt

    tree = alt([b.node for b in parse_regex(pattern)])
    return rules_to_ebnf(optimize([Rule("root", tree, None)]))


__all__ = ["gbnf_to_ebnf", "regex_to_optimized_ebnf", "rules_to_ebnf"]
