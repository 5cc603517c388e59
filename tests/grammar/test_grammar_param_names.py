"""The ParameterNameConstraint companion (services/grammar/tools/param_names.py) with real xgrammar
matchers of the XML tool grammar.

Design document: "the grammar session carries a companion ... that follows the canonical framing
of the tokens the matcher accepts and clears, in every lookahead mask, the tokens that would
complete a name the call has used. It shares the matcher's transaction (lookahead, accept,
confirm, discard and the assistant continuation)".

The oracle is independent of the companion: the names a call has completed are read from the
call's text with the framing's anchors (a name follows the function head or a value's end, and no
value holds the delimiter), and a token is a repeat when appending its bytes completes a name
already there.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
import xgrammar as xgr

from services.grammar.compiler import build_framed_grammar
from services.grammar.engines.matching import legal_ids
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.param_names import NameIndex, ParameterNameConstraint
from shared.contract import ToolChoice, ToolDefinition
from shared.frontends.qwen35 import qwen35_domain
from tests.support.qwen_support import ordinary_ids, qwen_compiler, xml_domain
from tests.support.xml_walks import SCRIPTS, walk

LOOSE = (ToolDefinition.create("ping", None), ToolDefinition.create("echo", None))
_NAME = re.compile(rb"(?:^\n<function=[^>\n]*>\n|\n</parameter>\n)<parameter=([^>\n\r]*)>")


def _names(call_text: bytes) -> list[bytes]:
    return _NAME.findall(call_text)


def _call_text(tokens: list[int], domain) -> bytes | None:
    """The bytes since the last opener token, or None outside a call."""
    opener, closer = domain.special_id("<tool_call>"), domain.special_id("</tool_call>")
    last = max((i for i, t in enumerate(tokens) if t in (opener, closer)), default=-1)
    if last < 0 or tokens[last] != opener:
        return None
    return b"".join(domain.token_bytes[t] for t in tokens[last + 1:])


def _repeats(call_text: bytes | None, token: int, domain) -> bool:
    if call_text is None or not domain.is_ordinary(token):
        return False
    before = _names(call_text)
    after = _names(call_text + domain.token_bytes[token])
    return len(after) > len(before) and len(set(after)) < len(after)


def _companion(domain) -> ParameterNameConstraint:
    return ParameterNameConstraint(NameIndex.of(domain), domain.special_id("<tool_call>"),
                                   domain.special_id("</tool_call>"))


@pytest.fixture(scope="module")
def loose_grammar() -> xgr.CompiledGrammar:
    d = xml_domain()
    compiler = xgr.GrammarCompiler(d.tokenizer_info(), max_threads=1, cache_enabled=False)
    return compiler.compile_grammar(build_framed_grammar(ToolSpec(LOOSE, ToolChoice()),
                                                         "qwen-xml-v1", d))


def test_cleared_tokens_are_exactly_the_repeats(loose_grammar) -> None:
    """Along random walks, at every position the companion clears exactly the legal tokens the
    oracle reads as completing a used name, and never a token that is not legal."""
    d = xml_domain()
    rng = random.Random(2)
    mask = xgr.allocate_token_bitmask(1, d.size)
    checked = cleared_total = 0
    prefer = frozenset(d.control_ids) | frozenset(range(256, 273))
    for _ in range(10):
        w = walk(loose_grammar, d, rng, names=True, prefer=prefer, max_tokens=200, end_bias=0.1,
                 scripts=SCRIPTS + (b"<parameter=a>\n", b"<parameter=ab>\n"), script_rate=0.15)
        matcher, companion = xgr.GrammarMatcher(loose_grammar), _companion(d)
        for i, token in enumerate(w.tokens):
            matcher.fill_next_token_bitmask(mask)
            legal = set(legal_ids(mask[0], d.size))
            before = mask[0].clone()
            companion.apply(mask[0])
            after = set(legal_ids(mask[0], d.size))
            text = _call_text(w.tokens[:i], d)
            expected = {t for t in legal if _repeats(text, t, d)}
            assert legal - after == expected
            assert after <= set(legal_ids(before, d.size))
            checked += 1
            cleared_total += len(expected)
            assert matcher.accept_token(token)
            companion.accept(token)
    assert checked > 300 and cleared_total > 0


def test_rollback_follows_the_matcher(loose_grammar) -> None:
    """Accept, roll back n, accept again: the companion's masks equal those of a companion fed
    only the kept tokens (lookahead and discard leave no trace)."""
    d = xml_domain()
    text = b"\n<function=ping>\n<parameter=a>\nx\n</parameter>\n<parameter=b>\ny\n</parameter>\n"
    tokens = [d.special_id("<tool_call>")] + list(text) + list(b"<parameter=")
    companion = _companion(d)
    for t in tokens:
        companion.accept(t)
    assert companion.used == {b"a", b"b"}
    companion.rollback(len(b"<parameter=b>\ny\n</parameter>\n<parameter="))
    assert companion.used == {b"a"}
    fresh = _companion(d)
    for t in tokens[:companion.accepted]:
        fresh.accept(t)
    for t in b"<parameter=a":
        companion.accept(t)
        fresh.accept(t)
    rows = torch.full((2, d.mask_words), -1, dtype=torch.int32)
    assert companion.apply(rows[0]) == fresh.apply(rows[1]) == 2  # ">" and ">\n" complete "a"
    assert torch.equal(rows[0], rows[1])
    assert set(range(d.size)) - set(legal_ids(rows[0], d.size)) == {ord(">"), 256 + 2}
    with pytest.raises(ValueError):
        companion.rollback(companion.accepted + 1)


def test_each_call_starts_with_no_name_used() -> None:
    """Names are unique within a call; the next call may use them again."""
    d = xml_domain()
    companion = _companion(d)
    call = [d.special_id("<tool_call>")] + list(b"\n<function=ping>\n<parameter=a>\nx"
                                                b"\n</parameter>\n</function>\n") + \
        [d.special_id("</tool_call>")]
    for t in call + [ord("\n")] + call[:-1]:
        companion.accept(t)
    assert companion.used == {b"a"}
    for t in call[-1:] + [ord("\n"), d.special_id("<tool_call>")]:
        companion.accept(t)
    assert companion.used == frozenset()


def test_real_vocabulary_masks_match_the_oracle() -> None:
    """With the Qwen3.5 vocabulary: after a call used `city` and wrote `city` again as a new
    parameter name, the companion clears exactly the legal tokens (of all 248k) that would
    complete it (`>`, `>\n`, ... among them), and nothing while the name can still differ."""
    d = qwen35_domain()
    enc = ordinary_ids
    compiled = qwen_compiler().compile_grammar(build_framed_grammar(ToolSpec(LOOSE, ToolChoice()),
                                                             "qwen-xml-v1", d))
    matcher, companion = xgr.GrammarMatcher(compiled), _companion(d)
    tokens = [d.special_id("<tool_call>")] + enc(
        "\n<function=ping>\n<parameter=city>\nParis\n</parameter>\n<parameter=city")
    for t in tokens:
        assert matcher.accept_token(t)
        companion.accept(t)
    mask = xgr.allocate_token_bitmask(1, d.size)
    matcher.fill_next_token_bitmask(mask)
    legal = set(legal_ids(mask[0], d.size))
    cleared = companion.apply(mask[0])
    after = set(legal_ids(mask[0], d.size))
    text = _call_text(tokens, d)
    expected = {t for t in legal if b">" in d.token_bytes[t] and _repeats(text, t, d)}
    assert legal - after == expected and cleared == len(expected)
    assert enc(">")[0] in expected and enc(">\n")[0] in expected
    assert all(d.token_bytes[t].startswith(b">") for t in expected)
