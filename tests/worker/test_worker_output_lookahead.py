"""OutputSession lookahead: the K+1 position states and masks along a draft chain (Ready,
DeadEnd, Unreachable), rollback to the baseline, and the batched ordinary-decode fill.

Independent bases: legal sets enumerated from choice lists (a token is legal after prefix p iff
p + its bytes is a prefix of some choice; EOS iff p is a choice) and a fresh xgrammar matcher fed
the committed tokens directly (tests/support/session_support.py).
"""

from __future__ import annotations

import random

import torch
import xgrammar as xgr

from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.grammar.engines.matching import legal_ids
from services.worker.output.positions import filler_row
from services.worker.output.session import OutputSession
from services.worker.program.masks import MaskBuffers
from shared.errors import ConstraintDeadEnd
from shared.frontends.token_domain import TokenDomain
from tests.support.common import byte_domain
from tests.support.session_support import (
    DOMAIN,
    EOS,
    ID,
    D,
    R,
    U,
    V,
    buffer,
    choice,
    commit,
    fresh_mask,
    gbnf,
    oracle_legal,
    toks,
)


def test_masks_match_enumeration_and_clear_bits_past_v():
    """"The lowest bit of a word is the smaller token id, and bits of the last word beyond V are
    zero." Each Ready row equals the enumerated legal set of its prefix."""
    options = ("abc", "abd", "x", "\u65e5")
    session = OutputSession(DOMAIN, choice(*options))
    out = buffer(4)
    result = session.lookahead(toks(b"ab") + [ID[b"d"]], out)
    assert result.states == (R, R, R, R)
    for i, prefix in enumerate((b"", b"a", b"ab", b"abd")):
        assert set(legal_ids(out[i], 1 << 20)) == oracle_legal(prefix, options), prefix
    # A permissive language: xgrammar 0.2.8 sets bits past V here unless they are cleared.
    wide = OutputSession(DOMAIN, gbnf("root ::= [^a]*"))
    wide.lookahead([], out)
    assert max(legal_ids(out[0], 1 << 20)) < V
    assert legal_ids(filler_row(V), 1 << 20) == list(range(V))


def test_illegal_draft_at_each_position():
    """"if draft[i] is not in mask[i]: stop; later positions are Unreachable" and "The predicted
    position of the first illegal draft is itself Ready, with the mask of the legal prefix"."""
    options = ("abcd", "abce")
    good = toks(b"abcd")
    for i in range(len(good)):
        session = OutputSession(DOMAIN, choice(*options))
        drafts = good[:i] + [ID[b"z"]] + good[i + 1:]
        out = buffer(len(drafts) + 1)
        result = session.lookahead(drafts, out)
        assert result.states == (R,) * (i + 1) + (U,) * (len(drafts) - i)
        assert result.illegal_at == i and result.ready == i + 1
        assert set(legal_ids(out[i], 1 << 20)) == oracle_legal(b"abcd"[:i], options)
        for j in range(i + 1, len(drafts) + 1):
            assert torch.equal(out[j], filler_row(V))
        assert result.states_tensor().tolist() == [int(s) for s in result.states]


def test_eos_in_the_middle_and_out_of_range_drafts():
    """"if EOS was accepted: later positions are Unreachable; stop" - the position where EOS was
    legal is Ready; an EOS where the language may not end is an illegal draft."""
    options = ("ab", "abab")
    session = OutputSession(DOMAIN, choice(*options))
    out = buffer(6)
    result = session.lookahead(toks(b"ab") + [EOS] + toks(b"ab"), out)
    assert result.states == (R, R, R, U, U, U) and result.eos_at == 2
    assert EOS in legal_ids(out[2], 1 << 20)
    result = session.lookahead(toks(b"a") + [EOS], out)
    assert result.states == (R, R, U) and result.illegal_at == 1
    result = session.lookahead([V + 3, -1], out)  # ids outside the domain are illegal drafts
    assert result.states == (R, U, U) and result.illegal_at == 0


def test_dead_end_positions():
    """"When a lookahead prefix can be accepted but can produce no further token, its next position
    is DeadEnd"; at an ordinary position the session reports ConstraintDeadEnd."""
    tiny = TokenDomain(name="tiny", token_bytes=(b"a", b"bc", b"<eos>"), size=3,
                       eos_ids=frozenset({2}), control_ids=frozenset())
    compiler = xgr.GrammarCompiler(tiny.tokenizer_info(), max_threads=1, cache_enabled=False)
    compiled = XgrammarConstraint(compiler.compile_grammar('root ::= "a" "bd" | "bc"'), tiny)
    session = OutputSession(tiny, compiled)
    out = torch.zeros(3, tiny.mask_words, dtype=torch.int32)
    result = session.lookahead([0, 1], out)
    assert result.states == (R, D, U) and result.dead_end_at == 1
    assert torch.equal(out[1], filler_row(3)) and torch.equal(out[2], filler_row(3))
    assert session.lookahead([], out).states == (R,)  # rolled back: the start is fine
    commit(session, [0])
    result = session.lookahead([], out, position=1)
    assert result.states == (D,)
    error = result.dead_end_error()
    assert isinstance(error, ConstraintDeadEnd) and error.position == 1
    assert not session.can_continue and not session.may_end


def test_lookahead_leaves_no_side_effect():
    """"Lookahead always returns to the baseline": random walks interleaved with lookaheads give the
    same outputs and masks as walks without them, and each mask equals a fresh matcher's."""
    compiled = gbnf('root ::= "[" (num ("," num)*)? "]"\nnum ::= "-"? [0-9]+')
    pool = toks(b"0123456789,-][") + [EOS, ID[b"10"], ID[b"-1"], 999]

    def walk(seed: int, interleave: bool) -> tuple[list[int], list[list[int]]]:
        rng, noise = random.Random(seed), random.Random(seed + 1000)
        session = OutputSession(DOMAIN, compiled)
        out, committed, masks = buffer(9), [], []
        while not session.finished:
            if interleave:
                drafts = [noise.choice(pool) for _ in range(noise.randrange(9))]
                session.lookahead(drafts, out)
            session.lookahead([], out)
            ids = legal_ids(out[0], V)
            masks.append(ids)
            assert torch.equal(out[0], fresh_mask(compiled, committed))
            token = EOS if EOS in ids and (rng.random() < 0.2 or len(ids) == 1) else \
                rng.choice([i for i in ids if i != EOS])
            commit(session, [token])
            committed.append(token)
        return committed, masks

    for seed in range(6):
        assert walk(seed, True) == walk(seed, False)


def test_fill_ordinary_equals_lookahead_per_session():
    """The batched ordinary-decode fill (one multi-threaded xgrammar call for many rows) gives
    every session the mask, state and counters its own `lookahead(())` would, dead ends included."""
    tiny = TokenDomain(name="tiny", token_bytes=(b"a", b"bc", b"<eos>"), size=3,
                       eos_ids=frozenset({2}), control_ids=frozenset())
    tiny_compiler = xgr.GrammarCompiler(tiny.tokenizer_info(), max_threads=1, cache_enabled=False)
    dead = OutputSession(tiny, XgrammarConstraint(
        tiny_compiler.compile_grammar('root ::= "a" "bd" | "bc"'), tiny))
    commit(dead, [0])  # "a": nothing can follow
    sessions = [OutputSession(byte_domain(), choice("red", "green", "gr")),
                OutputSession(byte_domain(), gbnf('root ::= [0-9]+ "."')),
                OutputSession(byte_domain(), choice("yes", "no"))]
    commit(sessions[0], toks(b"gr"))
    commit(sessions[1], toks(b"12"))
    expected = [s.lookahead([], buffer(1)) for s in sessions]
    masks = [buffer(1) for _ in sessions]
    for s, m in zip(sessions, masks):
        s.lookahead([], m)
    buffers = MaskBuffers(byte_domain(), 3, 2, torch.device("cpu"))  # rows 0, 3, 6 of [B*(K+1)]
    buffers.host.fill_(-1)
    fill = buffers.fill_ordinary(sessions, [2, 2, 0])
    assert all(e.states == (R,) for e in expected) and not fill.dead_ends
    assert buffers.host_row.tolist() == [0, 3, 6]
    for j, m in enumerate(masks):
        assert torch.equal(buffers.host[j, 0], m[0])
    assert [s.report().mask_positions for s in sessions] == [3, 3, 3]
    alive = OutputSession(tiny, XgrammarConstraint(
        tiny_compiler.compile_grammar('root ::= "a" "bd" | "bc"'), tiny))
    tiny_buffers = MaskBuffers(tiny, 2, 0, torch.device("cpu"))
    fill = tiny_buffers.fill_ordinary([dead, alive], [1, 0])
    assert set(fill.dead_ends) == {0} and tiny_buffers.host_row.tolist() == [-1, 1]
    assert torch.equal(tiny_buffers.host[0, 0], filler_row(3))
    error = fill.dead_ends[0]
    assert isinstance(error, ConstraintDeadEnd) and error.position == 1
