"""Choice constraints (`choice_to_ebnf`), checked by enumerating the compiled language against the
literal set itself."""

from __future__ import annotations

import random

import pytest
import xgrammar as xgr

from services.grammar.compiler import build_grammar
from services.grammar.engines import matching
from shared.contract import OutputConstraint
from shared.errors import InvalidChoice
from tests.support.common import byte_domain, language


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def compile_choice(compiler: xgr.GrammarCompiler, options: list[str]) -> xgr.CompiledGrammar:
    return compiler.compile_grammar(build_grammar(OutputConstraint.choice(options), byte_domain()))


CASES = [
    ["yes", "no"],
    ["a", "ab", "abc", "b"],
    [""],
    ["", "x", "xy"],
    ["a", "a", "b", "a"],
    ["Yes", " yes", "YES\n", "yes "],
    ["é", "😀x", "中文", "e\u0301"],
    ['"', "\\", 'a"b', "\\n", "\t"],
    ["true", "tr", "null", "ab"],
]


@pytest.mark.parametrize("options", CASES, ids=[repr(c) for c in CASES])
def test_choice_language_is_the_literal_set(compiler, options):
    """'Choice is built as literal grammar alternatives that keep case, whitespace and Unicode
    exactly, with multi-token options and shared prefixes ... the empty string is allowed,
    duplicates are removed and order carries no weight.'"""
    compiled = compile_choice(compiler, options)
    alphabet = sorted(set("".join(options)) | {"x", " "})
    longest = max(len(o) for o in options)
    assert language(compiled, alphabet, longest + 1) == set(options)
    shuffled = list(reversed(options))
    assert build_grammar(OutputConstraint.choice(shuffled), byte_domain()).__str__() == \
        build_grammar(OutputConstraint.choice(options), byte_domain()).__str__()


def test_short_choice_prefix_allows_eos_and_continuing(compiler):
    """'When a short choice is a prefix of a longer one, matching the short one allows both EOS
    and continuing.'"""
    domain = byte_domain()
    compiled = compile_choice(compiler, ["a", "ab"])
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_token(ord("a"))
    mask = xgr.allocate_token_bitmask(1, domain.size)
    matcher.fill_next_token_bitmask(mask)
    assert set(matching.legal_ids(mask[0], domain.size)) == {ord("b")} | domain.eos_ids


def test_multi_token_option_through_merged_tokens(compiler):
    """Multi-token options: a merged token ('true', 'ab') is legal where its bytes fit an option,
    and a token that would run past every option is not."""
    domain = byte_domain()
    compiled = compile_choice(compiler, ["true", "tru", "abc"])
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, domain.size)
    matcher.fill_next_token_bitmask(mask)
    legal = {domain.token_bytes[i] for i in matching.legal_ids(mask[0], domain.size)}
    assert legal == {b"t", b"a", b"true", b"ab"}
    compiled = compile_choice(compiler, ["tru"])
    matcher = xgr.GrammarMatcher(compiled)
    matcher.fill_next_token_bitmask(mask)
    assert {domain.token_bytes[i] for i in matching.legal_ids(mask[0], domain.size)} == {b"t"}


def test_choice_random_walks_stay_in_the_set(compiler):
    """Random legal walks (any legal token, EOS where legal) always end on one of the choices."""
    options = ["true", "tr", "é", "ab", "a", "", "null"]
    compiled = compile_choice(compiler, options)
    rng = random.Random(3)
    for _ in range(20):
        walk = matching.random_walk(compiled, byte_domain(), rng, max_tokens=10, end_bias=0.3)
        assert walk.completed and walk.data.decode("utf-8") in options


@pytest.mark.parametrize("options", [[], "abc", ["a", 1], None])
def test_invalid_choice(options):
    """'The list must not be empty'; options are strings (InvalidChoice)."""
    with pytest.raises(InvalidChoice):
        OutputConstraint.choice(options)  # type: ignore[arg-type]
