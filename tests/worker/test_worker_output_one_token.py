"""A preview of one produced token (OutputSession.preview's decode-row case) is the general
preview's transaction: the same result, the same pending state for confirm and discard, the same
failures ("An illegal token returns a result with `failure` set ... and leaves the session at
its mark with nothing pending"; a matcher that raises fails its row alone). The reference is the
general walk (`accept_produced`) on a second session given the same tokens."""

from __future__ import annotations

import pytest
import torch

from services.grammar.compiler import ModelCompiler
from services.worker.output import session as session_module
from services.worker.output.preview import accept_produced
from services.worker.output.session import OutputSession
from shared.contract import OutputConstraint
from shared.errors import InternalError
from tests.support.common import byte_domain

DOMAIN = byte_domain()
EOS = next(iter(DOMAIN.eos_ids))
CTL = next(iter(DOMAIN.control_ids))
COMPILED = ModelCompiler(DOMAIN).compile(OutputConstraint.choice(["ab", "a"])).grammar


def _general(session: OutputSession, tokens, limit):
    """The preview through the general walk: `accept_one` replaced by `accept_produced`."""
    saved = session_module.accept_one
    session_module.accept_one = lambda matcher, domain, token, *, limit, position: \
        accept_produced(matcher, domain, [token], limit=limit, position=position, forced=False)
    try:
        return session.preview(tokens, limit=limit)
    finally:
        session_module.accept_one = saved


def _state(session: OutputSession) -> tuple:
    out = torch.zeros(1, DOMAIN.mask_words, dtype=torch.int32)
    mask = session.lookahead([], out).states if not session.finished else None
    return (session.finished, session.ended_normally, mask, out.tolist())


def _same(compiled, committed: list[int], token: int, limit, then: str) -> None:
    fast, slow = OutputSession(DOMAIN, compiled), OutputSession(DOMAIN, compiled)
    for s in (fast, slow):
        for t in committed:
            assert s.preview([t]).failure is None
            s.confirm()
    a, b = fast.preview([token], limit=limit), _general(slow, [token], limit)
    assert (a.accepted, a.terminated, a.length_cut, a.row_only) == \
        (b.accepted, b.terminated, b.length_cut, b.row_only)
    assert (a.failure is None) == (b.failure is None)
    if a.failure is not None:
        assert str(a.failure) == str(b.failure)
    elif then == "confirm":
        fast.confirm(), slow.confirm()
    else:
        fast.discard(), slow.discard()
    assert _state(fast) == _state(slow)
    if compiled is not None and not fast.finished:
        fast_report, slow_report = fast.report(), slow.report()
        assert fast_report.mask_positions == slow_report.mask_positions
        assert (fast_report.complete, fast_report.terminated) == \
            (slow_report.complete, slow_report.terminated)


@pytest.mark.parametrize("then", ["confirm", "discard"])
@pytest.mark.parametrize("limit", [None, 1, 2])
def test_unconstrained_one_token_is_the_general_preview(then, limit):
    """Ordinary, EOS and control tokens are accepted, a padding id never is; one token left in
    the budget is a length cut unless the token is EOS."""
    for token in (ord("a"), EOS, CTL, DOMAIN.size - 1, DOMAIN.size + 3):
        _same(None, [], token, limit, then)


@pytest.mark.parametrize("then", ["confirm", "discard"])
@pytest.mark.parametrize("limit", [None, 1, 3])
def test_constrained_one_token_is_the_general_preview(then, limit):
    """A legal token, a refused one, EOS where the language may end and where it may not."""
    for committed, token in (([], ord("a")), ([], ord("b")), ([], EOS), ([ord("a")], EOS),
                             ([ord("a")], ord("b")), ([ord("a")], ord("c"))):
        _same(COMPILED, committed, token, limit, then)


def test_no_budget_left_accepts_nothing_and_cuts():
    """`limit` 0: nothing accepted, a length cut, as the general walk says."""
    for compiled in (None, COMPILED):
        result = OutputSession(DOMAIN, compiled).preview([ord("a")], limit=0)
        assert (result.accepted, result.length_cut, result.failure) == (0, True, None)


def test_a_raising_matcher_fails_its_row_only_and_a_pending_preview_is_an_error():
    session = OutputSession(DOMAIN, COMPILED)

    def boom(token):
        raise RuntimeError("engine state lost")

    session._matcher.accept_token = boom
    result = session.preview([ord("a")])
    assert result.row_only and "engine state lost" in str(result.failure)
    ok = OutputSession(DOMAIN, None)
    ok.preview([ord("a")])
    with pytest.raises(InternalError):
        ok.preview([ord("b")])
