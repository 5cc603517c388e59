"""The host-launched route of a host proposer (n-gram copy): drafts fixed on the host before the
verify forward (design document: "drafts ... are fixed on the host before its verification, and
sampling and acceptance run on the host-launched path after the verify forward, outside the CUDA
Graph"), and the engine's speculation counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from services.worker.program.batch import StepBatch


@dataclass(frozen=True)
class Proposal:
    """Drafts and, for a drafter with a real distribution (DFlash2 at T > 0), the sparse q each
    was drawn from: q_ids [n, Q] int32 (-1 pads), q_probs [n, Q] float32. None: one-hot q."""

    tokens: list[int]
    q_ids: object = None
    q_probs: object = None


@dataclass
class SpecCounters:
    """The Engine's global speculation counters (all requests, constrained or not)."""

    rounds: int = 0  # committed rows of verification rounds that carried drafts
    drafts: int = 0  # drafts proposed in those rows
    accepted: int = 0  # drafts committed
    tokens: int = 0  # output tokens those rows committed (accepted + correction / bonus)
    draft_seconds: float = 0.0  # host time spent proposing (exposed: the forward waits for it)

    def to_dict(self, model_draft_seconds: float = 0.0) -> dict:
        """Counters as JSON; `model_draft_seconds`: the Program's wait for a model proposer's
        drafts (MTP, DFlash), added to the exposed draft time."""
        mean = self.accepted / self.rounds if self.rounds else 0.0
        return {"rounds": self.rounds, "drafts": self.drafts, "accepted": self.accepted,
                "tokens": self.tokens, "mean_accepted": mean,
                "acceptance_rate": self.accepted / self.drafts if self.drafts else 0.0,
                "draft_seconds": self.draft_seconds + model_draft_seconds}


class HostDrafter:
    """Attaches up to `k` drafts to every row of a decode batch (`attach`). `propose(request,
    n)`: at most n drafts continuing the request's committed tokens."""

    def __init__(self, propose: Callable[..., list[int]] | None, k: int, *,
                 device: bool = False) -> None:
        if k < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
        self.propose = propose
        self.k = k
        self.device = device  # the Program drafts on the device (DFlash): only the limit here

    @classmethod
    def from_context(cls, proposer, k: int) -> "HostDrafter":
        """A drafter over a context proposer (`proposer.propose(tokens, n)`: n-gram, oracle)
        that sees the request's prompt and committed output."""
        return cls(lambda job, n: proposer.propose(job.prompt_ids + tuple(job.output_ids), n), k)

    def attach(self, batch: StepBatch, max_len: int) -> tuple[StepBatch, float]:
        """The batch with each row's drafts after its anchor (or, for a device drafter, how
        many the Program may draft), and the seconds spent proposing.

        A row proposes at most k drafts, fewer where its output budget (the round emits drafts
        + 1 tokens) or its lane (the last draft sits at position start + n < max_len) ends; a
        batch where no row has a draft stays an ordinary decode step."""
        start = time.perf_counter()
        rows = []
        for row in batch.rows:
            job = row.request
            limit = min(self.k, job.remaining - 1, max_len - 1 - row.start)
            if self.device:
                rows.append(replace(row, draft_limit=max(0, limit)))
                continue
            proposal = self.propose(job, limit) if limit > 0 else []
            q = None
            if isinstance(proposal, Proposal):
                drafts = proposal.tokens[:limit]
                if proposal.q_ids is not None and drafts:
                    q = (proposal.q_ids[:len(drafts)], proposal.q_probs[:len(drafts)])
            else:
                drafts = list(proposal)[:limit]
            rows.append(replace(row, tokens=row.tokens + tuple(drafts), num_drafts=len(drafts),
                                draft_q=q))
        seconds = time.perf_counter() - start
        out = StepBatch(tuple(rows))
        return (out if out.has_drafts else batch), seconds
