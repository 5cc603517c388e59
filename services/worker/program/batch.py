"""What one Program step runs (`StepBatch`) and what it produced (`PendingBatch`).

A step's rows are requests with their input for this step: a prompt chunk or the newest output
token (in a verification round followed by the row's drafts), starting at lane position `start`. A
row with `sample` set gets a next token; an intermediate prefill chunk does not. Nothing of a step
is committed until the commit path (services/worker/engine/postprocess.py) has previewed every row
and called `Program.commit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from shared.errors import InfernixError

if TYPE_CHECKING:
    from services.worker.request import Request
    from shared.generation import TokenLogprob


class RowOutcome(Enum):
    NO_OUTPUT = "no_output"  # intermediate prefill chunk: nothing sampled
    TOKENS = "tokens"  # sampled tokens to preview and commit
    DEAD_END = "dead_end"  # the constraint allows no token here: the request fails
    NONFINITE = "nonfinite"  # no finite legal logit (or inconsistent device results): internal


@dataclass(frozen=True)
class BatchRow:
    request: "Request"
    tokens: tuple[int, ...]  # fed this step: a prompt chunk, or the newest output token (+ drafts)
    start: int  # position of tokens[0] in the lane
    sample: bool  # the row samples its next token after this step
    num_drafts: int = 0  # speculative drafts at the end of `tokens` (after the anchor), 0..K
    draft_q: tuple | None = None  # sparse q of the drafts: (ids [n, Q] int32, probs [n, Q] f32)
    draft_limit: int = 0  # drafts the Program makes on the device in this round (DFlash), 0..K

    @property
    def end(self) -> int:
        """The lane's execution frontier once this row's input is committed."""
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class StepBatch:
    rows: tuple[BatchRow, ...]

    @property
    def is_decode(self) -> bool:
        return all(len(r.tokens) == 1 and r.sample for r in self.rows)

    @property
    def has_drafts(self) -> bool:
        """A verification round: every row feeds its anchor and 0..K drafts, one row at least one
        (drafted on the host, or by the Program on the device: `draft_limit`)."""
        return any(r.num_drafts or r.draft_limit for r in self.rows)


@dataclass(frozen=True)
class RowResult:
    outcome: RowOutcome
    tokens: tuple[int, ...] = ()
    error: InfernixError | None = None  # set for DEAD_END and NONFINITE
    mask_bytes: int = 0  # mask H2D bytes this row's sampling used
    accepted_drafts: int = 0  # drafts the verification accepted (tokens = those + one more)
    # per token of `tokens`, when the row's request asked for log-probabilities
    logprobs: tuple["TokenLogprob", ...] = ()


@dataclass(frozen=True)
class PendingBatch:
    batch: StepBatch
    results: tuple[RowResult, ...]
