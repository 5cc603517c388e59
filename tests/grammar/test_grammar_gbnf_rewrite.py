"""The GBNF rewrites (services/grammar/gbnf/rewrite.py) keep the language exactly.

Issue 15: "The language must stay exactly what it is". Design document: "(= ...) lookahead ...
must agree with [the rule bodies] (upstream's compile-hint semantics)". Three independent bases:
an Earley recogniser over the unrewritten parse tree (tests/support/gbnf_oracle.py) decides every
walk output and random strings; the unrewritten grammar compiled by xgrammar gives identical masks
at every position of the same random walks (with rollbacks); and the rewritten text is checked for
what the rewrites promise (annotations only where no token terminal can follow).
"""

from __future__ import annotations

import random
import zlib
from functools import lru_cache

import numpy as np
import pytest
import xgrammar as xgr

from bench.grammar_cases import GBNF
from services.grammar.engines.matching import legal_ids
from services.grammar.gbnf.lexer import Lexer
from services.grammar.gbnf.parser import parse_rules
from services.grammar.gbnf.rewrite import optimize
from services.grammar.regex.tree import Chars, to_ebnf
from tests.support.common import byte_domain
from tests.support.gbnf_oracle import CFG

HAND = {
    "star-of-alternatives": 'root ::= "<" ( [a-c] | "\\\\" [nt] )* ">" ";"?',
    "plus-then-rule": 'root ::= item+ end\nitem ::= "a" | "bc"\nend ::= ";" | ","',
    "class-merge": 'root ::= ch+ (" " ch+)*\nch ::= lower | digit | "_"\nlower ::= [a-z]\n'
                   'digit ::= [0-9]',
    "trailing-ws": 'root ::= "[" ws (stmt ws)* "]"\nstmt ::= "x" ws "=" ws [0-9]+ ws\n'
                   'ws ::= [ \\n]*',
    "nested": 'root ::= ("(" inner* ")")+\ninner ::= "a" | "(" inner* ")"',
    "bounded": 'root ::= ("ab" | "c"){1,3} "!" ([a-b]{2})*',
    "empty-alternative": 'root ::= ws "v" ws\nws ::= | " " | "\\n" [ \\t]{0,3}',
    "user-lookahead": 'root ::= s ";"\ns ::= ("a" | "b")* "." (= ";")',
    "nullable-rule": 'root ::= a* "z"\na ::= "x" b\nb ::= "y"?',
}
ALPHABET = "abcxyz01 \n\t<>()[];,.!=_\\\"{}:+-*/intr"


def random_gbnf(rng: random.Random) -> str:
    """A random grammar over a small alphabet: literals, classes, groups, alternatives, every
    repetition form, whitespace-like rules and (possibly recursive) references."""
    names = ["root", "r1", "r2", "r3", "ws"]

    def expr(depth: int) -> str:
        kind = rng.random()
        if depth > 2 or kind < 0.3:
            return rng.choice(['"a"', '"bc"', '[a-c]', '[0-1]', '"("', '")"', '";"', '" "',
                               rng.choice(names[1:]), '[^a-z]'])
        if kind < 0.55:
            return " ".join(expr(depth + 1) for _ in range(rng.randint(2, 3)))
        if kind < 0.75:
            return "(" + " | ".join(expr(depth + 1) for _ in range(rng.randint(2, 3))) + ")"
        return "(" + expr(depth + 1) + ")" + rng.choice(["*", "+", "?", "{1,2}", "{0,3}", "{2,}"])

    rules = [f'root ::= {expr(0)} ";"'] + [f"{n} ::= {expr(1)}" for n in names[1:4]]
    rules.append('ws ::= [ \\n]*')
    return "\n".join(rules)


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _text(rules) -> str:
    lines = []
    for r in rules:
        line = f"{r.name} ::= {to_ebnf(r.body)}"
        if r.lookahead is not None:
            line += f" (= {to_ebnf(r.lookahead)})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def both(source: str):
    rules = parse_rules(Lexer(source).tokens(), byte_domain())
    compile_ = lambda text: _compiler().compile_grammar(xgr.Grammar.from_ebnf(text))  # noqa: E731
    return rules, compile_(_text(rules)), compile_(_text(optimize(rules)))


def check(source: str, seed: int, walks: int = 8, steps: int = 40) -> None:
    rules, raw, opt = both(source)
    oracle = CFG({r.name: r.body for r in rules})
    d = byte_domain()
    rng = random.Random(seed)
    a = np.zeros((1, d.mask_words), dtype=np.int32)
    b = a.copy()
    stops = sorted(d.eos_ids)
    for _ in range(walks):
        m1 = xgr.GrammarMatcher(raw, override_stop_tokens=stops)
        m2 = xgr.GrammarMatcher(opt, override_stop_tokens=stops)
        data = bytearray()
        taken: list[int] = []
        for _ in range(steps):
            m1.fill_next_token_bitmask(a)
            m2.fill_next_token_bitmask(b)
            assert np.array_equal(a, b), (
                source,
                bytes(data),
                set(legal_ids(a[0], d.size)) ^ set(legal_ids(b[0], d.size)),
            )
            assert m1.is_completed() == m2.is_completed()
            ids = [i for i in legal_ids(a[0], d.size)]
            if not ids:
                break
            if taken and rng.random() < 0.15:
                m1.rollback(1)
                m2.rollback(1)
                data = data[:len(data) - len(d.token_bytes[taken.pop()])]
                continue
            eos = [i for i in ids if i in d.eos_ids]
            other = [i for i in ids if i not in d.eos_ids]
            t = eos[0] if eos and (not other or rng.random() < 0.3) else rng.choice(other)
            assert m1.accept_token(t) and m2.accept_token(t)
            if t in d.eos_ids:
                assert oracle.accepts(data.decode()), (source, bytes(data))
                break
            taken.append(t)
            data += d.token_bytes[t]
    for _ in range(60):  # random strings: the recogniser and both compiled grammars agree
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))
        expected = oracle.accepts(text)
        for g in (raw, opt):
            m = xgr.GrammarMatcher(g, terminate_without_stop_token=False)
            got = m.accept_string(text.encode()) and m.is_completed()
            assert got == expected, (source, text)


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_written_constructs(name):
    check(HAND[name], zlib.crc32(name.encode()))


@pytest.mark.parametrize("i", range(40))
def test_random_grammars(i):
    check(random_gbnf(random.Random(i)), seed=i)


@pytest.mark.parametrize("case", GBNF, ids=[c.name for c in GBNF])
def test_benchmark_grammars(case):
    """The llama.cpp-style grammars of the benchmark, and their outputs decided by the oracle."""
    source = case.constraint.source
    check(source, zlib.crc32(case.name.encode()), walks=4, steps=30)
    rules = parse_rules(Lexer(source).tokens(), byte_domain())
    oracle = CFG({r.name: r.body for r in rules})
    _, _, opt = both(source)
    for text in case.outputs[:1]:
        assert oracle.accepts(text)
        m = xgr.GrammarMatcher(opt, terminate_without_stop_token=False)
        assert m.accept_string(text.encode()) and m.is_completed()


def test_no_annotation_where_a_token_terminal_follows():
    """A byte lookahead cannot describe a following token terminal: no annotation there; a rule
    only the end of the output follows gets one that no character matches."""
    d = byte_domain()
    src = ('root ::= item Token(257) tail\nitem ::= "a" item | "b"\n'
           'tail ::= "c" tail | "e"')
    by_name = {r.name: r for r in optimize(parse_rules(Lexer(src).tokens(), d))}
    assert by_name["item"].lookahead is None
    tail = by_name["tail"].lookahead
    assert isinstance(tail, Chars) and not tail.charset.ranges
    assert by_name["root"].lookahead is None


def _regex_cases():
    from tests.grammar.test_grammar_regex import CASES as REGEX_CASES

    return [pytest.param(p, p if py is None else py, flags, alphabet, n, id=repr(p))
            for p, py, flags, alphabet, n in REGEX_CASES if alphabet is not None]


@pytest.mark.parametrize("pattern,py,flags,alphabet,n", _regex_cases())
def test_regex_constraints_keep_their_language(pattern, py, flags, alphabet, n):
    """The regex constraint compiles through the same rewrites: its enumerated whole-match
    language equals Python's `re` on the regex tests' cases."""
    from services.grammar.gbnf import regex_to_optimized_ebnf
    from tests.grammar.test_grammar_regex import oracle as re_oracle
    from tests.support.common import language

    compiled = _compiler().compile_grammar(xgr.Grammar.from_ebnf(regex_to_optimized_ebnf(pattern)))
    assert language(compiled, list(alphabet), n) == re_oracle(py, list(alphabet), n, flags=flags)
