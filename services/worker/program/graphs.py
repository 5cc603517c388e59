"""CUDA graphs of the Program: one captured decode forward per batch size.

Sizes 1, 2, 4, ... up to B are captured lazily; a batch is padded to the next size with rows that
write the scratch lane. Each graph also captures the greedy sample stage of an unconstrained,
unpenalized batch (program/sampling.py `greedy_in_graph`), so such a step is one graph replay and
two small copies to the host. Speculative backends will add a Forward and a Finish graph per size here.
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

    def __init__(self, model, state, size: int, scratch_lane: int, pool, sample=None) -> None:
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
                out = model(self.tokens, self.positions, state, self.lanes, kv_len=state.max_len)
                if sample is not None:
                    sample(out[:, -1])
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.sampled = None
        with torch.cuda.graph(self.graph, pool=pool):
            out = model(self.tokens, self.positions, state, self.lanes, kv_len=state.max_len)
            self.logits = out[:, -1]  # [S, V]
            if sample is not None:
                self.sampled = sample(self.logits)  # ([S] int64, [S] int32)

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
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


class DecodeGraphs:
    """The decode graphs of one Program, captured on first use per padded size."""

    def __init__(self, model, state, max_batch: int, scratch_lane: int,
                 sample_stage=lambda: None) -> None:
        self._model, self._state, self._scratch = model, state, scratch_lane
        self._sample_stage = sample_stage  # at each capture: the in-graph sample stage or None
        self._sizes = graph_sizes(max_batch)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[int, DecodeGraph] = {}

    def get(self, n: int) -> tuple[DecodeGraph, bool]:
        """The graph for a batch of n rows, and whether it was captured by this call."""
        size = next(s for s in self._sizes if s >= n)
        graph = self._graphs.get(size)
        if graph is not None:
            return graph, False
        graph = DecodeGraph(self._model, self._state, size, self._scratch, self._pool,
                            sample=self._sample_stage())
        self._graphs[size] = graph
        return graph, True

    def clear(self) -> None:
        self._graphs.clear()
