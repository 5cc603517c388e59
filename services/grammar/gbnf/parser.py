"""GBNF tokens -> rules of the shared expression tree, with every contract check made structurally.

Syntax (xgrammar 0.2.8's EBNF with the llama.cpp dialect): `name ::= alternatives [(= lookahead)]`,
a rule definition starting its own line; a body runs until the next `name ::=` or the end, across
lines (a superset of llama.cpp, which ends a body at a newline outside parentheses). Alternatives
may be empty anywhere (llama.cpp's `ws ::= | " "`). Elements: string literals, character classes,
rule references, `( ... )`, `.` (any character, llama.cpp), `Token(id, ...)`,
`ExcludeToken(id, ...)`, `<[id]>` and `!<[id]>` (llama.cpp token references); each may carry
`* + ? {m} {m,} {m,n} {,n}` (stacked operators nest). A name with dots is a rule only when a rule
of that exact name exists (xgrammar allows dots in names); otherwise each `.` in it is llama.cpp's
any-character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.grammar.gbnf.lexer import Tok, grammar_error
from services.grammar.regex.charset import ANY
from services.grammar.regex.tree import Chars, Literal, Node, Ref, Repeat, Tokens, alt, seq
from shared.errors import InvalidGrammar
from shared.frontends.token_domain import TokenDomain

TOKEN_CALLS = frozenset({"Token", "ExcludeToken"})
UNSUPPORTED_CALLS = frozenset({"TagDispatch", "TokenTagDispatch", "Regex", "Substring"})
_XGRAMMAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_XGRAMMAR_KEYWORDS = frozenset({"true", "false"})  # lexed as booleans by xgrammar


@dataclass(frozen=True)
class Rule:
    name: str  # as emitted (renamed where xgrammar would misread the user's name)
    body: Node
    lookahead: Node | None


def parse_rules(tokens: list[Tok], domain: TokenDomain) -> list[Rule]:
    """The rules of a tokenized grammar, `root` first. Raises InvalidGrammar (line, column)."""
    return _Parser(tokens, domain).parse()


def _error(tok: Tok, message: str) -> InvalidGrammar:
    return grammar_error(message, tok.line, tok.column)


class _Parser:
    def __init__(self, tokens: list[Tok], domain: TokenDomain) -> None:
        self.toks = tokens
        self.i = 0
        self.domain = domain
        self.names = self.rule_names()

    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def at_rule_start(self, j: int | None = None) -> bool:
        j = self.i if j is None else j
        return self.toks[j].kind == "NAME" and self.toks[j + 1].kind == "ASSIGN"

    def rule_names(self) -> dict[str, str]:
        """Every defined rule name -> the name written for xgrammar."""
        defined: list[str] = []
        for j, tok in enumerate(self.toks):
            if tok.kind != "ASSIGN":
                continue
            prev = self.toks[j - 1] if j else None
            if (
                prev is not None
                and prev.kind == "CLASS"
                and j >= 2
                and self.toks[j - 2].kind == "NAME"
            ):
                raise _error(prev, "rule attributes name[...] are not supported")
            if prev is None or prev.kind != "NAME":
                raise _error(tok, "'::=' must follow a rule name")
            if not prev.line_start:
                raise _error(prev, "a rule definition must start its own line")
            if prev.text in TOKEN_CALLS | UNSUPPORTED_CALLS:
                raise _error(prev, f"'{prev.text}' is a reserved name")
            if prev.text in defined:
                raise _error(prev, f"rule '{prev.text}' is defined twice")
            defined.append(prev.text)
        used = {n for n in defined if _XGRAMMAR_NAME.match(n) and n not in _XGRAMMAR_KEYWORDS}
        names: dict[str, str] = {}
        counter = 0
        for name in defined:
            if name in used:
                names[name] = name
                continue
            while f"rule_{counter}" in used:
                counter += 1
            names[name] = f"rule_{counter}"
            used.add(names[name])
        return names

    def parse(self) -> list[Rule]:
        rules: list[Rule] = []
        while self.tok.kind != "EOF":
            if not self.at_rule_start():
                raise _error(self.tok, "expected a rule definition 'name ::= ...'")
            name = self.names[self.tok.text]
            self.i += 2
            body = self.alternatives(lookahead=False)
            lookahead = None
            if self.tok.kind == "LOOK":
                look_tok = self.tok
                self.i += 1
                lookahead = self.alternatives(lookahead=True)
                self.expect_rparen(look_tok)
                if not (self.tok.kind == "EOF" or self.at_rule_start()):
                    raise _error(self.tok, "a lookahead (= ...) must end its rule")
            if self.tok.kind == "RPAREN":
                raise _error(self.tok, "unmatched ')'")
            rules.append(Rule(name, body, lookahead))
        if "root" not in self.names:
            raise InvalidGrammar("the grammar has no entry rule 'root'")
        rules.sort(key=lambda r: r.name != "root")
        return rules

    def expect_rparen(self, opener: Tok) -> None:
        if self.tok.kind != "RPAREN":
            raise _error(opener, "unclosed '('")
        self.i += 1

    def alternatives(self, *, lookahead: bool) -> Node:
        branches = [self.sequence(lookahead)]
        while self.tok.kind == "PIPE":
            self.i += 1
            branches.append(self.sequence(lookahead))
        return alt(self.merge_token_branches(branches))

    def merge_token_branches(self, branches: list[Node]) -> list[Node]:
        """Alternatives that are single token terminals, merged into one when any excludes.

        xgrammar 0.2.8 masks `ExcludeToken(a) | ExcludeToken(b)` as if it were the intersection
        (neither a nor b legal) although it accepts both; the union is one ExcludeToken of the
        ids every branch refuses. (Exclusions at one position reached through different rules or
        sequences are not merged: see the report and tests/grammar/test_grammar_gbnf.py.)"""
        tokens = [b for b in branches if isinstance(b, Tokens)]
        if len(tokens) < 2 or not any(t.exclude for t in tokens):
            return branches
        refused = set.intersection(*(set(t.ids) for t in tokens if t.exclude))
        refused -= {i for t in tokens if not t.exclude for i in t.ids}
        refused |= self.domain.control_ids  # the included ids are ordinary: controls stay out
        if not refused:  # ExcludeToken needs an id; EOS and never-generable ids are never legal
            refused = set(sorted(self.domain.eos_ids | self.domain.never_ids)[:1])
        if not refused:
            return branches
        merged = Tokens(tuple(sorted(refused)), True)
        rest = [b for b in branches if not isinstance(b, Tokens)]
        return [merged, *rest]

    def sequence(self, lookahead: bool) -> Node:
        items: list[Node] = []
        while True:
            tok = self.tok
            if tok.kind in ("PIPE", "RPAREN", "LOOK", "EOF") or self.at_rule_start():
                return seq(items)
            if tok.kind == "QUANT":
                if not items:
                    raise _error(tok, f"nothing to repeat before '{tok.text}'")
                lo, hi = tok.value
                items[-1] = Repeat(items[-1], lo, hi)
                self.i += 1
                continue
            items.extend(self.element(lookahead))

    def element(self, lookahead: bool) -> list[Node]:
        tok = self.tok
        if tok.kind == "STRING":
            self.i += 1
            return [Literal(tok.value)]
        if tok.kind == "CLASS":
            self.i += 1
            return [Chars(tok.value)]
        if tok.kind == "LPAREN":
            self.i += 1
            node = self.alternatives(lookahead=lookahead)
            self.expect_rparen(tok)
            return [node]
        if tok.kind == "TOKID":
            self.i += 1
            token_id, exclude = tok.value
            return [self.tokens([token_id], exclude, tok, lookahead)]
        if tok.kind == "NAME":
            nxt = self.toks[self.i + 1]
            if tok.text in TOKEN_CALLS and nxt.kind == "LPAREN":
                return [self.token_call(lookahead)]
            if tok.text in UNSUPPORTED_CALLS and nxt.kind == "LPAREN":
                raise _error(tok, f"{tok.text}(...) is not supported in grammars")
            self.i += 1
            return self.references(tok)
        raise _error(tok, f"unexpected '{tok.text}'")

    def references(self, tok: Tok) -> list[Node]:
        if tok.text in self.names:
            return [Ref(self.names[tok.text])]
        if "." not in tok.text:
            raise _error(tok, f"rule '{tok.text}' is not defined")
        out: list[Node] = []
        column = tok.column
        for part in re.split(r"(\.)", tok.text):
            if part == ".":
                out.append(Chars(ANY))
            elif part:
                if part not in self.names:
                    raise grammar_error(f"rule '{part}' is not defined", tok.line, column)
                out.append(Ref(self.names[part]))
            column += len(part)
        return out

    def token_call(self, lookahead: bool) -> Node:
        name_tok = self.tok
        self.i += 2
        ids: list[int] = []
        while True:
            tok = self.tok
            if tok.kind != "NAME" or not (tok.text.isascii() and tok.text.isdigit()):
                raise _error(tok, f"{name_tok.text}(...) takes non-negative integer token ids")
            ids.append(self.checked_id(int(tok.text), tok))
            self.i += 1
            if self.tok.kind == "COMMA":
                self.i += 1
            elif self.tok.kind == "RPAREN":
                self.i += 1
                break
            else:
                raise _error(self.tok, f"expected ',' or ')' in {name_tok.text}(...)")
        return self.tokens(ids, name_tok.text == "ExcludeToken", name_tok, lookahead)

    def tokens(self, ids: list[int], exclude: bool, tok: Tok, lookahead: bool) -> Node:
        if lookahead:
            raise _error(tok, "token terminals are not allowed in a lookahead (= ...)")
        for token_id in ids:
            self.checked_id(token_id, tok)
        chosen = set(ids)
        if exclude:
            # xgrammar's ExcludeToken admits every other id, control tokens included: keep them out.
            chosen |= self.domain.control_ids
        return Tokens(tuple(sorted(chosen)), exclude)

    def checked_id(self, token_id: int, tok: Tok) -> int:
        d = self.domain
        if d.is_ordinary(token_id):
            return token_id
        if token_id in d.eos_ids:
            why = "is an end-of-sequence token (EOS belongs to the completion rules)"
        elif token_id in d.control_ids:
            why = "is a control token reserved for the model's framing"
        elif token_id < d.size:
            why = "can never be generated"
        else:
            why = f"is out of range (the vocabulary has {d.size} ids)"
        raise _error(tok, f"token id {token_id} {why}")
