"""An ECMAScript-style regex parser producing the shared expression tree.

The accepted subset and its semantics (design document, regex paragraphs): literals and any Unicode
characters written directly, classes (`[...]`, `[^...]`, ranges, `\\d \\w \\s` and negations, `.`),
groups (capturing, named, `(?:...)`), alternatives, `* + ? {m} {m,} {m,n}` and their lazy forms
(same legal set), escapes `\\xNN \\uNNNN \\u{N...} \\cX \\t \\n \\r \\f \\v \\0` and escaped
punctuation. `\\d`/`\\w` are ASCII, `\\s` is ECMAScript's WhiteSpace + LineTerminator set, `.`
excludes \\n, \\r, U+2028, U+2029, and negated classes hold only Unicode scalar values.
`^`/`$` are accepted only at the ends of the expression or of a top-level alternative. A JSON
Schema `pattern` (`schema=True`) also admits them at the ends of the alternatives of a group that
is a whole top-level alternative (`(^a$)|(^b$)`: searching for `(A|B)` is searching for A or B),
and a `]` outside a class as a literal, as ECMAScript's web grammar (Annex B) and Python read it.
Everything else (back-references, lookaround, `\\b \\B`, `\\p{..}`, inline flags, surrogate escapes,
unknown escapes, stray `{ }`, a stray `]` outside a pattern) raises InvalidRegex with the 0-based
position of the offending construct.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.grammar.regex import charset as cs
from services.grammar.regex.charset import CharSet
from services.grammar.regex.tree import Chars, Node, Repeat, alt, seq
from shared.errors import InvalidRegex

MAX_REPEAT = 1_000_000  # repetition bounds above this are refused (a resource limit)
_CLASS_ESCAPES = {"d": cs.DIGIT, "w": cs.WORD, "s": cs.SPACE}
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_HEX = "0123456789abcdefABCDEF"


@dataclass(frozen=True)
class Branch:
    """One top-level alternative and whether it was anchored with ^ / $."""

    node: Node
    starts_anchored: bool
    ends_anchored: bool


def parse_regex(pattern: str, *, python: bool = False, schema: bool = False) -> list[Branch]:
    """Parse `pattern` into its top-level alternatives. Raises InvalidRegex (0-based position).

    `python=True` reads it as Python's `re` does (the reading of the validators users run, e.g.
    `jsonschema`): `.` excludes only \\n, `\\d \\w \\s` are Unicode (`charset.python_class`), and
    constructs whose meaning differs structurally (`[]`, `[^]`, `\\c`, `\\u{..}`,
    `(?<name>..)`) raise InvalidRegex. A `$` anchor is recorded as in ECMAScript; Python's
    extra match before a final newline is added by the caller (`regex.search_tree`).

    `schema=True` is the JSON Schema `pattern` reading, which admits two forms the regex entry
    refuses: anchors at the ends of a group that is a whole top-level alternative, and a literal
    `]` (see the module docstring)."""
    return _Parser(pattern, python, schema).parse()


class _Parser:
    def __init__(self, pattern: str, python: bool = False, schema: bool = False) -> None:
        self.src = pattern
        self.pos = 0
        self.python = python
        self.schema = schema
        self.ends = ("", "|")  # what may follow a `$` that ends an alternative

    # ---- helpers
    def peek(self, delta: int = 0) -> str:
        i = self.pos + delta
        return self.src[i] if i < len(self.src) else ""

    def error(self, message: str, position: int | None = None) -> InvalidRegex:
        at = self.pos if position is None else position
        return InvalidRegex(f"invalid regex at position {at}: {message}", position=at)

    # ---- grammar
    def parse(self) -> list[Branch]:
        branches = self.alternative()
        while self.peek() == "|":
            self.pos += 1
            branches.extend(self.alternative())
        if self.pos < len(self.src):
            assert self.peek() == ")"
            raise self.error("unmatched ')'")
        return branches

    def alternative(self) -> list[Branch]:
        """One top-level alternative; a group that is the whole alternative and holds anchors,
        `(^a$)|(^b$)`, is its own alternatives: searching for `(A|B)` is searching for A or for
        B, so `^`/`$` at the ends of A and B keep their top-level meaning."""
        if self.schema and self.peek() == "(":
            saved = self.pos
            try:
                inner = self.anchored_group()
            except InvalidRegex:
                inner = None
            if inner is not None and self.peek() in self.ends and any(
                b.starts_anchored or b.ends_anchored for b in inner
            ):
                return inner
            self.pos = saved
        return [self.branch()]

    def anchored_group(self) -> list[Branch]:
        self.pos += 1
        if self.peek() == "?":
            if self.peek(1) != ":":
                raise self.error("only a plain or non-capturing group is read as alternatives")
            self.pos += 2
        outer, self.ends = self.ends, ("", "|", ")")
        try:
            branches = self.alternative()
            while self.peek() == "|":
                self.pos += 1
                branches.extend(self.alternative())
        finally:
            self.ends = outer
        if self.peek() != ")":
            raise self.error("unclosed group '('")
        self.pos += 1
        return branches

    def branch(self) -> Branch:
        start = self.peek() == "^"
        if start:
            self.pos += 1
        items = self.sequence(top=True)
        end = self.peek() == "$"
        if end:
            self.pos += 1
            if self.peek() not in self.ends:
                raise self.error("'$' is allowed only at the end of the expression or of a "
                                 "top-level alternative", self.pos - 1)
        return Branch(seq(items), start, end)

    def disjunction(self) -> Node:
        branches = [seq(self.sequence(top=False))]
        while self.peek() == "|":
            self.pos += 1
            branches.append(seq(self.sequence(top=False)))
        return alt(branches)

    def sequence(self, *, top: bool) -> list[Node]:
        items: list[Node] = []
        while True:
            ch = self.peek()
            if ch in ("", "|", ")"):
                return items
            if ch == "$" and top and self.peek(1) in self.ends:
                return items
            if ch in ("^", "$"):
                raise self.error(f"'{ch}' is allowed only at the ends of the expression or of a "
                                 "top-level alternative")
            items.append(self.quantified(self.atom()))

    def quantified(self, atom: Node) -> Node:
        start = self.pos
        ch = self.peek()
        if ch == "*":
            lo, hi = 0, None
            self.pos += 1
        elif ch == "+":
            lo, hi = 1, None
            self.pos += 1
        elif ch == "?":
            lo, hi = 0, 1
            self.pos += 1
        elif ch == "{":
            lo, hi = self.braces()
        else:
            return atom
        if self.peek() == "?":  # lazy: the same legal set
            self.pos += 1
        if self.peek() in ("*", "+", "?", "{"):
            raise self.error("nothing to repeat (two quantifiers in a row)")
        if hi is not None and lo > hi:
            raise self.error(f"repetition {{{lo},{hi}}} has its bounds out of order", start)
        return Repeat(atom, lo, hi)

    def braces(self) -> tuple[int, int | None]:
        start = self.pos
        self.pos += 1
        lo = self.number(start)
        hi: int | None = lo
        if self.peek() == ",":
            self.pos += 1
            hi = None if self.peek() == "}" else self.number(start)
        if self.peek() != "}":
            raise self.error("malformed repetition {m,n}; escape a literal '{' as \\{", start)
        self.pos += 1
        for bound in (lo, hi):
            if bound is not None and bound > MAX_REPEAT:
                raise self.error(f"repetition bound {bound} exceeds {MAX_REPEAT}", start)
        return lo, hi

    def number(self, start: int) -> int:
        begin = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if self.pos == begin:
            raise self.error("malformed repetition {m,n}; escape a literal '{' as \\{", start)
        return int(self.src[begin:self.pos])

    def atom(self) -> Node:
        start = self.pos
        ch = self.peek()
        if ch == ".":
            self.pos += 1
            return Chars(cs.PY_DOT if self.python else cs.DOT)
        if ch == "[":
            return Chars(self.char_class())
        if ch == "(":
            return self.group()
        if ch == "\\":
            value = self.escape(in_class=False)
            return Chars(value if isinstance(value, CharSet) else CharSet.of([(value, value)]))
        if ch in ("*", "+", "?"):
            raise self.error("nothing to repeat")
        if ch in ("{", "}") or (ch == "]" and not self.schema):
            raise self.error(f"a literal '{ch}' must be escaped as \\{ch}")
        self.pos += 1
        cp = self.scalar(ch, start)
        return Chars(CharSet.of([(cp, cp)]))

    def scalar(self, ch: str, position: int) -> int:
        cp = ord(ch)
        if cs.SURROGATE_LO <= cp <= cs.SURROGATE_HI:
            raise self.error("a lone surrogate is not a Unicode scalar value", position)
        return cp

    def group(self) -> Node:
        start = self.pos
        self.pos += 1
        if self.peek() == "?":
            nxt = self.peek(1)
            if nxt == ":":
                self.pos += 2
            elif nxt in ("=", "!") or (nxt == "<" and self.peek(2) in ("=", "!")):
                raise self.error("lookaround assertions are not supported", start)
            elif nxt == "<":
                if self.python:
                    raise self.error("Python reads (?<...> as a lookbehind", start)
                self.pos += 2
                name_start = self.pos
                while self.peek() and (self.peek().isalnum() or self.peek() in "_$"):
                    self.pos += 1
                if self.pos == name_start or self.peek() != ">":
                    raise self.error("malformed group name", start)
                self.pos += 1
            else:
                raise self.error("inline flags and group modifiers are not supported", start)
        body = self.disjunction()
        if self.peek() != ")":
            raise self.error("unclosed group '('", start)
        self.pos += 1
        return body

    def char_class(self) -> CharSet:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        if self.python and self.peek() == "]":
            raise self.error("Python reads a ']' right after '[' or '[^' as a member", start)
        members = cs.EMPTY
        while self.peek() != "]":
            if self.peek() == "":
                raise self.error("unclosed character class '['", start)
            item_pos = self.pos
            lo = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                hi_pos = self.pos
                hi = self.class_atom()
                if isinstance(lo, CharSet) or isinstance(hi, CharSet):
                    raise self.error("a class escape cannot be a range endpoint", item_pos)
                if lo > hi:
                    raise self.error("range out of order in character class", hi_pos)
                members = members.union(CharSet.of([(lo, hi)]))
            elif isinstance(lo, CharSet):
                members = members.union(lo)
            else:
                members = members.union(CharSet.of([(lo, lo)]))
        self.pos += 1
        return members.invert() if negated else members

    def class_atom(self) -> int | CharSet:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        pos = self.pos
        self.pos += 1
        return self.scalar(self.src[pos], pos)

    def escape(self, *, in_class: bool) -> int | CharSet:
        start = self.pos
        self.pos += 1
        ch = self.peek()
        if ch == "":
            raise self.error("the pattern ends inside an escape", start)
        self.pos += 1
        if ch.lower() in _CLASS_ESCAPES:
            value = cs.python_class(ch.lower()) if self.python else _CLASS_ESCAPES[ch.lower()]
            return value.invert() if ch.isupper() else value
        if ch in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[ch]
        if ch == "b" and in_class:
            return 0x08
        if ch in ("b", "B"):
            raise self.error("word boundaries \\b and \\B are not supported", start)
        if ch == "0":
            if self.peek().isascii() and self.peek().isdigit():
                raise self.error("octal escapes are not supported", start)
            return 0
        if ch.isascii() and ch.isdigit() or ch == "k":
            raise self.error("back-references are not supported", start)
        if ch in ("p", "P"):
            raise self.error("Unicode property classes \\p{..} are not supported", start)
        if ch == "x":
            return self.hex_digits(2, start)
        if ch == "u":
            if self.peek() == "{" and self.python:
                raise self.error("Python has no \\u{...} escape", start)
            if self.peek() == "{":
                self.pos += 1
                end = self.src.find("}", self.pos)
                digits = self.src[self.pos:end] if end >= 0 else ""
                if not digits or len(digits) > 6 or any(c not in _HEX for c in digits):
                    raise self.error("malformed \\u{...} escape", start)
                self.pos = end + 1
                return self.code_point(int(digits, 16), start)
            return self.code_point(self.hex_digits(4, start), start)
        if ch == "c":
            if self.python:
                raise self.error("Python has no \\c escape", start)
            letter = self.peek()
            if not (letter.isascii() and letter.isalpha()):
                raise self.error("\\c must be followed by an ASCII letter", start)
            self.pos += 1
            return ord(letter) % 32
        if ch.isascii() and not ch.isalnum() and 0x20 <= ord(ch) < 0x7F:
            return ord(ch)  # escaped punctuation stands for itself
        raise self.error(f"unknown escape \\{ch}", start)

    def hex_digits(self, count: int, start: int) -> int:
        digits = self.src[self.pos:self.pos + count]
        if len(digits) != count or any(c not in _HEX for c in digits):
            raise self.error(f"\\{self.src[start + 1]} needs exactly {count} hex digits", start)
        self.pos += count
        return int(digits, 16)

    def code_point(self, cp: int, start: int) -> int:
        if cs.SURROGATE_LO <= cp <= cs.SURROGATE_HI:
            raise self.error("surrogate escapes are not supported; write the character directly",
                             start)
        if cp > cs.MAX_CODE_POINT:
            raise self.error("code point beyond U+10FFFF", start)
        return cp


__all__ = ["Branch", "MAX_REPEAT", "parse_regex"]
