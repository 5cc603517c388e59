"""The phase decoder's shortcut for plain content text (shared/frontends/thinking.py,
`PhaseDecoder.content_text`): "Returning text means it was read", and it reads a token exactly as
`feed_token` would, so the commit path may try it first for every token."""

from __future__ import annotations

import random

from bench.random_weights import ByteTokenizer
from shared.frontends.thinking import CONTENT, QWEN_THINK, REASONING, PhaseDecoder, ThinkingFraming
from tests.support.qwen_support import xml_domain

DOMAIN = xml_domain()
ENCODE = ByteTokenizer(DOMAIN).encode
THINKING = ThinkingFraming.build(QWEN_THINK, DOMAIN, ENCODE)
EOS = min(DOMAIN.eos_ids)
# Reasoning, the close and its separator, multi-byte characters split across tokens, control
# tokens in content, EOS: every state the shortcut must refuse or read the same
PARTS = ["plain text ", "\u65e5\u00e9", "\n", "\n\n", "</think>", "<tool_call>", "x\ny",
         "{\"a\": 1}", "\u00e9t\u00e9 ", "  "]


def _reference(phase: str, tokens: list[int]) -> list:
    decoder = PhaseDecoder(DOMAIN, THINKING, phase=phase)
    return [piece for t in tokens for piece in decoder.feed_token(t)] + decoder.finish()


def _shortcut(phase: str, tokens: list[int]) -> tuple[list, int]:
    decoder = PhaseDecoder(DOMAIN, THINKING, phase=phase)
    pieces, read = [], 0
    for t in tokens:
        text = decoder.content_text(t)
        if text is None:
            pieces += decoder.feed_token(t)
            continue
        read += 1
        if text:
            pieces.append(text)
    return pieces + decoder.finish(), read


def test_content_text_reads_a_token_as_feed_token_does():
    """Random outputs from both start phases: the pieces are the same whether each token is
    tried with `content_text` first or only fed, and the shortcut did read ordinary text."""
    rng = random.Random(7)
    total = 0
    for _ in range(200):
        tokens = [t for _ in range(rng.randint(1, 8)) for t in ENCODE(rng.choice(PARTS))]
        if rng.random() < 0.3:
            tokens.insert(rng.randrange(len(tokens) + 1), EOS)
        for phase in (REASONING, CONTENT):
            pieces, read = _shortcut(phase, tokens)
            assert pieces == _reference(phase, tokens), (phase, tokens)
            total += read
    assert total > 0


def test_content_text_refuses_what_needs_the_decoder():
    """None (not read) in reasoning, for EOS and control tokens, while a character is unfinished,
    and while the separator after the close token is still expected."""
    reasoning = PhaseDecoder(DOMAIN, THINKING, phase=REASONING)
    assert reasoning.content_text(ENCODE("a")[0]) is None
    content = PhaseDecoder(DOMAIN, THINKING, phase=CONTENT)
    assert content.content_text(EOS) is None
    assert content.content_text(THINKING.close_id) is None
    (lead, *_) = ENCODE("\u65e5")
    assert content.content_text(lead) is None
    content.feed_token(lead)
    assert content.content_text(ENCODE("a")[0]) is None
    closed = PhaseDecoder(DOMAIN, THINKING, phase=REASONING)
    closed.feed_token(THINKING.close_id)
    assert closed.content_text(ENCODE("\n")[0]) is None
    assert PhaseDecoder(DOMAIN, None).content_text(ENCODE("ab")[0]) == "a"
