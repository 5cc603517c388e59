"""Tokens of user GBNF text: xgrammar 0.2.8's EBNF syntax plus the llama.cpp dialect.

Positions are 1-based line and column (columns count code points). Decoded here, so the parser
never sees raw text: string literals (`value` = the text), character classes (`value` = a CharSet
of scalar values), repetition operators (`value` = (lo, hi)), llama.cpp token references
`<[id]>` / `!<[id]>` (`value` = (id, exclude)).

Escapes, in strings and classes: \\xHH (exactly two hex digits, as llama.cpp reads it; a third hex
digit is refused because xgrammar would read them all), \\uHHHH, \\UHHHHHHHH (not surrogates, at
most U+10FFFF), \\t \\n \\r \\f \\v \\a \\b \\e \\0, and a backslash before ASCII punctuation for
the character itself. Regex shorthands (\\d \\w \\s) and other letter escapes are errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.grammar.regex import charset as cs
from services.grammar.regex.charset import CharSet
from shared.errors import InvalidGrammar

MAX_REPEAT = 1_000_000  # repetition bounds above this are refused (a resource limit)
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07, "b": 0x08,
                   "e": 0x1B, "0": 0x00}
_HEX = frozenset("0123456789abcdefABCDEF")
_PUNCT = {"(": "LPAREN", ")": "RPAREN", "|": "PIPE", ",": "COMMA"}
_QUANT = {"*": (0, None), "+": (1, None), "?": (0, 1)}


@dataclass(frozen=True)
class Tok:
    kind: str  # NAME ASSIGN STRING CLASS LPAREN LOOK RPAREN PIPE COMMA QUANT TOKID EOF
    text: str
    line: int
    column: int
    line_start: bool  # first token on its line
    offset: int  # index into the source
    value: Any = None


def grammar_error(message: str, line: int, column: int) -> InvalidGrammar:
    return InvalidGrammar(f"invalid grammar at line {line}, column {column}: {message}",
                          line=line, column=column)


class Lexer:
    def __init__(self, text: str) -> None:
        self.src = text
        self.pos = 0
        self.line = 1
        self.line_offset = 0  # index of the current line's first character
        self.last_line = 0  # line of the previous token

    def error(self, message: str, offset: int | None = None) -> InvalidGrammar:
        at = self.pos if offset is None else offset
        line = self.src.count("\n", 0, at) + 1
        column = at - (self.src.rfind("\n", 0, at) + 1) + 1
        return grammar_error(message, line, column)

    def peek(self, delta: int = 0) -> str:
        i = self.pos + delta
        return self.src[i] if i < len(self.src) else ""

    def advance(self) -> str:
        ch = self.src[self.pos]
        self.pos += 1
        if ch == "\n":
            self.line += 1
            self.line_offset = self.pos
        elif cs.SURROGATE_LO <= ord(ch) <= cs.SURROGATE_HI:
            raise self.error("a lone surrogate is not a Unicode scalar value", self.pos - 1)
        return ch

    def tokens(self) -> list[Tok]:
        out: list[Tok] = []
        while True:
            self.skip_space()
            tok = self.next_token()
            out.append(tok)
            if tok.kind == "EOF":
                return out

    def skip_space(self) -> None:
        while self.pos < len(self.src):
            ch = self.peek()
            if ch in " \t\r\n":
                self.advance()
            elif ch == "#":
                while self.pos < len(self.src) and self.peek() != "\n":
                    self.advance()
            else:
                return

    def make(self, kind: str, start: int, line: int, column: int, value: Any = None) -> Tok:
        tok = Tok(
            kind, self.src[start : self.pos], line, column, line != self.last_line, start, value
        )
        self.last_line = line
        return tok

    def next_token(self) -> Tok:
        start, line = self.pos, self.line
        column = start - self.line_offset + 1
        ch = self.peek()
        if ch == "":
            return self.make("EOF", start, line, column)
        if ch in NAME_CHARS:
            while self.peek() and self.peek() in NAME_CHARS:
                self.advance()
            return self.make("NAME", start, line, column)
        if self.src.startswith("::=", start):
            self.pos += 3
            return self.make("ASSIGN", start, line, column)
        if ch == '"':
            return self.make("STRING", start, line, column, self.string())
        if ch == "[":
            return self.make("CLASS", start, line, column, self.char_class())
        if ch == "(" and self.peek(1) == "=":
            self.pos += 2
            return self.make("LOOK", start, line, column)
        if ch in _PUNCT:
            self.pos += 1
            return self.make(_PUNCT[ch], start, line, column)
        if ch in _QUANT:
            self.pos += 1
            return self.make("QUANT", start, line, column, _QUANT[ch])
        if ch == "{":
            return self.make("QUANT", start, line, column, self.braces())
        if ch == "<" or (ch == "!" and self.peek(1) == "<"):
            return self.make("TOKID", start, line, column, self.token_ref())
        if ch == "/":
            raise self.error("regex literals /.../ are not supported in grammars")
        raise self.error(f"unexpected character {ch!r}")

    def string(self) -> str:
        start = self.pos
        self.advance()
        out: list[str] = []
        while True:
            ch = self.peek()
            if ch == "":
                raise self.error("unterminated string literal", start)
            if ch == '"':
                self.advance()
                return "".join(out)
            out.append(chr(self.escape(in_class=False)) if ch == "\\" else self.advance())

    def char_class(self) -> CharSet:
        start = self.pos
        self.advance()
        negated = self.peek() == "^"
        if negated:
            self.advance()
        members: list[tuple[int, int]] = []
        if self.peek() == "]" and not negated:
            raise self.error("an empty character class [] matches nothing", start)
        while self.peek() != "]":
            if self.peek() == "":
                raise self.error("unterminated character class", start)
            lo = self.class_char()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.advance()
                hi_at = self.pos
                hi = self.class_char()
                if hi < lo:
                    raise self.error("character range out of order", hi_at)
                members.append((lo, hi))
            else:
                members.append((lo, lo))
        self.advance()
        chars = CharSet.of(members)
        # Only Unicode scalar values: xgrammar's own negated classes also admit surrogates.
        return chars.invert() if negated else chars.scalars()

    def class_char(self) -> int:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        return ord(self.advance())

    def escape(self, *, in_class: bool) -> int:
        start = self.pos
        self.advance()
        ch = self.peek()
        if ch == "":
            raise self.error("the text ends inside an escape", start)
        self.advance()
        if ch in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[ch]
        if ch in ("x", "u", "U"):
            count = {"x": 2, "u": 4, "U": 8}[ch]
            digits = self.src[self.pos:self.pos + count]
            if len(digits) != count or any(c not in _HEX for c in digits):
                raise self.error(f"\\{ch} needs exactly {count} hex digits", start)
            self.pos += count
            if ch == "x" and self.peek() and self.peek() in _HEX:
                raise self.error("\\x followed by more than two hex digits is ambiguous (llama.cpp "
                                 "reads two, xgrammar all); write \\uHHHH or \\UHHHHHHHH", start)
            cp = int(digits, 16)
            if cs.SURROGATE_LO <= cp <= cs.SURROGATE_HI or cp > cs.MAX_CODE_POINT:
                raise self.error(f"U+{cp:04X} is not a Unicode scalar value", start)
            return cp
        if ch.isascii() and not ch.isalnum() and 0x20 <= ord(ch) < 0x7F:
            return ord(ch)
        if in_class and ch in "dDwWsS":
            raise self.error(f"\\{ch} is not supported in character classes; write the ranges "
                             "explicitly (e.g. [0-9])", start)
        raise self.error(f"unknown escape \\{ch}", start)

    def braces(self) -> tuple[int, int | None]:
        start = self.pos
        self.advance()
        lo = self.number()
        hi: int | None = lo
        if self.skip_blanks() == ",":
            self.advance()
            hi = self.number()
            if lo is None and hi is None:
                raise self.error("repetition {,} needs a bound", start)
            lo = 0 if lo is None else lo
        if self.skip_blanks() != "}" or lo is None:
            raise self.error("malformed repetition; expected {m}, {m,}, {m,n} or {,n}", start)
        self.advance()
        if hi is not None and lo > hi:
            raise self.error(f"repetition {{{lo},{hi}}} has its bounds out of order", start)
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"repetition bound exceeds {MAX_REPEAT}", start)
        return lo, hi

    def skip_blanks(self) -> str:
        while self.peek() in (" ", "\t"):
            self.advance()
        return self.peek()

    def number(self) -> int | None:
        self.skip_blanks()
        begin = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.advance()
        return int(self.src[begin:self.pos]) if self.pos > begin else None

    def token_ref(self) -> tuple[int, bool]:
        start = self.pos
        exclude = self.peek() == "!"
        if exclude:
            self.advance()
        end = self.src.find(">", self.pos)
        body = self.src[self.pos + 1:end] if end >= 0 else ""
        if not (body.startswith("[") and body.endswith("]") and body[1:-1].isdigit()
                and body[1:-1].isascii()):
            raise self.error("only token-id references <[id]> / !<[id]> are supported; "
                             "write Token(id) instead of a token spelling", start)
        while self.pos <= end:
            self.advance()
        return int(body[1:-1]), exclude
