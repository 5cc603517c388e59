"""Previews: the provisional accept of the tokens one step produced, before the Program commits
them (design document, section 5).

`accept_produced` walks the produced tokens through a session's matcher (an unconstrained
session's through its token domain) up to EOS and the output budget left, and stops at the first
token the matcher refuses or the domain never generates; the session (session.py) keeps what it
accepted pending until `confirm()`, or rolls the matcher back to its mark. `PreviewResult` is what
a preview tells the Request; nothing is published before the confirm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from services.worker.output.named_matcher import NamedMatcher
from shared.errors import InternalError
from shared.frontends.token_domain import TokenDomain


@dataclass(frozen=True)
class PreviewResult:
    """The provisional outcome of a preview. Nothing is published before `confirm()`."""

    accepted: int  # tokens of the produced sequence accepted (EOS included when accepted)
    terminated: bool = False  # EOS accepted: a normal completion
    length_cut: bool = False  # the output budget ran out at the end of the accepted prefix
    failure: InternalError | None = None  # an illegal token; the session is back at its mark
    row_only: bool = False  # the matcher itself failed: this row fails, the others commit

    @staticmethod
    def of(accepted: int, terminated: bool, length_cut: bool) -> "PreviewResult":
        """The result of a preview without failure: one shared instance per outcome (a preview
        runs per row and step, and the results are immutable)."""
        key = (accepted, terminated, length_cut)
        result = _OUTCOMES.get(key)
        if result is None:
            result = _OUTCOMES[key] = PreviewResult(accepted, terminated, length_cut)
        return result


_OUTCOMES: dict[tuple[int, bool, bool], PreviewResult] = {}


@dataclass(slots=True)
class Accepted:
    """What `accept_produced` did, which a session keeps pending until its confirm: the tokens it
    accepted (`matcher_tokens` of them through the matcher, to roll back), whether the last was
    EOS or the budget ran out there, and why it stopped early: `illegal` (a token the matcher
    refused or the domain never generates: the mask said legal) or `error` (the matcher raised:
    its state is lost)."""

    accepted: int = 0
    matcher_tokens: int = 0
    terminated: bool = False
    length_cut: bool = False
    illegal: InternalError | None = None
    error: Exception | None = None
    result: PreviewResult | None = None  # the preview's result, when one is shared with it


def accept_produced(matcher: NamedMatcher | None, domain: TokenDomain, tokens: Sequence[int], *,
                    limit: int | None, position: int, forced: bool) -> Accepted:
    """Accept `tokens` into `matcher` (None: only check them against `domain`) up to an accepted
    EOS and, unless `forced` (a fixed control string, accepted whole), `limit` tokens (None:
    unlimited). `position`: committed output tokens, for error messages. The accepted tokens
    stay accepted; the caller rolls them back or keeps them."""
    a = Accepted()
    try:
        for token in map(int, tokens):
            if not forced and limit is not None and a.accepted >= limit:
                break
            if matcher is not None:
                if not matcher.accept_token(token):
                    a.illegal = InternalError(f"the matcher refused produced token {token} at "
                                              f"output position {position + a.accepted}")
                    break
                a.matcher_tokens += 1
                a.terminated = matcher.is_terminated()
            elif not domain.is_ordinary(token) and token not in domain.eos_ids \
                    and token not in domain.control_ids:
                a.illegal = InternalError(f"produced token {token} is never generable")
                break
            else:
                a.terminated = token in domain.eos_ids
            a.accepted += 1
            if a.terminated:
                break
    except Exception as exc:  # the engine failed on this row's state: only its row fails
        a.error = exc
        return a
    a.length_cut = not a.terminated and limit is not None and a.accepted >= limit
    return a


def accept_one(matcher: NamedMatcher | None, domain: TokenDomain, token: int, *,
               limit: int | None, position: int) -> Accepted:
    """`accept_produced` of one token within the budget (`limit` None or >= 1, not forced): a
    decode row, the commit path's common case, without the general walk. A success is one shared
    record per outcome, with its result (neither is changed afterwards)."""
    if matcher is None:
        terminated = token in domain.eos_ids
        if not terminated and token not in domain.control_ids and not domain.is_ordinary(token):
            return Accepted(illegal=InternalError(f"produced token {token} is never generable"))
        return _ONE[0, terminated, not terminated and limit == 1]
    try:
        if not matcher.accept_token(token):
            return Accepted(illegal=InternalError(f"the matcher refused produced token {token} at "
                                                  f"output position {position}"))
        # a matcher is terminated once it accepted EOS (the engines' contract), and this one had
        # not before this token: only an EOS token can terminate it
        terminated = token in domain.eos_ids and matcher.is_terminated()
    except Exception as exc:  # the engine failed on this row's state: only its row fails
        return Accepted(error=exc)
    return _ONE[1, terminated, not terminated and limit == 1]


# by (tokens through the matcher, terminated, length cut)
_ONE = {(m, t, c): Accepted(1, m, t, c, result=PreviewResult.of(1, t, c))
        for m in (0, 1) for t in (False, True) for c in (False, True)}
