"""CUDA graphs of the Program: one captured decode forward per batch size, for the
host-launched speculative route one captured verify forward (K+1 tokens per row) per size (both
keep the final hidden states for the MTP proposer when asked), and DFlash's Forward graph.

Sizes 1, 2, 4, ... up to B are captured lazily; a batch is padded to the next size with rows that
write the scratch lane. Each decode graph also captures the greedy sample stage of an
unconstrained, unpenalized batch (program/sampling.py `greedy_in_graph`), so such a step is one
graph replay and two small copies to the host; and, in a second small graph replayed once the
CPU's masks are uploaded, the masked greedy stage of a constrained, unpenalized batch
(`masked_greedy_in_graph`, the fused kernel on the Program's static mask buffer). The verify graph
holds the target forward only: drafts are fixed on the host before it, masks are filled while it
runs, and acceptance runs after it outside the graph (design document: "sampling and acceptance run
on the host-launched path after the verify forward, outside the CUDA Graph").
"""

from __future__ import annotations

import torch


def graph_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... below max_batch, then max_batch itself."""
    sizes, s = [], 1
    while s < max_batch:
        sizes.append(s)
        s *= 2
    return tuple(sizes) + (max_batch,)


class DecodeGraph:
    """One captured decode forward for a fixed batch size: static tokens/positions/lanes in,
    static last-position logits out. Attention reads the whole lane (kv_len = max_len), so the
    graph does not depend on the context length. With `sample` (logits [S, V] -> (tokens [S]
    int64, status [S] int32), no host synchronisation) the graph also runs that sample stage
    after the forward: `sampled` holds its outputs, for the batches that may use them (an
    unconstrained all-greedy batch); the logits stay available to every other batch."""

    def __init__(self, model, state, size: int, scratch_lane: int, pool,
                 keep_hidden: bool = False, sample=None, masked=None) -> None:
        device = next(model.parameters()).device
        self.size = size
        self.scratch_lane = scratch_lane
        self.tokens = torch.zeros(size, 1, dtype=torch.int64, device=device)  # [S, 1]
        self.positions = torch.zeros(size, 1, dtype=torch.int64, device=device)  # [S, 1]
        self.lanes = torch.full((size,), scratch_lane, dtype=torch.int64, device=device)  # [S]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture (allocator, lazy inits)
                out, _ = _forward(model, self.tokens, self.positions, state, self.lanes,
                                  keep_hidden)
                if sample is not None:
                    sample(out[:, -1])
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.sampled = None
        with torch.cuda.graph(self.graph, pool=pool):
            out, self.hidden = _forward(model, self.tokens, self.positions, state, self.lanes,
                                        keep_hidden)  # hidden: [S, 1, H] or None
            self.logits = out[:, -1]  # [S, V]
            if sample is not None:
                self.sampled = sample(self.logits)  # ([S] int64, [S] int32)
        # The masked sample stage, its own small graph replayed after the CPU's mask fill: the
        # masks go up into the Program's static mask buffer, each row's descriptor into mask_row.
        self.masked_graph = self.masked_sampled = None
        self.mask_row = torch.full((size,), -1, dtype=torch.int32, device=device)  # [S]
        if masked is not None:
            stage, masks = masked
            with torch.cuda.stream(side):
                stage(self.logits, masks, self.mask_row)  # compile outside capture
            torch.cuda.current_stream().wait_stream(side)
            self.masked_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.masked_graph, pool=pool):
                self.masked_sampled = stage(self.logits, masks, self.mask_row)

    def sample_masked(self, mask_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After `run` and the masks' upload: mask_row [S] int32 (pinned host or device; -1 =
        unconstrained) per graph row; replays the masked sample stage, returns its (tokens [S],
        status [S])."""
        self.mask_row.copy_(mask_row, non_blocking=True)
        self.masked_graph.replay()
        return self.masked_sampled

    def run(
        self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor
    ) -> torch.Tensor:
        """tokens, positions: [n, 1]; lanes: [n] (n <= size); returns logits [n, V] (a view)."""
        n = tokens.shape[0]
        self.tokens[:n].copy_(tokens, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.lanes[:n].copy_(lanes, non_blocking=True)
        self.tokens[n:].zero_()
        self.positions[n:].zero_()
        self.lanes[n:].fill_(self.scratch_lane)
        self.graph.replay()
        return self.logits[:n]


def _forward(model, tokens, positions, state, lanes, keep_hidden: bool):
    # (logits [S, T, V], final hidden states [S, T, H] when kept for a proposer (MTP) or None)
    if not keep_hidden:
        return model(tokens, positions, state, lanes, kv_len=state.max_len), None
    hidden = model.hidden_states(tokens, positions, state, lanes, kv_len=state.max_len)
    return model.logits(hidden), hidden


class VerifyGraph:
    """One captured verify forward for a fixed batch size and width W = K+1: static tokens and
    positions [S, W], lanes [S] in, static logits [S, W, V] out (kv_len = max_len). A row's
    positions must all lie inside its lane (the Program runs rows near the lane's end eagerly)."""

    def __init__(self, model, state, size: int, width: int, scratch_lane: int, pool,
                 keep_hidden: bool = False) -> None:
        device = next(model.parameters()).device
        self.size, self.width, self.scratch_lane = size, width, scratch_lane
        self.tokens = torch.zeros(size, width, dtype=torch.int64, device=device)  # [S, W]
        self.positions = torch.arange(width, device=device).repeat(size, 1)  # [S, W]
        self.lanes = torch.full((size,), scratch_lane, dtype=torch.int64, device=device)  # [S]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                _forward(model, self.tokens, self.positions, state, self.lanes, keep_hidden)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits, self.hidden = _forward(model, self.tokens, self.positions, state,
                                                self.lanes, keep_hidden)  # [S, W, V], [S, W, H]

    def run(
        self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor
    ) -> torch.Tensor:
        """tokens, positions: [n, W]; lanes: [n] (n <= size); returns logits [n, W, V] (a view)."""
        n = tokens.shape[0]
        self.tokens[:n].copy_(tokens, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.lanes[:n].copy_(lanes, non_blocking=True)
        self.tokens[n:].zero_()
        self.positions[n:].copy_(torch.arange(self.width, device=self.positions.device)
                                 .expand(self.size - n, -1))
        self.lanes[n:].fill_(self.scratch_lane)
        self.graph.replay()
        return self.logits[:n]


class DFlashForwardGraph:
    """One captured DFlash Forward for a fixed batch size (design document: "DFlash's Forward
    Graph records an event with cudaEventRecordExternal after the draft D2H and continues with
    the target forward"): the draft block over static anchors / lane positions / lanes, its ids
    copied into the pinned `host_ids`, the external event record, then the target forward over
    [anchor, drafts] keeping the tapped features. Attention reads whole lanes (kv_len =
    max_len): the graph does not depend on the context length."""

    def __init__(self, model, state, proposer, size: int, scratch_lane: int, pool,
                 host_ids: torch.Tensor, event) -> None:
        device = next(model.parameters()).device
        k = proposer.k
        self.size, self.scratch_lane = size, scratch_lane
        self.anchors = torch.zeros(size, dtype=torch.int64, device=device)  # [S]
        self.starts = torch.zeros(size, dtype=torch.int64, device=device)  # [S]
        self.lanes = torch.full((size,), scratch_lane, dtype=torch.int64, device=device)  # [S]
        self.offsets = torch.arange(k + 1, device=device)[None]  # [1, K+1]
        self.host_ids = host_ids  # [S, K] pinned
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture: the eager event record
                self._body(model, state, proposer, lambda: event.record(side))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            capture = torch.cuda.current_stream()
            self._body(model, state, proposer, lambda: event.record_external(capture))

    def _body(self, model, state, proposer, record) -> None:
        ids, _, _ = proposer.block_drafts(self.anchors, self.starts, self.lanes,
                                          kv_len=state.max_len)  # [S, K]
        self.host_ids.copy_(ids, non_blocking=True)
        record()  # the draft ids are on the host once the event completes
        tokens = torch.cat([self.anchors[:, None], ids], 1)  # [S, K+1]
        positions = self.starts[:, None] + self.offsets  # [S, K+1]
        hidden, self.feats = model.hidden_states(tokens, positions, state, self.lanes,
                                                 kv_len=state.max_len, tap=proposer.reads)
        self.logits = model.logits(hidden)  # [S, K+1, V]

    def run(self, anchors: torch.Tensor, starts: torch.Tensor, lanes: torch.Tensor) -> None:
        """anchors, starts, lanes: [n] device tensors (n <= size); replays the graph. The host
        then waits on the event, reads host_ids[:n], and uses logits[:n] and feats[:n]."""
        n = anchors.shape[0]
        self.anchors[:n].copy_(anchors)
        self.starts[:n].copy_(starts)
        self.lanes[:n].copy_(lanes)
        self.anchors[n:].zero_()
        self.starts[n:].zero_()
        self.lanes[n:].fill_(self.scratch_lane)
        self.graph.replay()


class DFlashForwardGraphs:
    """DFlash Forward graphs per padded batch size, captured on first use."""

    def __init__(self, model, state, proposer, max_batch: int, scratch_lane: int,
                 host_ids: torch.Tensor, event) -> None:
        self._args = (model, state, proposer)
        self._scratch, self._host_ids, self._event = scratch_lane, host_ids, event
        self._sizes = graph_sizes(max_batch)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[int, DFlashForwardGraph] = {}

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def get(self, n: int) -> tuple[DFlashForwardGraph, bool]:
        size = next(s for s in self._sizes if s >= n)
        graph = self._graphs.get(size)
        if graph is not None:
            return graph, False
        graph = DFlashForwardGraph(*self._args, size, self._scratch, self._pool,
                                   self._host_ids[:size], self._event)
        self._graphs[size] = graph
        return graph, True

    def clear(self) -> None:
        self._graphs.clear()


class DecodeGraphs:
    """The decode graphs of one Program, captured on first use per padded size; with `width`
    > 1 the verify graphs of K+1 = width tokens per row instead."""

    def __init__(self, model, state, max_batch: int, scratch_lane: int, width: int = 1,
                 keep_hidden: bool = False, sample_stage=lambda: None,
                 masked_stage=lambda: None) -> None:
        self._model, self._state, self._scratch = model, state, scratch_lane
        self._width, self._keep_hidden = width, keep_hidden
        self._sample_stage = (
            sample_stage  # at each decode capture: the in-graph sample stage or None
        )
        self._masked_stage = masked_stage  # likewise (stage, mask buffer) of constrained batches
        self._sizes = graph_sizes(max_batch)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[int, DecodeGraph | VerifyGraph] = {}

    @property
    def keep_hidden(self) -> bool:
        """Whether each graph also keeps the final hidden states (for a proposer reading them)."""
        return self._keep_hidden

    @property
    def captured(self) -> tuple[int, ...]:
        """The padded sizes captured so far."""
        return tuple(sorted(self._graphs))

    def get(self, n: int) -> tuple["DecodeGraph | VerifyGraph", bool]:
        """The graph for a batch of n rows, and whether it was captured by this call."""
        size = next(s for s in self._sizes if s >= n)
        graph = self._graphs.get(size)
        if graph is not None:
            return graph, False
        if self._width == 1:
            graph = DecodeGraph(self._model, self._state, size, self._scratch, self._pool,
                                self._keep_hidden, sample=self._sample_stage(),
                                masked=self._masked_stage())
        else:
            graph = VerifyGraph(self._model, self._state, size, self._width, self._scratch,
                                self._pool, self._keep_hidden)
        self._graphs[size] = graph
        return graph, True

    def clear(self) -> None:
        self._graphs.clear()
