"""One generation request inside the worker: its state, its ledgers, its budget and its output.

The Engine owns every `Request` and changes it only on its worker thread, except for
`cancel_requested`, which any thread may set (a single attribute store). The state machine:

    WAITING --admit (a lane is free)--> RESIDENT --finish--> TERMINAL
    WAITING --cancel / deadline-------------------------> TERMINAL
    (PAUSED: reserved for preemption; a paused request keeps its committed matcher, not its lane)

The Request is the one owner of every count: `prompt_ids` and `output_ids` are the committed
tokens (EOS included when accepted), `max_new_tokens` the output budget and `remaining` what is
left of it, `num_cached` how many of `prompt_ids + output_ids` the lane's model state holds. While
prefilling num_cached < len(prompt_ids); while decoding it is one behind the committed tokens (the
newest sampled token is fed by the next step). `commit(fed_end, tokens)` is the only place these
counts change. The OutputSession holds the matcher and the text decoder, not counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from services.worker.output.session import OutputSession
from services.worker.output.stop_strings import StopStrings
from shared.generation import GenerationEvent, SamplingParams

if TYPE_CHECKING:
    from shared.frontends.formats.hermes import ToolStream


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
    sink: Callable[[GenerationEvent], None]  # thread-safe event delivery
    max_new_tokens: int  # effective output budget (max_tokens capped by the lane's context), >= 1
    stop: StopStrings | None = None  # unconstrained requests only
    stop_token_ids: frozenset[int] = frozenset()  # unconstrained requests only
    deadline: float | None = None  # time.monotonic() seconds; None = none
    timeout_s: float | None = None
    state: RequestState = RequestState.WAITING
    lane: int | None = None
    output_ids: list[int] = field(default_factory=list)
    num_cached: int = 0
    cancel_requested: bool = False
    published: list[str] = field(default_factory=list)
    # The tool-call decoder when tools are active (content and calls split out of the text).
    tool_stream: "ToolStream | None" = None
    constraint_kind: str = "none"  # metrics label: a ConstraintKind value, "tools" or "none"
    output_counts: dict[int, int] = field(default_factory=dict)  # token -> occurrences in output
    submitted_at: float = field(default_factory=time.monotonic)
    enqueued_at: float | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None

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
    def in_prefill(self) -> bool:
        return self.num_cached < len(self.prompt_ids)

    @property
    def constrained(self) -> bool:
        return self.session.constrained

    @property
    def is_terminal(self) -> bool:
        return self.state is RequestState.TERMINAL

    def next_input(self, limit: int) -> list[int]:
        """The next tokens to feed: up to `limit` uncached prompt tokens, or the newest output."""
        if self.in_prefill:
            return list(self.prompt_ids[self.num_cached:self.num_cached + limit])
        return [self.output_ids[-1]]

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

    def content(self) -> str:
        return "".join(self.published)
