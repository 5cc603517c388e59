"""The one Proposer interface of speculative decoding, and the host route that most proposers share.

A proposer drafts tokens; the target verifies them (program/verify.py). Drafts are never
constrained, the target is: a proposer never fills masks. The Engine builds one proposer at start
(`spec.make_proposer(config, runtime, state)`) and hands it to the Program (`Program.use`), which
calls only the members below and names no backend.

Every proposer has

    route        "host": `attach` fixes each decode row's drafts on the host before the verify
                 forward (n-gram copy, the oracle, MTP, a grammar's forced text). "device":
                 `attach` sets each row's `draft_limit` only, and the Program drafts inside the
                 round's Forward phase through `block_drafts` (DFlash, DFlash2).
    k            the most drafts per row and round (>= 1).
    reads        what of each target forward `after_step` reads: None (nothing), "final" (the
                 final hidden states, [n, W, H]) or a tuple of layer ids (those layers' outputs,
                 concatenated: [n, W, len(ids) * H]).
    attach(batch, max_len) -> StepBatch
                 the decode batch with each row's drafts after its anchor (BatchRow.tokens,
                 num_drafts, draft_q) or, on the device route, its draft_limit; each row within
                 `draft_limit(row, k, max_len)`. A batch where no row drafts comes back as given
                 (an ordinary decode step).
    use_graphs(max_batch, scratch_lane), warm_graphs() -> int, warm_prefill(shapes) -> int,
    close()
                 (host route, optional) the Program captures CUDA graphs: a proposer with device
                 passes of its own (MTP) may replay them from graphs padded to the Program's batch
                 classes, padding rows writing the scratch lane; `warm_graphs` captures them all
                 at the warm-up, `warm_prefill` runs its eager passes over prefill chunks at the
                 warm-up's shapes, `close` destroys the graphs.
    after_step(pending, hidden) -> float
                 after every Program step (prefill chunks, decode steps, verify rounds), before
                 the commit: `pending` holds each row's result (nothing committed yet), `hidden`
                 what `reads` names for the rows' fed positions ([n, W, ...], row b's fed tokens
                 at [b, :len(tokens)]; None when `reads` is None). Returns the host seconds it
                 waited for the next round's drafts (exposed draft time; 0.0 when it drafts
                 elsewhere).

and a device-route proposer also

    block_drafts(anchors, starts, lanes, *, kv_len=None) -> (ids [n, K], q_ids, q_probs)
                 one block per row on the device, no host synchronisation (captured into the
                 Program's Forward graph);
    eager_drafts(rows, anchors, starts, lanes) -> the same
                 the eager call of a round's rows, which may sample at the rows' temperatures
                 (q_ids / q_probs [n, K, Q]; None for one-hot q).

A host proposer is a `HostProposer`: it writes `propose(request, n) -> list[int] | Proposal`
(at most n drafts continuing the request's committed tokens) and inherits `attach`. A proposer
that composes with another inside one round (a grammar's forced text, then the other's drafts)
wraps it: it forwards `route`, `reads` and `after_step` to the inner proposer (and its optional
host members: `ForwardsHostMembers`) and joins the drafts per row in `propose`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from services.worker.program.batch import BatchRow, PendingBatch, StepBatch

FINAL = "final"  # `reads`: the target's final hidden states


@dataclass(frozen=True)
class Proposal:
    """Drafts and, for a drafter with a real distribution, the sparse q each was drawn from:
    q_ids [n, Q] int32 (-1 pads), q_probs [n, Q] float32. None: one-hot q."""

    tokens: list[int]
    q_ids: object = None
    q_probs: object = None


def draft_limit(row: BatchRow, k: int, max_len: int) -> int:
    """How many drafts `row` may carry this round: at most k, fewer where the request's output
    budget or its thinking budget (the round emits drafts + 1 tokens) or its lane (the last
    draft sits at position start + n < max_len) ends; 0 when none."""
    job = row.request
    limit = min(k, job.remaining - 1, max_len - 1 - row.start)
    if job.thinking_budget is not None and job.output.in_reasoning and job.held_close is None:
        # The round must not pass the thinking budget: its close is forced there, as in
        # ordinary decoding, which samples one token a step (a forced close the round feeds
        # has ended the reasoning already).
        limit = min(limit, job.thinking_budget - job.num_output_tokens - 1)
    return max(0, limit)


class HostProposer:
    """The host route (see the module docstring): subclasses give `propose(request, n)`.
    `k`: the most drafts per row and round (>= 1; ValueError otherwise)."""

    route = "host"
    reads: str | tuple[int, ...] | None = None

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
        self.k = k

    def propose(self, job, n: int) -> Sequence[int] | Proposal:
        raise NotImplementedError

    def propose_after(self, job, drafts: Sequence[int], n: int) -> list[int]:
        """At most n drafts continuing the committed output and `drafts` (a composing proposer's
        earlier drafts of the round). A chain drafted from the committed output (MTP) continues
        only where `drafts` are its own first drafts."""
        chain = self.propose(job, len(drafts) + n)
        chain = list(chain.tokens if isinstance(chain, Proposal) else chain)
        return chain[len(drafts):] if chain[:len(drafts)] == list(drafts) else []

    def attach(self, batch: StepBatch, max_len: int) -> StepBatch:
        rows = []
        for row in batch.rows:
            limit = draft_limit(row, self.k, max_len)
            proposal = self.propose(row.request, limit) if limit > 0 else []
            q = None
            if isinstance(proposal, Proposal):
                drafts = proposal.tokens[:limit]
                if proposal.q_ids is not None and drafts:
                    q = (proposal.q_ids[:len(drafts)], proposal.q_probs[:len(drafts)])
            else:
                drafts = list(proposal)[:limit]
            rows.append(replace(row, tokens=row.tokens + tuple(drafts), num_drafts=len(drafts),
                                draft_q=q))
        out = StepBatch(tuple(rows))
        return out if out.has_drafts else batch

    def after_step(self, pending: PendingBatch, hidden: torch.Tensor | None) -> float:
        return 0.0

    def use_graphs(self, max_batch: int, scratch_lane: int) -> None:
        """The Program captures CUDA graphs: a proposer with device passes of its own may
        replay them from graphs of up to `max_batch` rows, padding rows writing `scratch_lane`."""

    def warm_graphs(self) -> int:
        """Capture every graph `use_graphs` allows now (the Program's warm-up); how many."""
        return 0

    def warm_prefill(self, shapes) -> int:
        """Run the proposer's own passes over prefill chunks at every (rows, width, kv_len) the
        Program's warm-up visits (free lanes only); how many ran."""
        return 0

    def close(self) -> None:
        """Destroy what `use_graphs` captured (the Program closes)."""


class ForwardsHostMembers:
    """A wrapping proposer's optional host-route members (`use_graphs`, `warm_graphs`,
    `warm_prefill`, `close`), forwarded to the proposer it wraps: the inner one's own passes are
    captured, warmed and closed as its drafting runs. `wrapped`: that proposer, or None (its
    `inner` by default)."""

    @property
    def wrapped(self):
        return self.inner

    def use_graphs(self, max_batch: int, scratch_lane: int) -> None:
        if self.wrapped is not None:
            self.wrapped.use_graphs(max_batch, scratch_lane)

    def warm_graphs(self) -> int:
        return 0 if self.wrapped is None else self.wrapped.warm_graphs()

    def warm_prefill(self, shapes) -> int:
        return 0 if self.wrapped is None else self.wrapped.warm_prefill(shapes)

    def close(self) -> None:
        if self.wrapped is not None:
            self.wrapped.close()


class ContextProposer(HostProposer):
    """A host proposer over a context drafter (`drafter.propose(tokens, n)`: n-gram copy, the
    oracle) that sees the request's prompt and committed output."""

    def __init__(self, drafter, k: int) -> None:
        super().__init__(k)
        self.drafter = drafter

    def propose(self, job, n: int) -> Sequence[int] | Proposal:
        return self.drafter.propose(job.prompt_ids + tuple(job.output_ids), n)

    def propose_after(self, job, drafts: Sequence[int], n: int) -> list[int]:
        return list(self.drafter.propose(job.prompt_ids + tuple(job.output_ids) + tuple(drafts),
                                         n))

