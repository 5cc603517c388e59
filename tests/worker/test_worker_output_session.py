"""OutputSession: lookahead states and rollback, preview/confirm/discard, the three facts, output
decoding, continuation prefixes and the constraint report.

Independent bases: legal sets enumerated from choice lists (a token is legal after prefix p iff
p + its bytes is a prefix of some choice; EOS iff p is a choice), a fresh xgrammar matcher fed the
committed tokens directly, Python's `re` for regular languages and `jsonschema` for JSON.
"""

from __future__ import annotations

import json
import random
import re
from functools import lru_cache

import jsonschema
import pytest
import torch
import xgrammar as xgr

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.grammar.engines.matching import legal_ids
from services.worker.output.positions import PositionState, filler_row
from services.worker.output.session import OutputSession
from services.worker.program.masks import MaskBuffers
from shared.contract import OutputConstraint
from shared.errors import ConstraintDeadEnd, InternalError, InvalidRequest
from shared.frontends.token_domain import TokenDomain
from tests.support.common import byte_domain

R, D, U = PositionState.READY, PositionState.DEAD_END, PositionState.UNREACHABLE
DOMAIN = byte_domain()
EOS = next(iter(DOMAIN.eos_ids))
V = DOMAIN.size
ID = {b: i for i, b in enumerate(DOMAIN.token_bytes) if i not in DOMAIN.special_ids}


@lru_cache(maxsize=None)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(DOMAIN.tokenizer_info(), max_threads=1, cache_enabled=False)


@lru_cache(maxsize=None)
def gbnf(text: str) -> xgr.CompiledGrammar:
    return XgrammarConstraint(_compiler().compile_grammar(text), DOMAIN)


@lru_cache(maxsize=None)
def choice(*options: str) -> xgr.CompiledGrammar:
    return ModelCompiler(DOMAIN).compile(OutputConstraint.choice(list(options))).grammar


def toks(data: bytes) -> list[int]:
    """Single-byte tokens of `data` (byte_domain ids 0..255 are the bytes themselves)."""
    return list(data)


def buffer(rows: int) -> torch.Tensor:
    return torch.zeros(rows, DOMAIN.mask_words, dtype=torch.int32)  # [K+1, ceil(V/32)]


def oracle_legal(prefix: bytes, options: tuple[str, ...]) -> set[int]:
    encoded = [o.encode() for o in options]
    legal = {i for i, b in enumerate(DOMAIN.token_bytes)
             if i not in DOMAIN.special_ids and any(c.startswith(prefix + b) for c in encoded)}
    return legal | ({EOS} if prefix in encoded else set())


def fresh_mask(compiled: xgr.CompiledGrammar, committed: list[int]) -> torch.Tensor:
    """The mask after `committed`, from a matcher that never saw a lookahead."""
    m = xgr.GrammarMatcher(compiled.compiled)
    for t in committed:
        assert m.accept_token(t)
    row = buffer(1)
    m.fill_next_token_bitmask(row, 0)
    return row[0]


def commit(session: OutputSession, tokens: list[int]) -> None:
    result = session.preview(tokens)
    assert result.failure is None and result.accepted == len(tokens)
    session.confirm()


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


def test_preview_confirm_discard():
    """"an output preview may leave the matcher provisional, confirmed at commit or returned to
    the mark on discard"; "Preview and lookahead exclude each other"."""
    compiled = choice("abc", "abd")
    session = OutputSession(DOMAIN, compiled)
    out = buffer(2)
    before = fresh_mask(compiled, [])
    result = session.preview(toks(b"ab"))
    assert (result.accepted, result.terminated) == (2, False)
    with pytest.raises(InternalError):
        session.lookahead([], out)
    with pytest.raises(InternalError):
        session.preview(toks(b"c"))
    session.discard()
    session.lookahead([], out)
    assert torch.equal(out[0], before)
    commit(session, toks(b"ab"))
    session.lookahead([], out)
    assert torch.equal(out[0], fresh_mask(compiled, toks(b"ab")))
    # Tokens after EOS are not accepted; an illegal token fails and leaves nothing pending.
    result = session.preview(toks(b"d") + [EOS] + toks(b"x"))
    assert (result.accepted, result.terminated) == (2, True)
    session.discard()
    result = session.preview(toks(b"cz"))
    assert result.failure is not None and result.accepted == 0
    session.discard()  # a batch-wide restore after a failure is harmless
    session.lookahead([], out)
    assert torch.equal(out[0], fresh_mask(compiled, toks(b"ab")))
    with pytest.raises(InternalError):
        session.confirm()
    commit(session, toks(b"c") + [EOS])
    assert session.ended_normally and session.finished


@pytest.mark.parametrize("options", [("7", "42", "421", ""), ("a b", "a", "\u00e9t\u00e9")])
def test_eos_only_where_the_language_may_end(options):
    """"the matcher opens EOS only where the output language may end and terminates after
    accepting it" - checked on every prefix of every choice, byte by byte."""
    prefixes = {o.encode()[:k] for o in options for k in range(len(o.encode()) + 1)}
    encoded = {o.encode() for o in options}
    out = buffer(1)
    for prefix in sorted(prefixes):
        session = OutputSession(DOMAIN, choice(*options))
        for t in toks(prefix):
            commit(session, [t])
        session.lookahead([], out)
        assert (EOS in legal_ids(out[0], V)) == (prefix in encoded), prefix
        assert session.may_end == (prefix in encoded)


def test_three_facts_for_digits():
    """"root ::= [0-9]+ may end after generating 1 and may still continue with digits. 'May end' is
    not 'must end now'." The facts are compared with Python's `re` on the committed text."""
    session = OutputSession(DOMAIN, gbnf("root ::= [0-9]+"))
    digits = re.compile(r"[0-9]+")
    text = ""
    for step in ("", "1", "2"):
        if step:
            commit(session, toks(step.encode()))
            text += step
        assert session.may_end == bool(digits.fullmatch(text))
        assert session.can_continue and not session.ended_normally
    commit(session, [EOS])
    assert session.ended_normally and not session.can_continue
    closed = OutputSession(DOMAIN, choice("ab"))
    commit(closed, toks(b"ab"))
    assert closed.may_end and not closed.can_continue and not closed.ended_normally


def test_length_cut_is_incomplete():
    """"When a length interruption falls inside a multi-byte character ... the result is only a
    truncated display"; "Complete content stopping at the output limit may show complete=true,
    terminated=false"."""
    session = OutputSession(DOMAIN, choice("\u65e5\u672c"))
    result = session.preview(toks("\u65e5\u672c".encode()), limit=4)
    assert (result.accepted, result.length_cut, result.terminated) == (4, True, False)
    session.confirm()
    assert session.finished and not session.ended_normally
    report = session.report()
    assert report is not None and not report.complete and not report.terminated
    exact = OutputSession(DOMAIN, choice("ab", "abc"))
    result = exact.preview(toks(b"abc"), limit=2)
    assert (result.accepted, result.length_cut) == (2, True)
    exact.confirm()
    report = exact.report()
    assert report is not None and report.complete and not report.terminated
    with pytest.raises(InternalError):
        exact.lookahead([], buffer(1))


def test_prefix_continuation():
    """"Completeness covers provided content + new suffix: a prefix {"name": and a suffix
    "Shanghai"} form a complete object". Checked with jsonschema."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
              "additionalProperties": False}
    compiled = XgrammarConstraint(
        _compiler().compile_json_schema(json.dumps(schema), any_whitespace=False), DOMAIN)
    prefix = b'{"name": '
    session = OutputSession(DOMAIN, compiled, prefix=prefix)
    assert not session.may_end
    suffix = '"Shanghai"}'
    commit(session, toks(suffix.encode()))
    assert session.may_end
    jsonschema.validate(json.loads(prefix.decode() + suffix), schema)
    with pytest.raises(json.JSONDecodeError):
        json.loads(suffix)
    commit(session, [EOS])
    assert session.ended_normally
    report = session.report()
    assert report is not None and report.complete and report.terminated
    for bad in (b"[", b"\xff"):
        with pytest.raises(InvalidRequest) as info:
            OutputSession(DOMAIN, compiled, prefix=bad)
        assert info.value.field == "prefix"


def test_forced_control_preview():
    """"Fixed control tokens advance through the same matcher's preview/commit ... they count
    toward the output budget"; the forced string is not shortened by K+1 or the budget."""
    grammar = gbnf('root ::= "</think>" [a-z]+')
    session = OutputSession(DOMAIN, grammar)
    forced = toks(b"</think>")
    result = session.preview_forced(forced, limit=3)
    assert result.accepted == len(forced) and result.length_cut
    session.discard()
    after_discard = buffer(1)
    session.lookahead([], after_discard)
    assert torch.equal(after_discard[0], fresh_mask(grammar, []))
    bad = session.preview_forced(toks(b"</x"), limit=3)
    assert bad.failure is not None
    session.lookahead([], after_discard)
    assert torch.equal(after_discard[0], fresh_mask(grammar, []))


def test_a_held_forced_preview_waits_for_its_append():
    """"matcher and decoder state are confirmed only after the Program's append succeeds": a held
    forced preview lets the next step's masks and preview build on it (the mask after the close),
    `confirm_held` commits it before that step's preview is confirmed, and `finish_incomplete`
    before then returns the matcher to before the close."""
    grammar = gbnf('root ::= "</think>" [a-z]+')
    forced = toks(b"</think>")
    for appended in (True, False):
        session = OutputSession(DOMAIN, grammar)
        session.preview_forced(forced, limit=10)
        session.hold()
        assert session.holding
        with pytest.raises(InternalError):
            session.hold()
        out = buffer(1)
        session.lookahead([], out)  # the next step's mask: after the held close
        assert torch.equal(out[0], fresh_mask(grammar, forced))
        session.preview(toks(b"a"), limit=10)
        if appended:
            session.confirm_held()
            session.confirm()
            assert not session.holding
            session.lookahead([], out)
            assert torch.equal(out[0], fresh_mask(grammar, forced + toks(b"a")))
        else:
            session.finish_incomplete()
            assert not session.holding and session.finished
            with pytest.raises(InternalError):
                session.confirm_held()


def test_constraint_report_counts():
    """"the positions masks were actually computed for and the mask H2D bytes of successful
    commits ... Rolled-back lookahead is work already paid and its counts are not rolled back"."""
    session = OutputSession(DOMAIN, choice("abc"), cache="l1", compile_ms=0.0)
    out = buffer(4)
    session.lookahead(toks(b"abc"), out)  # 4 positions
    session.lookahead(toks(b"x"), out)  # 1 position (illegal at 0)
    commit(session, toks(b"a"))
    session.counters.add_upload_bytes(2 * DOMAIN.mask_words * 4)
    report = session.report()
    assert report is not None
    data = report.to_dict()
    assert data["mask_positions"] == 5 and data["mask_upload_bytes"] == 2 * DOMAIN.mask_words * 4
    assert data["cache"] == "l1" and data["branch"] == "content" and not data["terminated"]
    assert data["mask_seconds"] > 0 and data["rollback_seconds"] > 0 and data["accept_seconds"] > 0
    assert json.loads(json.dumps(data)) == data


def test_unconstrained_session():
    """"A batch with no constraints ... passes no mask": an unconstrained session writes no mask,
    reports no constraint, and still tracks EOS and the budget."""
    session = OutputSession(DOMAIN, None)
    out = buffer(3)
    out.fill_(7)
    result = session.lookahead([1, 2], out)
    assert result.states == (PositionState.DISABLED,) * 3 and bool((out == 7).all())
    commit(session, toks("\u00e9".encode())[:1])
    result = session.preview(toks("\u00e9".encode())[1:] + [EOS, 65])
    assert (result.accepted, result.terminated) == (2, True)
    session.confirm()
    assert session.report() is None and session.ended_normally and session.may_end


def test_finish_incomplete_discards():
    """"Users may interrupt through the generation limit or cancellation; the result is then
    explicitly incomplete": an uncommitted preview is dropped, the output is finished."""
    compiled = choice("\u65e5\u672c")
    session = OutputSession(DOMAIN, compiled)
    commit(session, toks("\u65e5".encode()) + [0xE6])
    session.preview([0x9C])  # uncommitted: dropped
    session.finish_incomplete()
    assert session.finished and not session.ended_normally
    report = session.report()
    assert report is not None and not report.complete and not report.terminated
    session.finish_incomplete()  # again: harmless


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
