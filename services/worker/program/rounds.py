"""The two routes of a verification round (the Program's `step` when rows carry drafts or draft
limits), each ending in the verify stage (verify.py: K+1 masks along each row's chain while the
forward runs, then acceptance):

- host-launched: the drafts were fixed on the host before the round (a host proposer's
  `attach`); the target forward over `[anchor, drafts]` (its captured verify graph where the rows
  fit) and the masks overlap;
- device: the proposer drafts in the round's Forward phase (`block_drafts`: DFlash, DFlash2), its
  ids copied D2H into pinned memory, the ready event recorded, then the target forward over
  `[anchor, drafts]`; the host waits on the event only (not on the target forward), then fills
  the masks while the target forward runs. Captured as one Forward graph per batch size where the
  proposer allows graphs; rows near the lane's end take the host route once their drafts are on
  the host.

The host's waits for a proposer's drafts are counted here (`draft_wait_seconds`, and per request
in its OutputSession's report).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from services.worker.program.batch import BatchRow, PendingBatch, StepBatch
from services.worker.program.forward import Forward
from services.worker.program.graphs import DFlashForwardGraphs
from services.worker.program.verify import Verifier
from shared.logging import get_logger

log = get_logger(__name__)


class Rounds:
    """The verify routes of one Program (see the module docstring). `verifier`: its verify
    stage (None without drafts); `ready`: its ready event on CUDA (None on the CPU)."""

    def __init__(self, forward: Forward, verifier: Verifier | None, *, max_batch: int,
                 max_drafts: int, ready) -> None:
        self.forward = forward
        self.verifier = verifier
        self.max_batch = max_batch
        self.max_drafts = max_drafts
        self.ready = ready
        self.cuda = forward.device.type == "cuda"
        self.proposer = None  # a device-route proposer (spec/proposer.py), or None
        self.graphs: DFlashForwardGraphs | None = None
        self.host_drafts: torch.Tensor | None = None  # [B, K] pinned: the round's draft ids
        self.draft_wait_seconds = 0.0  # host time waiting for a model proposer's drafts

    def use_device_proposer(self, proposer, *, graphs: bool) -> None:
        """Draft on the device through `proposer` (its `k`, `reads`, `block_drafts`,
        `eager_drafts`); with `graphs`, in captured Forward graphs (their padding rows write
        the scratch lane max_batch)."""
        self.proposer = proposer
        # The round's draft ids come back here (pinned) before the host waits on the event.
        self.host_drafts = torch.zeros(self.max_batch, proposer.k, dtype=torch.int64,
                                       pin_memory=self.cuda)  # [B, K]
        if graphs:
            self.graphs = DFlashForwardGraphs(self.forward.model, self.forward.state, proposer,
                                              self.max_batch, self.max_batch, self.host_drafts,
                                              self.ready)

    def count_draft_wait(self, rows: Sequence[BatchRow], seconds: float) -> None:
        self.draft_wait_seconds += seconds
        for row in rows:
            row.request.session.counters.add_draft_wait(seconds)

    def host(self, batch: StepBatch) -> PendingBatch:
        """A host-launched round: drafts fixed on the host before the forward, masks filled
        while it runs, acceptance after it (verify.py)."""
        assert self.verifier is not None and all(
            r.sample and len(r.tokens) == 1 + r.num_drafts <= 1 + self.max_drafts
            for r in batch.rows), "drafts need a Program built with max_drafts >= K"
        logits = self.forward.verify(batch.rows, self.max_drafts + 1)  # [n, W, V]
        return PendingBatch(batch, tuple(self.verifier.verify(batch.rows, logits)))

    def device(self, batch: StepBatch) -> PendingBatch:
        """A device round (see the module docstring)."""
        rows, forward, proposer = batch.rows, self.forward, self.proposer
        dev, k, n = forward.device, proposer.k, len(rows)
        anchors = torch.tensor([r.tokens[0] for r in rows], dtype=torch.int64).to(dev)  # [n]
        starts = torch.tensor([r.start for r in rows], dtype=torch.int64).to(dev)  # [n]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64).to(dev)  # [n]
        fits = all(r.start + k + 1 <= forward.max_len for r in rows)
        if self.graphs is not None and fits:
            return self._graphed(batch, anchors, starts, lanes)
        waited = time.perf_counter()
        ids, q_ids, q_probs = proposer.eager_drafts(rows, anchors, starts, lanes)  # [n, K]
        self.host_drafts[:n].copy_(ids, non_blocking=self.cuda)
        if self.ready is not None:
            self.ready.record(torch.cuda.current_stream())
        waited = time.perf_counter() - waited  # launching (CUDA) or running (CPU) the draft
        logits = None
        if fits:
            tokens = torch.cat([anchors[:, None], ids], 1)  # [n, K+1]
            positions = starts[:, None] + torch.arange(k + 1, device=dev)[None]  # [n, K+1]
            logits = forward.logits(tokens, positions, lanes,
                                    kv_len=max(r.start for r in rows) + k + 1)  # [n, K+1, V]
        if self.ready is not None:
            start = time.perf_counter()
            self.ready.wait()  # the draft ids are on the host; the target forward still runs
            waited += time.perf_counter() - start
        self.count_draft_wait(rows, waited)
        drafted = self._drafted(rows, q_ids, q_probs)
        if logits is None:
            return self.host(drafted)
        return PendingBatch(drafted, tuple(self.verifier.verify(drafted.rows, logits)))

    def _drafted(self, rows, q_ids, q_probs) -> StepBatch:
        # The rows with the drafts the host read back (each up to its own limit); a sampled
        # row keeps its drafts' q (DFlash2), a greedy one verifies them with one-hot q.
        host = self.host_drafts[:len(rows)].tolist()
        out = []
        for i, row in enumerate(rows):
            drafts = host[i][:row.draft_limit]
            sampled = row.request.sampling.temperature > 0
            q = (q_ids[i, :len(drafts)], q_probs[i, :len(drafts)]) \
                if q_ids is not None and sampled and drafts else None
            out.append(replace(row, tokens=row.tokens + tuple(drafts), num_drafts=len(drafts),
                               draft_limit=0, draft_q=q))
        return StepBatch(tuple(out))

    def _graphed(self, batch: StepBatch, anchors, starts, lanes) -> PendingBatch:
        """The captured Forward (graphs.py): replay, wait on the external event (the ids are on
        the host while the target forward still runs), masks and acceptance after."""
        rows, n = batch.rows, len(batch.rows)
        graph, captured = self.graphs.get(n)
        if captured:
            log.info("dflash_forward_graph_captured", batch_size=graph.size)
        start = time.perf_counter()
        graph.run(anchors, starts, lanes)
        self.ready.wait()
        self.count_draft_wait(rows, time.perf_counter() - start)
        self.forward.keep(graph.feats[:n])  # [n, K+1, n_layers * H]
        drafted = self._drafted(rows, None, None)
        return PendingBatch(drafted, tuple(self.verifier.verify(drafted.rows, graph.logits[:n])))

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.clear()
