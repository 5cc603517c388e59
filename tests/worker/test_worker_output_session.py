"""OutputSession: preview/confirm/discard, the three facts, output decoding, continuation prefixes
and the constraint report (lookahead and its masks: test_worker_output_lookahead.py).

Independent bases: legal sets enumerated from choice lists (a token is legal after prefix p iff
p + its bytes is a prefix of some choice; EOS iff p is a choice), a fresh xgrammar matcher fed the
committed tokens directly, Python's `re` for regular languages and `jsonschema` for JSON.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.grammar.engines.matching import legal_ids
from services.worker.output.positions import PositionState
from services.worker.output.session import OutputSession
from shared.errors import InternalError, InvalidRequest
from tests.support.session_support import (
    DOMAIN,
    EOS,
    V,
    buffer,
    choice,
    commit,
    compiler,
    fresh_mask,
    gbnf,
    toks,
)


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
        compiler().compile_json_schema(json.dumps(schema), any_whitespace=False), DOMAIN)
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
