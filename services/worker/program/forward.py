"""How the Program runs the target model for a step's rows: a decode step through its captured
graph (graphs.py) or eagerly, a short prompt chunk through its prefill graph (prefill_graphs.py)
or eagerly, prompt chunks and verify rows padded on the right (a prompt chunk whose padding
would leave its lane as consecutive forwards of warmed widths inside it: buckets.py
`plan_widths`, prefill_graphs.py `lane_breaks`), and what the proposer reads of each forward
(spec/proposer.py `reads`: the final hidden states or the outputs of a few target layers) kept
for its `after_step`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate

import torch

from services.worker.program.batch import BatchRow, StepBatch
from services.worker.program.buckets import plan_widths, prefill_width, prefill_widths
from services.worker.program.graphs import DecodeGraphs
from services.worker.program.prefill_graphs import (
    PrefillGraphs,
    lane_breaks,
    padded_inputs,
    run_segments,
    static_prefill,
)
from shared.logging import get_logger

log = get_logger(__name__)

FINAL = "final"  # `reads`: the final hidden states (the proposer interface's spelling)


class Forward:
    """The model forwards of one Program. `graphs`: its decode graphs (None: eager);
    `verify_graphs`: the host-launched verify route's graphs of K+1 tokens a row (None:
    eager); `prefill_graphs`: the short prefill forwards' graphs (None: eager); `reads`: what the
    proposer reads (None: nothing is kept)."""

    def __init__(self, model, state, max_len: int, max_batch: int, device: torch.device) -> None:
        self.model = model
        self.state = state
        self.max_len = max_len
        self.device = device
        self.reads: str | tuple[int, ...] | None = None
        self.graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        # Pad prefill forwards to the finite widths of buckets.py (exact; on CUDA, where each new
        # width could compile kernels on the request path; the CPU compiles nothing)
        self.bucketed = device.type == "cuda"
        self.widths = prefill_widths(max_len, max_len)  # what `plan_widths` picks from
        # rows whose prefill split into forwards of warmed widths at the lane's end (cumulative)
        self.lane_end_rows = 0
        # a decode step's tokens, positions and lanes, uploaded with one non-blocking copy
        self.host_inputs = torch.zeros(max_batch, 3, dtype=torch.int64,
                                       pin_memory=device.type == "cuda")  # [B, 3]
        self.last_graph = None  # the decode graph the current step replays, if any
        # a hybrid model's block manager when prompt chunks snapshot the recurrent state inside
        # their forward (blocks.py `plan_snapshots`, the state's `cut_next`)
        self.snapshots = None
        self._kept: list[torch.Tensor] = []  # [n_i, T_i, H'] what the proposer reads

    def reset(self) -> None:
        """Forget what the last step kept (a step starts)."""
        self._kept = []

    def keep(self, hidden: torch.Tensor) -> None:
        """Keep a forward's `reads` output [n, T, H'] for the proposer."""
        self._kept.append(hidden)

    def kept(self) -> torch.Tensor | None:
        """What this step's forwards kept for the proposer, padded to one width: [n, W, H']."""
        parts, self._kept = self._kept, []
        if not parts:
            return None
        width = max(h.shape[1] for h in parts)
        return torch.cat([torch.nn.functional.pad(h, (0, 0, 0, width - h.shape[1]))
                          for h in parts])  # [n, W, H']

    def run(self, batch: StepBatch) -> torch.Tensor:
        """Logits [n, V] after each row's last fed token (an ordinary step: no drafts)."""
        self.last_graph = None
        rows, dev = batch.rows, self.device
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        if batch.is_decode:
            tokens = torch.tensor([r.tokens for r in rows], dtype=torch.int64)  # [n, 1]
            positions = torch.tensor([[r.start] for r in rows], dtype=torch.int64)  # [n, 1]
            if self.graphs is not None:
                graph, captured = self.graphs.get(len(rows))
                if captured:
                    log.info("decode_graph_captured", batch_size=graph.size)
                n = len(rows)
                staged = self.host_inputs[:n]  # contiguous and pinned: the copy does not block
                staged[:, 0:1].copy_(tokens)
                staged[:, 1:2].copy_(positions)
                staged[:, 2].copy_(lanes)
                inputs = staged.to(dev, non_blocking=True)  # [n, 3]
                self.last_graph = graph
                logits = graph.run(inputs[:, 0:1], inputs[:, 1:2], inputs[:, 2])
                if graph.hidden is not None:  # kept for the proposer
                    self.keep(graph.hidden[:n])
                return logits
            kv_len = max(r.start for r in rows) + 1
            return self.logits(tokens.to(dev), positions.to(dev), lanes.to(dev),
                               kv_len=kv_len)[:, -1]
        width = max(len(r.tokens) for r in rows)
        cuts = None
        if self._graph_shape(rows, width) is not None:
            cuts = self._cuts(rows)
            fit = lane_breaks([(r.start, len(r.tokens)) for r in rows], [c[1] for c in cuts],
                              self.max_len)
            if fit is not None:
                breaks, split = fit
                if not cuts and not breaks:
                    return self._graph_forward([r.tokens for r in rows], [r.start for r in rows],
                                               [r.request.lane for r in rows])
                self.prefill_graphs.split_steps += bool(cuts)
                self.lane_end_rows += len(split)
                return run_segments(self.state, [(r.tokens, r.start, r.request.lane)
                                                 for r in rows], cuts, self._graph_forward,
                                    breaks=breaks)
        padded = self._padded(width)
        if any(r.start + padded > self.max_len for r in rows):  # padding would leave a lane
            if cuts is None:
                cuts = self._cuts(rows)
            return torch.cat([self._row(r, [(0, t, slot) for b, t, slot in cuts if b == i])
                              for i, r in enumerate(rows)])
        return self.prefill(rows, padded, cuts=cuts)

    def _graph_shape(self, rows: Sequence[BatchRow], width: int) -> tuple[int, int] | None:
        # The prefill graph's (rows, width) for these rows, or None where the step runs eagerly:
        # no graphs, a proposer reading hidden states, or too wide (where the graph width would
        # leave a lane, `lane_breaks` splits the step)
        if self.prefill_graphs is None or self.reads is not None:
            return None
        return self.prefill_graphs.shape(len(rows), width)

    def _row(self, r: BatchRow, cuts: list[tuple[int, int, int]]) -> torch.Tensor:
        # Logits [1, V] of one row's eager prefill at a warmed width inside its lane: one forward,
        # or near the lane's end the consecutive forwards of buckets.py `plan_widths`, each
        # committed before the next (prefill_graphs.py `run_segments`), each taking the snapshot
        # cuts that fall inside it.
        n = len(r.tokens)
        plan = plan_widths(r.start, n, self.max_len, self.widths) if self.bucketed else None
        if plan is None or len(plan) == 1:
            return self.prefill((r,), plan[0][1] if plan else n, cuts=cuts)
        self.lane_end_rows += 1
        ends = list(accumulate(k for k, _ in plan))
        width_at = {e - k: w for e, (k, w) in zip(ends, plan)}  # offset -> width
        kept = len(self._kept)

        def piece(tokens, starts, lanes) -> torch.Tensor:
            p, k = starts[0] - r.start, len(tokens[0])
            inside = [(0, t - p, slot) for _, t, slot in cuts if p < t <= p + k]
            return self.prefill((replace(r, tokens=tuple(tokens[0]), start=starts[0]),),
                                width_at[p], cuts=inside)

        out = run_segments(self.state, [(r.tokens, r.start, r.request.lane)], [], piece,
                           breaks=ends[:-1])
        if len(self._kept) > kept:  # the proposer reads the row's tokens as one forward's
            parts = self._kept[kept:]
            self._kept[kept:] = [torch.cat([h[:, :k] for h, (k, _) in zip(parts, plan)], 1)]
        return out

    def _graph_forward(self, tokens, starts, lanes) -> torch.Tensor:
        # Logits [k, V] of rows (tokens, start position, lane each) through their prefill graph,
        # also a segment of `run_segments` (eager where that shape's capture failed: the same
        # padded inputs through the function it captures).
        shape = self.prefill_graphs.shape(len(tokens), max(len(t) for t in tokens))
        graph, captured = self.prefill_graphs.get(*shape)
        if captured:
            log.info("prefill_graph_captured", batch_size=shape[0], width=shape[1],
                     ok=graph is not None)
        inputs = padded_inputs(tokens, starts, lanes, *shape, self.prefill_graphs.scratch_lane)
        if graph is None:
            inputs = (t.to(self.device) for t in inputs)
            return static_prefill(self.model, self.state, *inputs)[:len(tokens)]
        self.prefill_graphs.replays += 1
        return graph.run(*(t.pin_memory() for t in inputs))[:len(tokens)]

    def _cuts(self, rows: Sequence[BatchRow]) -> list[tuple[int, int, int]]:
        # The prefix-cache snapshots a hybrid model's forward of these rows takes inside itself:
        # (batch row, offset into the forward, snapshot slot); [] for none (blocks.py).
        if self.snapshots is None:
            return []
        return [(i, t, slot) for i, r in enumerate(rows)
                for t, slot in self.snapshots.plan_snapshots(
                    r.request.lane, r.request.prompt_ids, r.start, r.end)]

    def _padded(self, width: int) -> int:
        # The width a prefill forward runs at (buckets.py) where it fits every row's lane.
        return prefill_width(width) if self.bucketed else width

    def verify(self, rows: Sequence[BatchRow], full: int) -> torch.Tensor:
        """Logits [n, W, V] of verify rows (anchor + drafts, W <= full = K+1 tokens): the
        captured verify graph where every row's K+1 positions fit its lane, else eager."""
        width = max(len(r.tokens) for r in rows)
        if self.verify_graphs is not None and all(r.start + full <= self.max_len for r in rows):
            return self._verify_graph(rows, full)
        if any(r.start + width > self.max_len for r in rows):  # padding would leave the lane
            return torch.cat([_pad(self.prefill((r,), len(r.tokens), every=True), width)
                              for r in rows])
        return self.prefill(rows, width, every=True)  # [n, W, V]

    def _verify_graph(self, rows: Sequence[BatchRow], full: int) -> torch.Tensor:
        # The replayed verify graph: rows padded to K+1 tokens at the following positions.
        dev = self.device
        tokens = torch.zeros(len(rows), full, dtype=torch.int64)  # [n, K+1]
        for i, r in enumerate(rows):
            tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
        positions = torch.tensor([r.start for r in rows])[:, None] + torch.arange(full)[None]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)
        graph, captured = self.verify_graphs.get(len(rows))
        if captured:
            log.info("verify_graph_captured", batch_size=graph.size, width=full)
        logits = graph.run(tokens.to(dev, non_blocking=True),
                           positions.to(dev, non_blocking=True),
                           lanes.to(dev, non_blocking=True))  # [n, K+1, V]
        if graph.hidden is not None:  # kept for the proposer
            self.keep(graph.hidden[:len(rows)])
        return logits

    def logits(self, tokens, positions, lanes, *, kv_len, logit_index=None, num_tokens=None):
        """The model's logits; with a proposer that reads hidden states through hidden_states +
        logits, keeping what it reads: the final hidden states or the tapped layers' outputs."""
        if self.reads is None:
            return self.model(tokens, positions, self.state, lanes, kv_len=kv_len,
                              logit_index=logit_index, num_tokens=num_tokens)
        if self.reads != FINAL:
            hidden, kept = self.model.hidden_states(tokens, positions, self.state, lanes,
                                                    kv_len=kv_len, num_tokens=num_tokens,
                                                    tap=self.reads)
        else:
            hidden = kept = self.model.hidden_states(tokens, positions, self.state, lanes,
                                                     kv_len=kv_len, num_tokens=num_tokens)
        self.keep(kept)  # [n, T, H']
        if logit_index is not None:
            hidden = hidden.gather(1, logit_index[:, :, None].expand(-1, -1, hidden.shape[-1]))
        return self.model.logits(hidden)

    def prefill(self, rows: Sequence[BatchRow], width: int, *, every: bool = False,
                cuts: list[tuple[int, int, int]] | None = None) -> torch.Tensor:
        """Rows padded on the right to `width` at the following positions (all < max_len).
        Logits [n, V] after each row's last real token, or with `every` [n, width, V]. `cuts`:
        the snapshot cuts `_cuts` already planned for these rows (None: planned here)."""
        dev = self.device
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)  # [n, T]
        positions = torch.zeros(len(rows), width, dtype=torch.int64)  # [n, T]
        for i, r in enumerate(rows):
            tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
            positions[i] = torch.arange(r.start, r.start + width)
        fed = torch.tensor([len(r.tokens) for r in rows], dtype=torch.int64)  # [n]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        kv_len = max(r.start for r in rows) + width
        if not every and self.snapshots is not None:
            self.state.cut_next(self._cuts(rows) if cuts is None else cuts)
        index = None if every else (fed - 1)[:, None].to(dev)
        out = self.logits(tokens.to(dev), positions.to(dev), lanes.to(dev), kv_len=kv_len,
                          logit_index=index, num_tokens=fed.to(dev))  # [n, 1|T, V]
        return out if every else out[:, 0]


def _pad(logits: torch.Tensor, width: int) -> torch.Tensor:
    # logits: [1, w, V] -> [1, width, V] (zeros: positions the acceptance walk never reaches)
    return torch.cat([logits, logits.new_zeros(1, width - logits.shape[1], logits.shape[2])], 1)
