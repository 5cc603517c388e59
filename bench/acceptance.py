"""Known acceptance: a speculative round at a set acceptance rate p, at the real cost of a
backend's draft passes. Random weights accept nothing, so this is how the bench measures the
machinery (MTP's k module steps, a DFlash draft pass of real size) at the acceptance a trained
drafter would have.

The design: the target's own greedy continuation, recorded by a plain greedy run first
(`Replay`), replaces the backend's drafts, each draft corrupted with probability 1 - p from a
seeded stream (`KnownAcceptance`). The backend still runs all of its passes (MTP's alignment
and k steps after every step, DFlash's context writes and its block in the round's Forward,
captured or not); only the ids it drafted are dropped. The real masks and the real acceptance
kernel then decide: a kept draft is the target's greedy token and is accepted, a corrupted one
is a different token and is rejected, so the accepted length of a round of n drafts is its
leading run of kept drafts (geometric in p, capped at n) and the output equals plain greedy.
That holds where the verify forward and the plain decode step are one numerical route (exact on
the CPU in float32 / float64); elsewhere a kept draft the verify forward disagrees with is
rejected, which the wrapper counts (`agreement`) and the bench reports with greedy equality per
request.

The other design, deciding acceptance at rate p after the acceptance kernel, would commit tokens
the target did not choose: they break constrained rows (an illegal token committed to the
grammar) and greedy equality, and it needs a hook inside the Program's verify stage rather than
the Proposer interface. This one plugs in through the Proposer interface only
(services/worker/spec/proposer.py) and lives here: the product imports nothing from bench/.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace

import torch

from bench.oracle import OracleProposer
from services.worker.program.batch import PendingBatch, RowOutcome, StepBatch
from services.worker.spec.proposer import ForwardsHostMembers, Proposal, draft_limit


class Replay:
    """The recorded greedy continuation of each request, read in O(new tokens) per round.

    `record(sequence)`: one plain run's prompt + output. `continuation(job, n)`: the next n
    recorded tokens after `job`'s committed tokens ([] once its output left the recording: a
    diverged request drafts nothing more)."""

    def __init__(self) -> None:
        self._oracle = OracleProposer()  # the first match of a prompt (a scan, once a request)
        self._jobs: dict[str, list] = {}  # request id -> [recorded output, tokens checked, ok]

    def record(self, sequence) -> None:
        self._oracle.record(sequence)

    def continuation(self, job, n: int) -> list[int]:
        entry = self._jobs.get(job.request_id)
        if entry is None:
            rest = self._oracle.propose(job.prompt_ids, 1 << 30)
            entry = self._jobs[job.request_id] = [rest, 0, bool(rest)]
        recorded, checked, ok = entry
        out = job.output_ids
        if ok and len(out) > checked:
            ok = entry[2] = out[checked:] == recorded[checked:len(out)]
            entry[1] = len(out)
        return recorded[len(out):len(out) + n] if ok and n > 0 else []

    def diverged(self, request_id: str) -> bool:
        entry = self._jobs.get(request_id)
        return entry is not None and not entry[2]


@dataclass
class RoundStats:
    """One request's verify rounds through the wrapper."""

    rounds: int = 0  # rounds that carried drafts and committed tokens
    drafts: int = 0
    accepted: int = 0  # drafts the real acceptance committed
    rejected: int = 0  # rounds that ended on a rejected draft (accepted < drafts)
    planned: int = 0  # drafts the wrapper left uncorrupted at the head of each round
    agreed: int = 0  # rounds whose accepted count equals the planned leading run
    # Host time of the replay itself (lookups, corruption, the lane table's upload): part of
    # the engine's exposed draft wait that the backend alone would not have.
    seconds: float = 0.0


class KnownAcceptance(ForwardsHostMembers):
    """A proposer (services/worker/spec/proposer.py) over `inner`, the real backend whose passes
    run for cost, that drafts `replay`'s recorded continuation with each draft kept with
    probability `p` and otherwise corrupted (see the module docstring). `inner` None: no draft
    cost at all (the machinery alone), host route, `k` drafts. `lanes`: the Program's lanes (a
    device-route inner reads its drafts by lane from a table of lanes + 1 rows, the last one the
    graphs' scratch lane). `vocab_size`: corrupted drafts stay inside the real vocabulary."""

    def __init__(self, inner, replay: Replay, p: float, *, k: int, vocab_size: int, lanes: int,
                 device: torch.device, seed: int = 0) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"acceptance rate p must be in [0, 1], got {p}")
        self.inner, self.replay, self.p = inner, replay, p
        self.route = inner.route if inner is not None else "host"
        self.reads = inner.reads if inner is not None else None
        self.k = inner.k if inner is not None else k
        self.vocab_size = vocab_size
        self._rng = random.Random(seed)
        self._plan: dict[int, int] = {}  # lane -> the leading run of kept drafts this round
        self.stats: dict[str, RoundStats] = {}  # request id -> its rounds
        self._device = device
        self._cuda = device.type == "cuda"
        self._table = torch.zeros(lanes + 1, self.k, dtype=torch.int64, device=device)  # [L+1, K]
        self._host = torch.zeros(lanes + 1, self.k, dtype=torch.int64)  # [L+1, K]

    def _drafts(self, job, n: int) -> list[int]:
        """n drafts (fewer where the recording ends) for `job`; records the round's plan."""
        start = time.perf_counter()
        tokens = self.replay.continuation(job, n)
        run, kept = 0, True
        for i, token in enumerate(tokens):
            if self._rng.random() >= self.p:  # corrupted: any other token of the vocabulary
                tokens[i] = (token + self._rng.randrange(1, self.vocab_size)) % self.vocab_size
                kept = False
            elif kept:
                run += 1
        self._plan[job.lane] = run
        self._stats(job).seconds += time.perf_counter() - start
        return tokens

    def _stats(self, job) -> RoundStats:
        return self.stats.setdefault(job.request_id, RoundStats())

    # ---------------------------------------------------------------- the Proposer interface

    def attach(self, batch: StepBatch, max_len: int) -> StepBatch:
        if self.route == "device":
            return self._attach_device(batch, max_len)
        rows = []
        for row in batch.rows:
            n = draft_limit(row, self.k, max_len)
            if self.inner is not None and n > 0:  # as many drafts as the backend made
                real = self.inner.propose(row.request, n)
                n = len(real.tokens if isinstance(real, Proposal) else real)
            drafts = self._drafts(row.request, n) if n > 0 else []
            rows.append(replace(row, tokens=row.tokens + tuple(drafts), num_drafts=len(drafts),
                                draft_q=None))
        out = StepBatch(tuple(rows))
        return out if out.has_drafts else batch

    def _attach_device(self, batch: StepBatch, max_len: int) -> StepBatch:
        # The backend's draft limits; the replayed drafts go into the lane table the round's
        # block reads (one upload before the round, as the Program's own inputs).
        limited = self.inner.attach(batch, max_len)
        rows = []
        for row in limited.rows:
            drafts = self._drafts(row.request, row.draft_limit) if row.draft_limit else []
            self._host[row.request.lane, :len(drafts)] = torch.tensor(drafts, dtype=torch.int64)
            rows.append(replace(row, draft_limit=len(drafts)))
        out = StepBatch(tuple(rows))
        if not out.has_drafts:
            return batch
        start = time.perf_counter()
        host = self._host.pin_memory() if self._cuda else self._host
        self._table.copy_(host, non_blocking=self._cuda)
        share = (time.perf_counter() - start) / len(out.rows)
        for row in out.rows:
            self._stats(row.request).seconds += share
        return out

    def block_drafts(self, anchors: torch.Tensor, starts: torch.Tensor, lanes: torch.Tensor,
                     **kw):
        """The backend's block (run for its cost, its ids dropped), then the replayed drafts of
        each row's lane: (ids [n, K], None, None), greedy one-hot q."""
        self.inner.block_drafts(anchors, starts, lanes, **kw)
        return self._table[lanes], None, None

    def eager_drafts(self, rows, anchors: torch.Tensor, starts: torch.Tensor,
                     lanes: torch.Tensor):
        self.inner.eager_drafts(rows, anchors, starts, lanes)
        return self._table[lanes], None, None

    @property
    def wrapped(self):
        # the inner proposer's own passes run for cost as its drafting does (host route only)
        return self.inner if self.route == "host" else None

    def after_step(self, pending: PendingBatch, hidden: torch.Tensor | None) -> float:
        for row, res in zip(pending.batch.rows, pending.results):
            n = row.num_drafts
            if not n or res.outcome is not RowOutcome.TOKENS:
                continue
            s = self._stats(row.request)
            planned = self._plan.get(row.request.lane, 0)
            s.rounds += 1
            s.drafts += n
            s.accepted += res.accepted_drafts
            s.rejected += res.accepted_drafts < n
            s.planned += planned
            s.agreed += res.accepted_drafts == planned
        return self.inner.after_step(pending, hidden) if self.inner is not None else 0.0


def summary(stats: list[RoundStats], p: float, k: int) -> dict:
    """The rounds of the timed requests: the measured acceptance rate (accepted drafts over the
    drafts the target judged: accepted ones and each round's first rejected one, the maximum
    likelihood estimate of the per-draft rate), the planned rate, the agreement of the real
    acceptance with the plan, and the mean accepted per round a rate p gives at K drafts,
    p + p^2 + ... + p^K, and the replay's own host seconds (included in the exposed draft wait)."""
    total = RoundStats()
    for s in stats:
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(s, name))
    judged = total.accepted + total.rejected
    return {"p": p, "rounds": total.rounds, "drafts": total.drafts, "accepted": total.accepted,
            "measured_p": round(total.accepted / judged, 4) if judged else None,
            "expected_mean_accepted": round(sum(p ** i for i in range(1, k + 1)), 4),
            "planned_accepted": total.planned, "replay_seconds": round(total.seconds, 6),
            "plan_agreement": round(total.agreed / total.rounds, 4) if total.rounds else None}
