"""OutputSession: one request's grammar matcher transactions.

One session per request. The compiled constraint (grammar/engines/engine.py: either engine, the
session never knows which) is shared between requests; the matcher,
and any pending preview belong to this session alone, and only the Engine's worker thread calls
it. A session built without a grammar (an unconstrained request) only checks that produced tokens
are generable, tracks EOS, and reports no constraint.

Transactions (design document, section 5):

- `lookahead(drafts, out)` fills one mask row per position, accepting drafts temporarily, and
  always rolls the matcher back to the committed baseline with the matcher's `rollback`; it never
  replays the output. Its counts and time are work paid and stay in the report.
- `preview(tokens, limit=)` accepts the produced tokens provisionally (preview.py: matcher, EOS,
  the output budget left that the Request passes) and fixes the accepted prefix; `confirm()`
  commits it after the Program commit succeeded (nothing there can fail), `discard()` returns to
  the mark. `preview_forced(tokens)` does the same for a fixed control string. A lookahead while
  a preview is pending is an internal error.
- `fill_matcher()` / `filled(row, ...)`: one row of a batched position-0 fill of several
  sessions (program/masks.py), the same transaction as `lookahead(())`.
- `probe()` opens a temporary walk (probe.py) for a proposer; closing it rolls back to the
  committed matcher.

Mask rows and position states: positions.py (the engines leave bits past the domain size zero;
non-Ready positions get the filler row).

Output text is the publication decoder's (publication.py), never the session's.

Counts are not the session's: the Request owns the output ledger and the budget, and passes the
output position (for error messages) and the budget left (`limit`) to the calls that need them.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from services.grammar.client import (
    CompiledConstraint,
    Matcher,
    UniqueItemsConstraint,
)
from services.worker.integrity import IntegrityError
from services.worker.output.named_matcher import LengthCompanion, NameCompanion, NamedMatcher
from services.worker.output.positions import LookaheadResult, PositionState, int32
from services.worker.output.positions import filler as _filler
from services.worker.output.preview import Accepted, PreviewResult, accept_one, accept_produced
from services.worker.output.probe import MatcherProbe
from services.worker.output.report import (
    BRANCHES,
    CACHE_HITS,
    ConstraintCounters,
    ConstraintReport,
)
from shared.errors import InternalError, InvalidRequest
from shared.frontends.token_domain import TokenDomain


class OutputSession:
    """One request's matcher transactions (see the module docstring).

    `compiled`: the shared compiled grammar, or None for an unconstrained request. `prefix`: the
    content a ContinueFinalAssistant request continues (UTF-8 bytes; accepted by the matcher at
    creation, never published, part of completeness; default b""). `branch`: the report's branch
    (default "content"). `cache` ("l1" | "redis" | None), `built`, `waited`, `compile_ms`: the
    compile-cache outcome for the report. `names`: the name companions (one, a sequence or None),
    which share every matcher transaction (named_matcher.py): the XML tool grammar's
    ParameterNameConstraint (non-strict tools) and the JsonNameConstraint of JSON with undeclared
    names (content, tool-call arguments); they clear the masks' tokens that would repeat a name
    and follow every accept, prefix and rollback; `lengths`: the
    XML tool grammar's RawLengthConstraint companion (raw string length bounds the grammar leaves
    to it) or the JsonLengthConstraint of JSON content (the string lengths it leaves to it), the
    same way; `items`: the UniqueItemsConstraint of JSON content (uniqueItems the
    grammar leaves to it), the same way.
    `prefix_tokens`: the continued content as tokens, for a tool grammar (the Frontend's
    `continuation_tokens`), accepted instead of `prefix` bytes.

    Raises InvalidRequest(field="prefix") when the prefix is not UTF-8 or the grammar refuses it,
    InternalError when the grammar
    was compiled for a different vocabulary size or `branch`/`cache` is unknown.
    """

    def __init__(
        self,
        domain: TokenDomain,
        compiled: CompiledConstraint | None = None,
        *,
        prefix: bytes | str = b"",
        branch: str = "content",
        cache: str | None = None,
        built: bool = False,
        waited: bool = False,
        compile_ms: float = 0.0,
        names: NameCompanion | Sequence[NameCompanion] | None = None,
        lengths: LengthCompanion | None = None,
        prefix_tokens: Sequence[int] = (),
        items: UniqueItemsConstraint | None = None,
    ) -> None:
        start = time.perf_counter()
        if branch not in BRANCHES or cache not in CACHE_HITS:
            raise InternalError(f"unknown report branch {branch!r} or cache outcome {cache!r}")
        prefix = prefix.encode("utf-8") if isinstance(prefix, str) else bytes(prefix)
        try:
            prefix.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"prefix is not UTF-8 text: {exc}", field="prefix") from None
        self.domain = domain
        self.branch = branch
        # the report's counters; the Program and the commit path add their upload, wait and
        # round counts here directly
        self.counters = ConstraintCounters(cache=cache, built=built, waited=waited,
                                            compile_ms=compile_ms)
        self._matcher: NamedMatcher | None = None  # the matcher and its companions
        self._pending: Accepted | None = None
        self._held: Accepted | None = None  # a forced-control preview awaiting its append
        self._probing = False  # a MatcherProbe is open
        self._eos = False  # EOS committed
        self._cut = False  # ended by the budget or an interruption
        self._scratch: torch.Tensor | None = None  # [1, ceil(V/32)] for can_continue
        self._broken: InternalError | None = None  # the matcher failed (its state is lost)
        if compiled is None:
            return
        vocab = compiled.domain.size
        if vocab != domain.size:
            raise InternalError(f"grammar compiled for {vocab} token ids, domain has {domain.size}")
        self._matcher = NamedMatcher(compiled.matcher(), names, lengths, items)
        if prefix_tokens:
            for t in prefix_tokens:
                if not self._matcher.accept_token(int(t)):
                    raise InvalidRequest("the continued content prefix is not a prefix of the "
                                         "constrained output language", field="prefix")
        elif prefix and not self._matcher.accept_bytes(prefix):
            raise InvalidRequest("the continued content prefix is not a prefix of the constrained "
                                 "output language", field="prefix")
        self.counters.prepare_seconds += time.perf_counter() - start

    # ---------------------------------------------------------------- masks

    @property
    def constrained(self) -> bool:
        return self._matcher is not None

    @property
    def finished(self) -> bool:
        """True after EOS, a length cut or `finish_incomplete`."""
        return self._eos or self._cut

    def lookahead(self, drafts: Sequence[int], out: torch.Tensor, *,
                  position: int = 0) -> LookaheadResult:
        """Fill `out[0..len(drafts)]` with the masks of committed + drafts[:i] and roll back.

        `out`: `[>= len(drafts)+1, ceil(V/32)]` int32 CPU tensor (a view of the Program's pinned
        buffer). `position`: committed output tokens (the result's base position). An unconstrained
        session returns DISABLED states and writes nothing. Raises InternalError while a preview is
        pending, after the session finished, on a wrong buffer, or when the matcher refuses a draft
        its own mask allowed.
        """
        self._check_idle("lookahead")
        n = len(drafts)
        if self._matcher is None:
            return LookaheadResult((PositionState.DISABLED,) * (n + 1), position)
        size = self.domain.size
        if out.dtype != torch.int32 or out.dim() != 2 or out.shape[0] < n + 1 \
                or out.shape[1] != self.domain.mask_words or out.device.type != "cpu":
            raise InternalError(f"mask buffer must be [>= {n + 1}, {self.domain.mask_words}] int32 "
                                f"on the CPU, got {list(out.shape)} {out.dtype} on {out.device}")
        filler = _filler(size)
        start = time.perf_counter()
        walk = self._matcher.walk(drafts, out, size, filler, self.counters)
        accepted = walk.accepted
        failure = None if walk.error is None else self._fail(walk.error, position + accepted)
        mid = time.perf_counter()
        self.counters.mask_seconds += mid - start
        if failure is not None:  # a DeadEnd at position 0 carrying the failure; no rollback
            out[:n + 1].copy_(filler.expand(n + 1, -1))
            return LookaheadResult((PositionState.DEAD_END,) + (PositionState.UNREACHABLE,) * n,
                                   position, dead_end_at=0, failure=failure)
        if accepted:
            self._rollback(accepted)
            self.counters.rollback_seconds += time.perf_counter() - mid
        return LookaheadResult(tuple(walk.states), position, walk.illegal_at, walk.eos_at,
                               walk.dead_at)

    def fill_matcher(self) -> Matcher:
        """The matcher at the committed baseline, for a batched position-0 fill of several
        sessions in one call per engine (program/masks.py); finish its row with `filled`.
        Raises InternalError while a preview is pending, after the session finished, or for an
        unconstrained session."""
        self._check_idle("lookahead")
        if self._matcher is None:
            raise InternalError("a batched fill needs constrained sessions")
        return self._matcher.matcher

    def filled(self, row: torch.Tensor, *, seconds: float, position: int = 0) -> LookaheadResult:
        """Finish this session's row of a batched fill, as `lookahead(())` would: `row`
        [ceil(V/32)] int32 holds the matcher's mask; the name constraint applies, a row with no
        legal token is a dead end (its row becomes the filler row). `seconds`: this session's
        share of the fill's wall time (the report's)."""
        self.counters.mask_positions += 1
        self.counters.mask_seconds += seconds
        self._matcher.apply_names(row)
        if bool(row.any()):
            return LookaheadResult((PositionState.READY,), position)
        row.copy_(_filler(self.domain.size))
        return LookaheadResult((PositionState.DEAD_END,), position, dead_end_at=0)

    def probe(self) -> MatcherProbe:
        """A temporary walk from the committed matcher (probe.py); use it as a context manager.
        Raises InternalError for an unconstrained, finished or failed session, or while a preview
        or another probe is open."""
        self._check_idle("probe")
        if self._matcher is None or self._broken is not None:
            raise InternalError("probe needs a constrained session whose matcher works")
        self._probing = True
        return MatcherProbe(self._matcher, self.domain, self._close_probe)

    def _close_probe(self) -> None:
        self._probing = False

    def failed(self, exc: BaseException, row: torch.Tensor, *,
               position: int = 0) -> LookaheadResult:
        """This session's row of a batched fill whose matcher raised: a DeadEnd at position 0
        carrying the typed failure (`_fail`); `row` becomes the filler row."""
        row.copy_(_filler(self.domain.size))
        return LookaheadResult((PositionState.DEAD_END,), position, dead_end_at=0,
                               failure=self._fail(exc, position))

    # ---------------------------------------------------------------- previews

    def preview(self, tokens: Sequence[int], *, limit: int | None = None,
                position: int = 0) -> PreviewResult:
        """Accept the actually produced tokens provisionally, up to EOS and `limit` (the output
        budget left, None = unlimited; the Request owns the budget). `position`: committed output
        tokens (for error messages).

        Tokens after an accepted EOS or past the limit are not accepted; reaching the limit
        without EOS is a length cut. An illegal token returns a
        result with `failure` set (an internal inconsistency: the mask said legal) and leaves the
        session at its mark with nothing pending. Raises InternalError while another preview is
        pending or after the session finished."""
        return self._preview(tokens, limit, position, forced=False)

    def preview_forced(self, tokens: Sequence[int], *, limit: int | None = None,
                       position: int = 0) -> PreviewResult:
        """Preview a fixed control token sequence (e.g. a thinking-budget close): every token must
        be accepted, the budget does not shorten it (its tokens still count against `limit`), no
        RNG is involved."""
        return self._preview(tokens, limit, position, forced=True)

    def confirm(self) -> None:
        """Commit the pending preview after the Program commit succeeded. Nothing here can fail
        except calling it without a pending preview (InternalError)."""
        pending = self._pending
        if pending is None:
            raise InternalError("confirm() without a pending preview")
        self._pending = None
        self._eos = pending.terminated
        self._cut = pending.length_cut

    def hold(self) -> None:
        """Keep the pending forced-control preview provisional until the Program has appended
        its tokens to the lane (design document: "matcher and decoder state are confirmed only
        after the Program's append succeeds"). Its tokens are fed with the next step, whose
        masks and preview build on it: lookahead, previews and confirm work on top of it;
        `confirm_held` commits it, `finish_incomplete` returns the matcher to before it.
        InternalError without a pending preview or with one held already."""
        if self._pending is None or self._held is not None:
            raise InternalError("hold() needs a pending preview and none held")
        self._held, self._pending = self._pending, None

    @property
    def holding(self) -> bool:
        """A forced-control preview is held (see `hold`)."""
        return self._held is not None

    def confirm_held(self) -> None:
        """Commit the held preview once the Program appended its tokens (InternalError when
        none is held)."""
        held = self._held
        if held is None:
            raise InternalError("confirm_held() without a held preview")
        self._held = None
        self._eos = held.terminated
        self._cut = held.length_cut

    def discard(self) -> None:
        """Return the matcher to the mark of the pending preview; a no-op when none is pending."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        self._rollback_preview(pending.matcher_tokens)

    def finish_incomplete(self) -> None:
        """End the output without EOS (cancellation, context exhaustion, a failed row): discards a
        pending preview and a held one (nothing uncommitted is published)."""
        self.discard()
        if self._held is not None:
            held, self._held = self._held, None
            self._rollback_preview(held.matcher_tokens)
        self._cut = self._cut or not self._eos

    def _preview(self, tokens: Sequence[int], limit: int | None, position: int, *,
                 forced: bool) -> PreviewResult:
        self._check_idle("preview")
        start = time.perf_counter()
        if len(tokens) == 1 and not forced and (limit is None or limit > 0):  # a decode row
            a = accept_one(self._matcher, self.domain, int(tokens[0]), limit=limit,
                           position=position)
        else:
            a = accept_produced(self._matcher, self.domain, tokens, limit=limit,
                                position=position, forced=forced)
        self.counters.accept_seconds += time.perf_counter() - start
        if a.error is not None:
            return PreviewResult(0, failure=self._fail(a.error, position + a.accepted),
                                 row_only=True)
        if a.illegal is not None:
            self._rollback_preview(a.matcher_tokens)
            return PreviewResult(0, failure=a.illegal)
        self._pending = a
        return a.result if a.result is not None else \
            PreviewResult.of(a.accepted, a.terminated, a.length_cut)

    def _rollback_preview(self, matcher_tokens: int) -> None:
        if matcher_tokens and self._matcher is not None:
            start = time.perf_counter()
            self._rollback(matcher_tokens)
            self.counters.discard_seconds += time.perf_counter() - start

    def _rollback(self, n: int) -> None:
        """Undo the matcher's last n tokens. A matcher that cannot is an integrity failure (the
        committed baseline is lost), never a request's error: IntegrityError."""
        try:
            self._matcher.rollback(n)  # type: ignore[union-attr]
        except Exception as exc:
            raise IntegrityError(f"the matcher could not roll back {n} tokens: "
                                 f"{type(exc).__name__}: {exc}") from exc

    def _fail(self, exc: BaseException, position: int) -> InternalError:
        """The matcher raised: its state is lost, so this request fails (typed) and its matcher
        is never called again; the other rows of the step go on."""
        self._broken = InternalError(f"the constraint engine failed at output position "
                                     f"{position}: {type(exc).__name__}: {str(exc)[:300]}")
        return self._broken

    def _check_idle(self, what: str, *, allow_finished: bool = False) -> None:
        if self._pending is not None:
            raise InternalError(f"{what} while a preview is pending")
        if self._probing:
            raise InternalError(f"{what} while a probe is open")
        if self.finished and not allow_finished:
            raise InternalError(f"{what} after the output finished")

    # ---------------------------------------------------------------- the three facts

    @property
    def can_continue(self) -> bool:
        """Some non-EOS token is legal after the committed output (False once finished)."""
        self._check_idle("can_continue", allow_finished=True)
        if self.finished:
            return False
        if self._matcher is None:
            return True
        if self._scratch is None:
            self._scratch = torch.empty((1, self.domain.mask_words), dtype=torch.int32)
        start = time.perf_counter()
        row = self._scratch  # [1, ceil(V/32)]
        self._matcher.fill_mask(row, 0)  # the companion's tokens cleared: they lead nowhere
        for eos in self.domain.eos_ids:  # clear the EOS bits (int32: bit 31 is the sign)
            row[0, eos >> 5] &= int32(~(1 << (eos & 31)) & 0xFFFFFFFF)
        self.counters.mask_seconds += time.perf_counter() - start
        return bool(row.any())

    @property
    def may_end(self) -> bool:
        """The committed content (prefix + suffix) is in a state where the language may end."""
        self._check_idle("may_end", allow_finished=True)
        return True if self._matcher is None else self._matcher.is_completed()

    @property
    def ended_normally(self) -> bool:
        """EOS was accepted: a normal (constrained) completion."""
        return self._eos

    # ---------------------------------------------------------------- report

    def report(self) -> ConstraintReport | None:
        """The constraint report of the committed state; None for an unconstrained request."""
        if self._matcher is None:
            return None
        self._check_idle("report", allow_finished=True)
        complete = self._broken is None and self._matcher.is_completed()
        return self.counters.snapshot(branch=self.branch, complete=complete, terminated=self._eos)
