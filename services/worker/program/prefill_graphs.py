"""CUDA graphs of short prefill forwards: one captured forward per (batch-size class, width
bucket), for the steps a prefix-cache hit or a short prompt runs (a few dozen new tokens), which
eagerly are host-bound: hundreds of kernel launches for a few milliseconds of device work.

A step of n prefill rows whose widest row feeds w tokens runs the graph of `graph_sizes` class
S >= n and width W = `graph_width(w)` (the next of `GRAPH_WIDTHS`), its rows padded by
`padded_inputs`: each row on the right to W tokens at the following positions (exact for the
reasons buckets.py gives: causal attention, KV written only past the committed frontier, g = beta
= 0 through a hybrid model's recurrence, logits read at each row's last real token), and the step
to S rows with rows of W tokens at positions 0.. of the scratch lane (as a decode graph's padding
rows). Widths up to buckets.py's EXACT_WIDTHS stay on the hybrid model's per-token recurrence
(whose result for a token does not depend on how many tokens follow it), wider ones on the
chunked one, as the eager forward of the same width.

A hybrid model's forward that snapshots the recurrent state inside itself (prefix-cache cuts,
models/gdn.py `_recur_cut`, whose segments are host-side slices a static graph cannot express)
runs as consecutive graph forwards that end at its cuts (`run_segments`): a row's state is
snapshotted after the segment that ends at its cut, and committed between segments so the next
one continues it (a prefill row left uncommitted is one whose request is over: its lane is
released, so committing its leading segments early changes nothing that is read again).
A step whose graph width would leave a row's lane (a hit's question in a lane's last positions)
runs the same way, with breaks where that row's tokens split into forwards of graph widths that
stay inside the lane (`lane_breaks`, buckets.py `plan_widths`), as a dense model's too.

The graph and its eager twin run one function, `static_prefill` (attention bounded by the lane's
whole length, kv_len = max_len, as the decode graph: the context split count then does not
depend on the row's length), so a replay's logits equal the eager forward of the same padded
inputs bit for bit (the gpu test). What stays eager (forward.py): steps with a row that has
fewer positions left than the narrowest graph, and forwards whose hidden states a proposer reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

import torch

from services.worker.program.buckets import plan_widths
from services.worker.program.graphs import graph_sizes

GRAPH_WIDTHS = (8, 16, 32, 64)  # prefill widths with a graph; a forward pads to the next one


def graph_width(width: int) -> int | None:
    """The graph width a prefill forward of `width` tokens per row (at most) runs at, or None
    when it is wider than every graph."""
    return next((w for w in GRAPH_WIDTHS if w >= width), None)


def graph_shapes(max_batch: int, prefill_chunk: int, max_len: int) -> list[tuple[int, int]]:
    """(rows S, width W) of every prefill graph a Program captures: each width bucket up to
    max_len and each batch-size class one step can hold (its narrowest widest row, one more
    token than the bucket below, plus one token per other row within `prefill_chunk`)."""
    shapes, below = [], 0
    for width in GRAPH_WIDTHS:
        if width > max_len or below >= prefill_chunk:  # no step's widest row pads to it
            break
        for rows in graph_sizes(max_batch):
            if below + 1 + rows - 1 <= max(prefill_chunk, width):
                shapes.append((rows, width))
        below = width
    return shapes


def padded_inputs(tokens: Sequence[Sequence[int]], starts: Sequence[int], lanes: Sequence[int],
                  size: int, width: int, scratch_lane: int) -> tuple[torch.Tensor, ...]:
    """Host tensors of n <= size rows padded to a graph's shape (module docstring): tokens,
    positions [size, width], lanes [size], fed [size] (real tokens per row; 1 for padding rows),
    int64. Row i feeds tokens[i] from position starts[i] in lane lanes[i]."""
    n = len(tokens)
    out_tokens = torch.zeros(size, width, dtype=torch.int64)  # [S, W]
    positions = torch.arange(width, dtype=torch.int64).repeat(size, 1)  # [S, W]
    out_lanes = torch.full((size,), scratch_lane, dtype=torch.int64)  # [S]
    fed = torch.ones(size, dtype=torch.int64)  # [S]
    for i in range(n):
        out_tokens[i, :len(tokens[i])] = torch.tensor(tokens[i], dtype=torch.int64)
        positions[i] += starts[i]
        out_lanes[i] = lanes[i]
        fed[i] = len(tokens[i])
    return out_tokens, positions, out_lanes, fed


def segments(lengths: Sequence[int], cuts: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """The forwards a prefill step of rows feeding `lengths` tokens, cut at offsets `cuts`
    (1 <= offset <= the row's length), runs as: (p, t, rows) per forward, the rows that have
    tokens in [p, t), feeding tokens p .. min(t, length) - 1 each."""
    out, p = [], 0
    for t in sorted(set(cuts) | {max(lengths)}):
        if t > p:
            out.append((p, t, [i for i, n in enumerate(lengths) if n > p]))
            p = t
    return out


def lane_breaks(rows: Sequence[tuple[int, int]], cuts: Sequence[int], max_len: int,
                widths: Sequence[int] = GRAPH_WIDTHS) -> tuple[list[int], set[int]] | None:
    """Where a prefill step of rows (start position, tokens) split at its snapshot `cuts`
    (offsets) also breaks so that each of its `segments` forwards runs at one of `widths` inside
    every row's lane: where a segment's width would leave a row's lane, that row's tokens of the
    segment are planned (buckets.py `plan_widths`) and the segment breaks where a piece ends,
    until every segment fits. Returns (breaks, the rows planned), or None when a row has fewer
    positions left than the narrowest width."""
    lengths = [n for _, n in rows]
    breaks: set[int] = set()
    split: set[int] = set()
    while True:
        new: set[int] = set()
        for p, t, sub in segments(lengths, list(cuts) + sorted(breaks)):
            width = next((w for w in widths if w >= t - p), None)
            for i in sub:
                start, n = rows[i]
                if width is not None and start + p + width <= max_len:
                    continue
                plan = plan_widths(start + p, min(t, n) - p, max_len, widths)
                if plan is None:
                    return None
                split.add(i)
                new |= {p + e for e in accumulate(k for k, _ in plan) if p + e < t}
                break  # this segment splits: the next round re-reads the rows
        if not new - breaks:
            return sorted(breaks), split
        breaks |= new


def run_segments(state, rows: Sequence[tuple[Sequence[int], int, int]],
                 cuts: Sequence[tuple[int, int, int]],
                 forward: Callable[..., torch.Tensor], breaks: Sequence[int] = ()) -> torch.Tensor:
    """A prefill step with snapshot cuts or lane-end breaks (module docstring) as `segments`
    forwards: rows (tokens, start position, lane) per batch row; cuts (batch row, offset, slot);
    breaks: more offsets a segment ends at (no snapshot there); forward(tokens per row, starts,
    lanes) -> logits [k, V] after each given row's last token (a graph's static output: copied
    here). Returns logits [n, V]; every row's forward is pending, counted whole (commit keeps it
    as one forward of all its tokens)."""
    dev = state.device
    lengths = [len(r[0]) for r in rows]

    def ids(values) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64).to(dev, non_blocking=True)

    parts, order = [], []
    for p, t, sub in segments(lengths, [c[1] for c in cuts] + list(breaks)):
        logits = forward([rows[i][0][p:t] for i in sub], [rows[i][1] + p for i in sub],
                         [rows[i][2] for i in sub])  # [k, V]
        done = [j for j, i in enumerate(sub) if lengths[i] <= t]
        parts.append(logits.index_select(0, ids(done)))
        order += [sub[j] for j in done]
        snap = [(rows[i][2], slot) for i, offset, slot in cuts if offset == t]
        if snap:
            state.save_pending(ids(lane for lane, _ in snap), ids(slot for _, slot in snap))
        going = [i for i in sub if lengths[i] > t]
        if going:
            state.commit(ids(rows[i][2] for i in going), ids(t - p for _ in going))
        whole = [i for i in sub if lengths[i] <= t and p > 0]
        if whole:
            state.count_whole(ids(rows[i][2] for i in whole), ids(lengths[i] for i in whole))
    out = torch.cat(parts)  # [n, V] in `order`
    return out.index_select(0, ids(sorted(range(len(order)), key=order.__getitem__)))


def static_prefill(model, state, tokens: torch.Tensor, positions: torch.Tensor,
                   lanes: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
    """The forward a prefill graph captures (and its eager twin): tokens, positions [S, W],
    lanes [S], fed [S] real tokens per row -> logits [S, V] after each row's last real token,
    attention bounded by the lane's whole length."""
    index = (fed - 1)[:, None]  # [S, 1]
    return model(tokens, positions, state, lanes, kv_len=state.max_len, logit_index=index,
                 num_tokens=fed)[:, 0]


class PrefillGraph:
    """One captured prefill forward of `size` rows x `width` tokens: static tokens / positions
    [S, W], lanes / fed [S] in, static logits [S, V] out."""

    def __init__(self, model, state, size: int, width: int, scratch_lane: int, pool) -> None:
        device = next(model.parameters()).device
        self.size, self.width, self.scratch_lane = size, width, scratch_lane
        host = padded_inputs([], [], [], size, width, scratch_lane)
        self.tokens, self.positions, self.lanes, self.fed = (t.to(device) for t in host)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture (compiles, autotuning, lazy inits)
                static_prefill(model, state, self.tokens, self.positions, self.lanes, self.fed)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = static_prefill(model, state, self.tokens, self.positions, self.lanes,
                                         self.fed)  # [S, V]

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor,
            fed: torch.Tensor) -> torch.Tensor:
        """Inputs shaped as `padded_inputs` makes them (host or device); replays; returns the
        logits [S, V] (a view of the static output)."""
        self.tokens.copy_(tokens, non_blocking=True)
        self.positions.copy_(positions, non_blocking=True)
        self.lanes.copy_(lanes, non_blocking=True)
        self.fed.copy_(fed, non_blocking=True)
        self.graph.replay()
        return self.logits


class PrefillGraphs:
    """The prefill graphs of one Program, captured on first use (the warm-up captures every
    shape of `graph_shapes`), sharing one memory pool. A shape whose capture failed is
    remembered as None: its forwards stay eager."""

    def __init__(self, model, state, max_batch: int, scratch_lane: int) -> None:
        self._model, self._state, self._scratch = model, state, scratch_lane
        self._sizes = graph_sizes(max_batch)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int], PrefillGraph | None] = {}
        self.replays = 0  # steps run through a graph (cumulative)
        self.split_steps = 0  # steps with snapshot cuts run as segment forwards (cumulative)

    @property
    def captured(self) -> tuple[tuple[int, int], ...]:
        """(rows, width) of the graphs captured so far."""
        return tuple(sorted(k for k, g in self._graphs.items() if g is not None))

    @property
    def scratch_lane(self) -> int:
        return self._scratch

    def shape(self, n: int, width: int) -> tuple[int, int] | None:
        """(S, W) of the graph a step of n rows, widest row `width` tokens, runs; None: eager."""
        w = graph_width(width)
        if w is None or n > self._sizes[-1]:
            return None
        return next(s for s in self._sizes if s >= n), w

    def get(self, size: int, width: int) -> tuple[PrefillGraph | None, bool]:
        """The graph of that shape (None where its capture failed) and whether this call
        captured it."""
        key = (size, width)
        if key in self._graphs:
            return self._graphs[key], False
        try:
            graph = PrefillGraph(self._model, self._state, size, width, self._scratch, self._pool)
        except RuntimeError:  # a kernel that cannot be captured: this shape runs eagerly
            torch.cuda.synchronize()
            graph = None
        self._graphs[key] = graph
        return graph, True

    def clear(self) -> None:
        self._graphs.clear()
