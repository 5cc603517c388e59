"""One generation request inside the worker: its state, its ledgers, its budget and its output.

The Engine owns every `Request` and changes it only on its worker thread, except for
`cancel_requested`, which any thread may set (a single attribute store). The state machine, whose
only writers are `admit`, `pause` and `finish`:

    WAITING --admit (a lane is free)--> RESIDENT --finish--> TERMINAL
    WAITING --cancel / deadline-------------------------> TERMINAL
    RESIDENT --pause (preempt, at a commit boundary)--> PAUSED --admit--> RESIDENT (Replay)

A paused request keeps its committed matcher, output and ledgers, not its lane. Resuming it is a
Replay: its prompt and committed output are prefilled again (no sampling, no matcher accept, no
publication) until the lane is one token behind the ledger; the next step then samples as usual.

The Request is the one owner of every count: `prompt_ids` and `output_ids` are the committed
tokens (EOS included when accepted), `max_new_tokens` the output budget and `remaining` what is
left of it, `num_cached` how many of `prompt_ids + output_ids` the lane's model state holds. While
prefilling num_cached < len(prompt_ids); while decoding it is one behind the committed tokens (the
newest sampled token is fed by the next step). `commit(fed_end, tokens)` is the only place these
counts change (and `admit` / `pause`, which set or drop the lane's state). The OutputSession holds
the matcher, the Publication the published text; neither holds counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from services.worker.output.publication import Publication
from services.worker.output.session import OutputSession
from shared.frontends.thinking import PhaseDecoder
from shared.generation import SamplingParams


class RequestState(Enum):
    WAITING = "waiting"  # queued for a free lane
    RESIDENT = "resident"  # owns a lane: prefilling or decoding
    PAUSED = "paused"  # preempted at a commit boundary (not used by ordinary decoding yet)
    TERMINAL = "terminal"  # finished; its Finished event was published


@dataclass(eq=False)
class Request:
    """A request as the Engine runs it (see the module docstring)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams  # resolved (`runtime.resolve_sampling`)
    seed: int  # RNG key of this request's stream
    session: OutputSession
    # Thread-safe event delivery: the request's RequestStream (its events held until the step's
    # flush, engine/stream.py), or any fn(event) called at once.
    sink: object
    max_new_tokens: int  # output budget: max_tokens, or what the lane holds after the prompt; >= 1
    # What the output publishes (phases, stop strings, tool calls); None: plain content decoding.
    output: Publication | None = None
    stop_token_ids: frozenset[int] = frozenset()  # unconstrained requests only
    deadline: float | None = None  # time.monotonic() seconds; None = none
    timeout_s: float | None = None
    state: RequestState = RequestState.WAITING
    lane: int | None = None
    output_ids: list[int] = field(default_factory=list)
    num_cached: int = 0
    num_cached_prompt: int = 0  # prompt tokens the prefix cache held at first admission (usage)
    cancel_requested: bool = False
    # Output tokens the reasoning phase may take before its close is forced (None: no budget).
    thinking_budget: int | None = None
    # Log-probabilities asked for: None = off, n = with n alternatives per token (0..20).
    logprobs: int | None = None
    # A forced close in the ledger that the lane does not hold yet: (its tokens, the ledger's
    # length after them). Its matcher preview is held; the commit of the step that feeds it to
    # the lane confirms and publishes it (`take_appended`), a finish before that drops it.
    held_close: tuple[tuple[int, ...], int] | None = None
    constraint_kind: str = "none"  # metrics label: a ConstraintKind value, "tools" or "none"
    output_counts: dict[int, int] = field(default_factory=dict)  # token -> occurrences in output
    submitted_at: float = field(default_factory=time.monotonic)
    # Preparation split: rendering and tokenizing the prompt, then building its constraint
    # (grammar lookup or compile, matcher, tool stream); seconds, for the metrics.
    input_seconds: float = 0.0
    constraint_seconds: float = 0.0
    enqueued_at: float | None = None
    admitted_at: float | None = None  # first admission (the report's queue time ends here)
    waiting_since: float | None = None  # joined the waiting queue (again, after a pause)
    resident_since: float | None = None  # took its current lane
    output_at_admission: int = 0  # output tokens when it took its current lane
    first_token_at: float | None = None

    def __post_init__(self) -> None:
        if self.output is None:
            self.output = Publication(PhaseDecoder(self.session.domain, None))

    # ---------------------------------------------------------------- counts

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        """Committed tokens, prompt and output."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Output tokens the budget still allows."""
        return max(0, self.max_new_tokens - len(self.output_ids))

    @property
    def prefill_end(self) -> int:
        """Positions the lane must hold before the next decode step: the prompt, or (while
        resuming) everything committed but the newest output token."""
        return self.num_tokens - 1 if self.output_ids else len(self.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_cached < self.prefill_end

    @property
    def replaying(self) -> bool:
        """Prefilling committed output again after a pause (nothing is sampled until caught up)."""
        return self.in_prefill and bool(self.output_ids)

    @property
    def constrained(self) -> bool:
        return self.session.constrained

    @property
    def is_terminal(self) -> bool:
        return self.state is RequestState.TERMINAL

    def next_input(self, limit: int) -> list[int]:
        """The next tokens to feed: up to `limit` uncached committed tokens (the prompt, or prompt
        and output during a Replay), or the newest output token."""
        if self.in_prefill:
            end = min(self.num_cached + limit, self.prefill_end)
            committed = self.prompt_ids + tuple(self.output_ids) if self.output_ids \
                else self.prompt_ids
            return list(committed[self.num_cached:end])
        return [self.output_ids[-1]]

    def admit(self, lane: int, cached: int, now: float) -> None:
        """Take `lane`, whose model state already holds the first `cached` committed tokens (the
        prefix cache's): WAITING or PAUSED -> RESIDENT."""
        assert self.state in (RequestState.WAITING, RequestState.PAUSED), self.state
        self.state = RequestState.RESIDENT
        self.lane = lane
        self.resident_since = now
        self.output_at_admission = self.num_output_tokens
        self.num_cached = cached
        if self.admitted_at is None:
            self.admitted_at = now
            self.num_cached_prompt = min(cached, self.num_prompt_tokens)

    def pause(self) -> None:
        """Leave the lane at a commit boundary (preemption): the lane's state is dropped (its
        committed full KV blocks may stay in the prefix cache for the Replay)."""
        self.state = RequestState.PAUSED
        self.lane = None
        self.num_cached = 0

    def finish(self) -> None:
        """-> TERMINAL; its lane, if any, was released by the caller."""
        self.state = RequestState.TERMINAL
        self.lane = None

    def commit(self, fed_end: int, tokens: list[int]) -> None:
        """The ledger after a committed step: the lane holds positions < fed_end, and `tokens`
        joined the output."""
        self.num_cached = fed_end
        self.output_ids.extend(tokens)
        for t in tokens:
            self.output_counts[t] = self.output_counts.get(t, 0) + 1

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    # ---------------------------------------------------------------- sampling history

    def penalized(self) -> bool:
        s = self.sampling
        return (s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
                or s.repetition_penalty != 1.0)

    def penalty_history(self) -> tuple[list[int], list[int]]:
        """(ids, counts) of the sparse penalty history: output tokens with their counts, and with
        a repetition penalty also the prompt's tokens (count 0 when only in the prompt)."""
        counts = dict(self.output_counts)
        if self.sampling.repetition_penalty != 1.0:
            for t in self.prompt_ids:
                counts.setdefault(t, 0)
        return list(counts), list(counts.values())

    @property
    def thinking_due(self) -> bool:
        """The thinking budget ran out while the output is still in reasoning: its close is
        forced before anything else is sampled."""
        return self.thinking_budget is not None and self.output.in_reasoning \
            and self.num_output_tokens >= self.thinking_budget and not self.session.finished \
            and self.held_close is None

    def append_forced(self, tokens: list[int], *, held: bool = True) -> None:
        """A fixed control sequence (a forced thinking close) joins the ledger. No sampling and
        no RNG: the lane's model state reads these tokens with the next step's prefill of
        uncached committed tokens, like a Replay. `held`: they wait there for that step's commit
        (`take_appended`); False: the output ends with them (nothing is fed after them)."""
        self.commit(self.num_cached, tokens)
        if held:
            self.held_close = (tuple(tokens), self.num_tokens)

    def take_appended(self, fed_end: int) -> tuple[int, ...]:
        """The held close, once a committed step left the lane holding positions < `fed_end`
        past it (then it is no longer held); () otherwise."""
        if self.held_close is None or fed_end < self.held_close[1]:
            return ()
        tokens, self.held_close = self.held_close[0], None
        return tokens

    def drop_held(self) -> None:
        """A held close that never reached the lane leaves the ledger (it was never confirmed
        nor published): the request ends where its published output ends."""
        if self.held_close is None:
            return
        tokens, _ = self.held_close
        self.held_close = None
        del self.output_ids[-len(tokens):]
        for t in tokens:
            self.output_counts[t] -= 1
            if not self.output_counts[t]:
                del self.output_counts[t]
        self.num_cached = min(self.num_cached, self.num_tokens)
