"""Writers for llguidance's Lark dialect: string literals, regex terminals from our expression tree,
and the EBNF expressions our converters produce read back as trees.

- `lark_literal(text)`: Lark string literals use JSON string syntax (llguidance's lexer);
- `rust_regex(node)`: a `/.../` terminal body in the syntax of Rust's regex crate, which llguidance
  (derivre) reads; every character that is not an ASCII letter or digit is written as `\\x{H}`, so
  no character is ever read as syntax (the `/` delimiter included). Classes are sets of Unicode
  scalar values, which is what the regex crate's classes are, so surrogates never match;
- `ebnf_tree(text)`: an EBNF expression of literals, classes, groups, `|` and repetitions (what
  `services.grammar.schema.numbers` writes) parsed by our own GBNF front end;
- `embed_lark(text, prefix)`: one of our converters' whole Lark grammars renamed so that several
  live in one grammar (the Hermes tool grammar's argument and content schemas).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from services.grammar.regex.charset import CharSet
from services.grammar.regex.tree import Alt, Chars, Literal, Node, Repeat, Seq, quantifier
from shared.frontends.token_domain import TokenDomain


def lark_literal(text: str) -> str:
    """A Lark string literal matching `text` exactly (JSON string syntax, ASCII only)."""
    return json.dumps(text, ensure_ascii=True)


def _char(cp: int) -> str:
    ch = chr(cp)
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{cp:x}}}"


def _class(cs: CharSet) -> str:
    if not cs.ranges:
        raise ValueError("an empty class has no regex form (prune it first)")
    if cs.single is not None:
        return _char(cs.single)
    return "[" + "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}"
                         for lo, hi in cs.ranges) + "]"


def rust_regex(node: Node) -> str:
    """Regex text (Rust regex syntax) whose whole-match language is `node`'s."""
    if isinstance(node, Literal):
        return "".join(_char(ord(c)) for c in node.text)
    if isinstance(node, Chars):
        return _class(node.charset)
    if isinstance(node, Seq):
        return "".join(f"(?:{rust_regex(i)})" if isinstance(i, Alt) else rust_regex(i)
                       for i in node.items)
    if isinstance(node, Alt):
        return "|".join(rust_regex(i) for i in node.items)
    if isinstance(node, Repeat):
        inner = rust_regex(node.item)
        atom = inner if isinstance(node.item, Chars) or (
            isinstance(node.item, Literal) and len(node.item.text) == 1) else f"(?:{inner})"
        return atom + quantifier(node.lo, node.hi)
    raise TypeError(f"{type(node).__name__} has no regex form")


@lru_cache(maxsize=1)
def _no_tokens() -> TokenDomain:
    return TokenDomain(name="none", token_bytes=(), size=0, eos_ids=frozenset(),
                       control_ids=frozenset())


@lru_cache(maxsize=4096)
def ebnf_tree(text: str) -> Node:
    """The tree of one EBNF expression without rule references or token terminals."""
    from services.grammar.gbnf.lexer import Lexer
    from services.grammar.gbnf.parser import parse_rules

    [rule] = parse_rules(Lexer(f"root ::= {text}").tokens(), _no_tokens())
    return rule.body


_LARK_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:", re.M)
_LARK_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|/(?:[^/\\]|\\.)*/|[A-Za-z_][A-Za-z0-9_]*')
_OPTIONS = re.compile(r"^%llguidance .*\n", re.M)


def embed_lark(text: str, prefix: str) -> tuple[str, str]:
    """Rename every rule and lexeme of a whole Lark grammar (entry `start`, as our converters write
    it) with `prefix` (lower case for rules, upper case for lexemes, as Lark tells them apart);
    its `%llguidance` options line is dropped (the enclosing grammar writes its own).

    Returns (rules text, the renamed entry rule). Literals and regex bodies are left untouched."""
    names = set(_LARK_RULE.findall(text))

    def rename(m: re.Match) -> str:
        tok = m.group(0)
        if tok not in names:
            return tok
        return (prefix.upper() if tok[0].isupper() else prefix.lower()) + tok

    body = _LARK_TOKEN.sub(rename, _OPTIONS.sub("", text))
    return body, prefix.lower() + "start"
