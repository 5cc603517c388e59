"""Regex constraint and JSON Schema `pattern` normalization, checked by enumeration against
Python's `re` (with explicit classes where ECMAScript and Python differ)."""

from __future__ import annotations

import itertools
import re
import unicodedata

import pytest
import xgrammar as xgr

from services.grammar.engines import matching
from services.grammar.regex import charset, normalize_regex, regex_to_ebnf
from shared.errors import InvalidRegex
from tests.support.common import byte_domain, language


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def oracle(pattern: str, alphabet: list[str], max_len: int, *, search: bool = False,
           flags: int = 0) -> set[str]:
    rx = re.compile(pattern, flags)
    test = rx.search if search else rx.fullmatch
    return {"".join(t) for n in range(max_len + 1) for t in itertools.product(alphabet, repeat=n)
            if test("".join(t))}


# ECMAScript's \s, built from the spec's definition (WhiteSpace: TAB VT FF SP NBSP ZWNBSP + Zs;
# LineTerminator: LF CR LS PS) with Python's Unicode database, independent of our charset table.
ECMA_SPACE = {0x09, 0x0B, 0x0C, 0x20, 0xA0, 0xFEFF, 0x0A, 0x0D, 0x2028, 0x2029} | {
    cp for cp in range(0x10000) if unicodedata.category(chr(cp)) == "Zs"}
PY_SPACE = "[" + "".join(re.escape(chr(cp)) for cp in sorted(ECMA_SPACE)) + "]"
PY_DOT = "[^\n\r\u2028\u2029]"
PY_ANY = r"[\s\S]"

# (ECMAScript pattern, Python oracle pattern (None: the same), re flags, alphabet, max length)
CASES = [
    ("", None, 0, "ab", 3),
    ("abc", None, 0, "abc", 4),
    ("a|b|", None, 0, "ab", 2),
    ("|a", None, 0, "ab", 2),
    ("(ab|a)*c", None, 0, "abc", 5),
    ("a{2}b{1,}c{0,2}", None, 0, "abc", 6),
    ("(?:ab){1,2}|x{0}", None, 0, "abx", 5),
    ("a+?b*?c??(?<n>d){1,2}?", "a+?b*?c??(?P<n>d){1,2}?", 0, "abcd", 5),
    ("[a-c]x[^b]", None, 0, ["a", "b", "c", "x", "\n"], 3),
    ("[a-c-e]", None, 0, "abcde-", 1),
    (r"\d+\w\D\W", None, re.ASCII, ["1", "a", "_", "\u0663", "é", "-"], 4),
    (r"[\d\s-]+", "[0-9" + PY_SPACE[1:-1] + "-]+", 0, ["1", " ", "\u3000", "-", "a", "\x1c"], 3),
    (r"\s\S", PY_SPACE + "[^" + PY_SPACE[1:], 0,
     [" ", "\t", "\n", "\xa0", "\u2028", "\ufeff", "\x1c", "\x85", "a"], 2),
    (".", PY_DOT, 0, ["a", "\n", "\r", "\u2028", "\u2029", "\x85", "é", "😀"], 1),
    ("[^]|[]", PY_ANY, 0, ["a", "\n", "😀"], 2),
    ("a|[]b", "a", 0, "ab", 2),
    (r"[\b][\w][^\W\d]", r"[\b][a-zA-Z0-9_][a-zA-Z_]", 0, ["\b", "a", "1", "_", "é"], 3),
    (r"\x41\u00e9\t\n\r\f\v\0\cJ", "A\u00e9\t\n\r\f\v\x00\n", 0, None, 0),
    (r"\.\*\+\?\(\)\[\]\{\}\|\^\$\\\/\-\"", None, 0, None, 0),
    ("é+😀?[😀-😂]", None, 0, ["é", "😀", "😁", "😃", "a"], 3),
    (r"\u{1F600}x", "😀x", 0, None, 0),
    ("^ab$|^c|d$", "ab|c|d", 0, "abcd", 2),
    ("(a|b)c|d(e)", None, 0, "abcde", 2),
]


def _cases(with_alphabet: bool = True) -> list:
    # A list, not a generator: pytest 9.1+ deprecates iterators as parametrize values.
    return [pytest.param(pattern, pattern if py is None else py, flags, alphabet, n,
                         id=repr(pattern))
            for pattern, py, flags, alphabet, n in CASES
            if (alphabet is not None) == with_alphabet]


@pytest.mark.parametrize("pattern,py,flags,alphabet,n", _cases())
def test_regex_whole_match_language(compiler, pattern, py, flags, alphabet, n):
    """'A regex matches the whole content ... Literals, Unicode characters, classes, groups,
    alternatives and *, +, ?, {m,n} repetition are supported. Greedy and lazy forms describe the
    same legal set'; '\\d/\\w are ASCII, \\s includes Unicode whitespace, . excludes \\n, \\r,
    U+2028 and U+2029'; 'an empty expression allows only empty content'."""
    compiled = compiler.compile_grammar(xgr.Grammar.from_ebnf(regex_to_ebnf(pattern)))
    assert language(compiled, list(alphabet), n) == oracle(py, list(alphabet), n, flags=flags)


@pytest.mark.parametrize("pattern,py,flags,alphabet,n", _cases())
def test_normalized_regex_whole_match_through_xgrammar(compiler, pattern, py, flags, alphabet, n):
    """'regex_converter shares character and escape normalization': the normalized regex, read by
    xgrammar's own regex converter, has the same whole-match language."""
    normalized = normalize_regex(pattern, search=False)
    compiled = compiler.compile_grammar(xgr.Grammar.from_regex(normalized))
    assert language(compiled, list(alphabet), n) == oracle(py, list(alphabet), n, flags=flags)


@pytest.mark.parametrize("pattern,py,flags,alphabet,n", _cases(with_alphabet=False))
def test_regex_single_string_escapes(compiler, pattern, py, flags, alphabet, n):
    """'Escapes such as \\xNN and \\uNNNN are supported; characters outside the BMP are written
    directly'; escaped metacharacters stand for themselves."""
    (text,) = [s for s in [re.sub(r"\\(.)", r"\1", py), py] if re.fullmatch(py, s)][:1]
    for source in (regex_to_ebnf(pattern), None):
        grammar = (xgr.Grammar.from_ebnf(source) if source else
                   xgr.Grammar.from_regex(normalize_regex(pattern, search=False)))
        compiled = compiler.compile_grammar(grammar)
        assert matching.accepts(compiled, text)
        for wrong in (text[:-1], text + "x", "x" + text[1:]):
            assert matching.accepts(compiled, wrong) == bool(re.fullmatch(py, wrong))


SEARCH_CASES = [
    ("ab", r"ab"),
    ("^ab", r"\Aab"),
    ("ab$", r"ab\Z"),
    ("^a|b$", r"\Aa|b\Z"),
    ("^a$|", r"\Aa\Z|"),
    ("", ""),
    ("^$", r"\A\Z"),
    ("a*", "a*"),
    ("^[^a]+$", r"\A[^a]+\Z"),
    ("b.", "b" + PY_DOT),
]


@pytest.mark.parametrize("pattern,py", SEARCH_CASES, ids=[repr(c[0]) for c in SEARCH_CASES])
def test_normalized_regex_search_semantics(compiler, pattern, py):
    """'the regex entry matches the whole content while JSON Schema pattern keeps search
    semantics': the normalized search regex, as a whole match, accepts exactly the strings in
    which the pattern finds a match (ECMAScript ^/$ without m: the string ends only)."""
    alphabet = ["a", "b", "\n"]
    compiled = compiler.compile_grammar(
        xgr.Grammar.from_regex(normalize_regex(pattern, search=True))
    )
    assert language(compiled, alphabet, 4) == oracle(py, alphabet, 4, search=True)


def test_normalized_regex_uses_only_explicit_constructs():
    """xgrammar's converter reads `.`, `\\s`, `[^..]` with its own sets: the normalized text must
    not contain them (it spells every class as positive explicit ranges)."""
    out = normalize_regex(r"^.\s\S[^a]\d\w$", search=True)
    assert not re.search(r"(?<!\\)\.|\\[sSdDwW]|\[\^", out.replace("\\\\", ""))


@pytest.mark.parametrize("pattern", [r"[^a]", ".", r"\S", r"[^]"])
def test_regex_output_is_unicode_scalar_values(compiler, pattern):
    """'Output contains only Unicode scalar values': the UTF-8-style encoding of a surrogate
    (ED A0 80), which xgrammar's own negated class admits, is refused."""
    compiled = compiler.compile_grammar(xgr.Grammar.from_ebnf(regex_to_ebnf(pattern)))
    assert not matching.accepts(compiled, b"\xed\xa0\x80")
    assert matching.accepts(compiled, "\ue000".encode())
    compiled = compiler.compile_grammar(
        xgr.Grammar.from_regex(normalize_regex(pattern, search=False)))
    assert not matching.accepts(compiled, b"\xed\xa0\x80")


def test_charset_space_and_dot_match_the_spec_for_every_bmp_code_point():
    """'\\s includes Unicode whitespace' (ECMAScript WhiteSpace + LineTerminator); '. excludes
    \\n, \\r, U+2028 and U+2029'; \\d and \\w are ASCII."""
    for cp in range(0x10000):
        if 0xD800 <= cp <= 0xDFFF:
            assert cp not in charset.DOT and cp not in charset.ANY
            continue
        ch = chr(cp)
        assert (cp in charset.SPACE) == (cp in ECMA_SPACE), hex(cp)
        assert (cp in charset.DOT) == (ch not in "\n\r\u2028\u2029"), hex(cp)
        assert (cp in charset.DIGIT) == bool(re.fullmatch(r"\d", ch, re.ASCII))
        assert (cp in charset.WORD) == bool(re.fullmatch(r"\w", ch, re.ASCII))


# (pattern, 0-based position of the offending construct)
INVALID = [
    ("a^b", 1), ("(^a)", 1), ("a$b", 1), ("(a$)", 2), ("a$$", 1),
    (r"(a)\1", 3), (r"\k<n>", 0), ("(?=a)", 0), ("x(?!a)", 1), ("(?<=a)b", 0), ("(?<!a)b", 0),
    (r"\bfoo", 0), (r"a\B", 1), (r"\p{L}", 0), (r"[\P{L}]", 1),
    ("(?i)a", 0), ("(?i:a)", 0), ("(?P<n>a)", 0),
    (r"\ud800", 0), (r"x\uDFFF", 1), (r"[\ud83d]", 1), ("a\ud800", 1), (r"\u{110000}", 0),
    (r"\q", 0), (r"\é", 0), (r"\a", 0), (r"\z", 0), ("a\\", 1), (r"\01", 0),
    ("*a", 0), ("a**", 2), ("a{2}{3}", 4), ("a{3,2}", 1), ("a{", 1), ("a{x}", 1), ("a{,2}", 1),
    ("}", 0), ("]", 0), ("a{1000001}", 1),
    ("(a", 0), ("a)", 1), ("[a", 0), ("[z-a]", 3), (r"[\d-z]", 1), (r"\x4", 0), (r"\u12", 0),
    (r"\cé", 0),
]


@pytest.mark.parametrize("pattern,position", INVALID, ids=[repr(c[0]) for c in INVALID])
def test_invalid_regex_is_rejected_with_position(pattern, position):
    """'^/$ are accepted only at the ends of the expression or of top-level alternatives;
    elsewhere, and back-references, lookaround, word boundaries, Unicode property classes, flags,
    surrogate escapes and unknown escapes, return request errors' (InvalidRegex, 0-based)."""
    for convert in (regex_to_ebnf, lambda p: normalize_regex(p, search=True)):
        with pytest.raises(InvalidRegex) as info:
            convert(pattern)
        assert info.value.position == position, info.value.message
        assert info.value.fault == "request"
