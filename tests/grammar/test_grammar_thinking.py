"""The thinking framing grammar (services/grammar/framing.py) on the real Qwen3.5 vocabulary, the
phase decoder reading its walks, and the forced close of a thinking budget.

Design document: "The grammar's reasoning branch is token-level: any token except </think>
(ExcludeToken), then the </think> token (Token) and exactly the separator \\n\\n"; "an early EOS
inside that reasoning branch must be prevented"; "</think> spelled with ordinary tokens is
reasoning in both, and the close token without the separator is refused by the grammar. The
separator is matched at the byte level after the token, so a token that holds both the end of the
separator and the start of the content is legal"; "when a user grammar requires content to start
with a space, that space after the separator belongs to the content and is kept"; "If the budget
runs out, the fixed control string is injected after a complete round ... A forced close and a
natural close reach the same content state."
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
import xgrammar as xgr

from services.grammar.compiler import build_framed_grammar
from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.grammar.engines.matching import legal_ids
from services.worker.output.session import OutputSession
from shared.contract import OutputConstraint
from shared.frontends import get_frontend
from shared.frontends.thinking import CONTENT, REASONING
from shared.generation import ReasoningDelta
from tests.support.qwen_support import ordinary_ids, qwen_compiler
from tests.support.xml_walks import walk

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def frontend():
    return get_frontend("qwen3.5")


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return qwen_compiler()


@pytest.fixture(scope="module")
def json_grammar(frontend, compiler) -> xgr.CompiledGrammar:
    return compiler.compile_grammar(build_framed_grammar(
        OutputConstraint.json_schema(SCHEMA), "qwen-think-v1+raw", frontend.domain))


def _legal(matcher, domain) -> set[int]:
    mask = xgr.allocate_token_bitmask(1, domain.size)
    matcher.fill_next_token_bitmask(mask)
    return set(legal_ids(mask[0], domain.size))


_ordinary = ordinary_ids


def test_reasoning_is_any_ordinary_token_then_the_close_token(frontend, json_grammar) -> None:
    """In reasoning exactly the ordinary tokens and the close token are legal: never EOS, never
    another control token; a spelled `</think>` keeps the output in reasoning."""
    domain, close = frontend.domain, frontend.thinking.close_id
    matcher = xgr.GrammarMatcher(json_grammar)
    ordinary = {i for i in range(domain.size) if domain.is_ordinary(i)}
    assert _legal(matcher, domain) == ordinary | {close}
    for t in _ordinary("I think</think>\n\n{\"n\": 1}"):
        assert matcher.accept_token(t)
    assert _legal(matcher, domain) == ordinary | {close}


@pytest.mark.parametrize("content_rule,prefix_ok,tail", [
    ('root ::= " " [a-z]+', lambda b: b[:1] == b" " and all(97 <= c <= 122 for c in b[1:]),
     " ab"),
    ('root ::= "\\n" [a-z]+', lambda b: b[:1] == b"\n" and all(97 <= c <= 122 for c in b[1:]),
     "\nab"),
], ids=["space-first", "newline-first"])
def test_separator_is_exact_and_byte_level(content_rule, prefix_ok, tail, frontend,
                                           compiler) -> None:
    """After the close token exactly the tokens that continue "\n\n" + a content prefix are
    legal (EOS and bare content refused), a token holding the separator's end and the content's
    start among them; the decoder publishes the content with its first character kept."""
    domain, close = frontend.domain, frontend.thinking.close_id
    grammar = compiler.compile_grammar(build_framed_grammar(
        OutputConstraint.grammar(content_rule), "qwen-think-v1+raw", domain))
    matcher = xgr.GrammarMatcher(grammar)
    assert matcher.accept_token(close)

    def continues(data: bytes) -> bool:
        if not data:
            return False
        if b"\n\n".startswith(data):
            return True
        return data.startswith(b"\n\n") and prefix_ok(data[2:])

    expected = {i for i in range(len(domain.token_bytes))
                if domain.is_ordinary(i) and continues(domain.token_bytes[i])}
    assert _legal(matcher, domain) == expected
    tokens = [close] + _ordinary("\n\n" + tail)
    assert all(matcher.accept_token(t) for t in tokens[1:]) and matcher.is_completed()
    dec = frontend.phase_decoder(REASONING)
    assert "".join(i for i in dec.feed(tokens) + dec.finish() if isinstance(i, str)) == tail


def _session_masks(session: OutputSession, domain) -> torch.Tensor:
    out = torch.zeros((1, domain.mask_words), dtype=torch.int32)
    session.lookahead((), out)
    return out


@pytest.mark.parametrize("reasoning", ["Let me count.", "Let me count.\n"])
def test_forced_close_reaches_the_natural_close_state(reasoning, frontend, json_grammar) -> None:
    """A budget-forced close (the phase decoder's close sequence, previewed with
    OutputSession.preview_forced and confirmed) and a natural close reach the same matcher state
    (same masks after) and the same decoder phase and reasoning."""
    domain = frontend.domain
    ids = _ordinary(reasoning)
    natural_ids = ids + [frontend.thinking.close_id] + _ordinary("\n\n")
    forced = OutputSession(domain, XgrammarConstraint(json_grammar, domain))
    natural = OutputSession(domain, XgrammarConstraint(json_grammar, domain))
    dec_f, dec_n = frontend.phase_decoder(REASONING), frontend.phase_decoder(REASONING)
    for session, dec, tokens in ((forced, dec_f, ids), (natural, dec_n, natural_ids)):
        assert session.preview(tokens).accepted == len(tokens)
        session.confirm()
        dec.feed(tokens)
    close = dec_f.forced_close()
    assert frontend.thinking.close_id in close
    assert forced.preview_forced(close).accepted == len(close)
    forced.confirm()
    dec_f.feed(close)
    assert torch.equal(_session_masks(forced, domain), _session_masks(natural, domain))
    assert dec_f.phase == dec_n.phase == CONTENT
    for session in (forced, natural):
        assert session.preview(_ordinary('{"n": 7}')).accepted > 0
        session.confirm()
        assert session.may_end


def test_walks_split_into_reasoning_and_valid_content(frontend, json_grammar) -> None:
    """Random walks on the real vocabulary: the phase decoder's reasoning is the bytes before the
    close token (less the framing line break), its content is the bytes after the separator, and
    the content is valid JSON of the schema."""
    domain, close = frontend.domain, frontend.thinking.close_id
    rng = random.Random(4)
    done = 0
    for _ in range(4):
        w = walk(json_grammar, domain, rng, max_tokens=60, end_bias=0.5,
                 prefer=frozenset({close}), prefer_weight=0.08, scripts=(b'{"n": 1}',),
                 script_rate=0.3)
        if not w.completed:
            continue
        done += 1
        at = w.tokens.index(close)
        raw = b"".join(domain.token_bytes[t] for t in w.tokens[:at])
        content = b"".join(domain.token_bytes[t] for t in w.tokens[at + 1:])
        assert content.startswith(b"\n\n")
        dec = frontend.phase_decoder(REASONING)
        items = dec.feed(w.tokens) + dec.finish()
        reasoning = "".join(i.text for i in items if isinstance(i, ReasoningDelta))
        text = "".join(i for i in items if isinstance(i, str))
        expected = raw[:-1] if raw.endswith(b"\n") else raw
        assert reasoning == expected.decode("utf-8", "replace")
        assert text == content[2:].decode("utf-8")
        jsonschema.validate(json.loads(text), SCHEMA)
    assert done >= 2


def test_exclude_token_union_pitfall() -> None:
    """Why the reasoning branch is one `ExcludeToken(a, b, ...)`: xgrammar 0.2.8 masks
    `ExcludeToken(a) | ExcludeToken(b)` as the intersection of the two sets (neither a nor b
    legal, though each branch allows the other), so a union of exclusions would be wrong. If this
    starts failing, the engine changed; the single terminal stays exact either way."""
    from tests.support.qwen_support import xml_domain

    d = xml_domain()
    compiler = xgr.GrammarCompiler(d.tokenizer_info(), max_threads=1, cache_enabled=False)
    masks = []
    for rule in ("root ::= ExcludeToken(97) | ExcludeToken(98)", "root ::= ExcludeToken(97, 98)"):
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(rule))
        masks.append(_legal(matcher, d))
    ordinary = {i for i in range(d.size) if d.is_ordinary(i)}
    assert ordinary - {97, 98} <= masks[1] and not {97, 98} & masks[1]
    assert masks[0] == masks[1]  # the engine's intersection, not the union
    # ExcludeToken admits control tokens too: the reasoning branch lists them explicitly.
    assert d.control_ids <= masks[1]
