"""The MTP proposer's draft pass, one function for the eager and the graphed route.

An MTP round's draft pass (spec/mtp.py) is one alignment forward of the MTP module over a row's
kept positions, then k - 1 steps feeding the module its own output and its previous draft. Eager,
each of those is ~20 small launches at B = 1 (one decoder layer and the LM head), and each step's
argmax went to the host before the next step: on the H200 the pass cost 0.6 plain decode steps
at k = 1, all of it exposed (the host waits for the next round's drafts). Captured, the pass is
one replay and one copy of the [n, k] drafts to the host.

`draft_chain` is what both routes run (the design document: graph and eager execution use the
same native calls). A graph is captured per padded batch size (program/graphs.py `graph_sizes`)
and alignment width (1 .. K+1: a decode row keeps 1 position, a verify row its anchor and
accepted drafts); padding rows write the Program's scratch lane, and attention reads the whole
lane (kv_len = max_len) as the decode graphs do, so a replay does not depend on the context
length. Rows whose chain would leave the lane, and prefill chunks (wider than K+1), run eagerly.
The graph's drafts may differ in their last bits from the eager route's (another attention
split); drafts are proposals, so the output is unchanged either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.worker.program.graphs import graph_sizes


def draft_chain(model, state, hidden: torch.Tensor, next_tokens: torch.Tensor,
                positions: torch.Tensor, lanes: torch.Tensor, last: torch.Tensor, vocab_size: int,
                kv_lens: Sequence[int | None], head_rows: int | None = None) -> torch.Tensor:
    """hidden [n, M, H] target hidden states, next_tokens / positions [n, M] int64 (the kept
    positions and the next committed token of each), lanes [n], last [n, 1] the index of each
    row's last kept position -> drafts [n, len(kv_lens)] int64, greedy and unconstrained over
    the first `vocab_size` token ids, on the device (no host synchronisation). kv_lens: the
    attention bound of the alignment forward and of each following step (None: the lane's whole
    length). head_rows: the LM head computes only its first head_rows rows (>= vocab_size;
    None: all of them, the padded head's tuned shape)."""
    logits, out = model.mtp_forward(hidden, next_tokens, positions, state, lanes,
                                    kv_len=kv_lens[0], logit_index=last,
                                    vocab=head_rows)  # [n, 1, V]
    pos = positions.gather(1, last)  # [n, 1] the last kept position: the anchor follows it
    drafts = []
    for step in range(len(kv_lens)):
        token = logits[:, 0, :vocab_size].argmax(dim=-1)  # [n]
        drafts.append(token)
        if step + 1 == len(kv_lens):
            break
        pos = pos + 1
        # the next step's own bound: its query at `pos` sees its own key there
        logits, out = model.mtp_forward(out, token[:, None], pos, state, lanes,
                                        kv_len=kv_lens[step + 1], vocab=head_rows)
    return torch.stack(drafts, dim=1)  # [n, k]


class MtpDraftGraph:
    """One captured draft pass for a padded batch size and alignment width: static hidden
    [S, W, H], next tokens and positions [S, W], lanes [S], last [S, 1] in; drafts [S, k] out."""

    def __init__(self, model, state, size: int, width: int, k: int, vocab: tuple[int, int | None],
                 hidden_size: int, dtype: torch.dtype, scratch_lane: int, pool) -> None:
        device = next(model.parameters()).device
        self.size, self.width, self.scratch_lane = size, width, scratch_lane
        self.hidden = torch.zeros(size, width, hidden_size, dtype=dtype, device=device)
        self.next_tokens = torch.zeros(size, width, dtype=torch.int64, device=device)
        self.positions = torch.arange(width, device=device).repeat(size, 1)  # [S, W]
        self.lanes = torch.full((size,), scratch_lane, dtype=torch.int64, device=device)
        self.last = torch.zeros(size, 1, dtype=torch.int64, device=device)
        args = (model, state, self.hidden, self.next_tokens, self.positions, self.lanes,
                self.last, vocab[0], (None,) * k, vocab[1])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture (allocator, lazy inits)
                draft_chain(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.drafts = draft_chain(*args)  # [S, k]

    def run(self, hidden: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
            lanes: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The drafts [n, k] of n <= size rows (inputs as `draft_chain`'s, n rows, width W);
        the padding rows feed the scratch lane from position 0."""
        n = hidden.shape[0]
        self.hidden[:n].copy_(hidden)
        self.next_tokens[:n].copy_(next_tokens, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.lanes[:n].copy_(lanes, non_blocking=True)
        self.last[:n].copy_(last, non_blocking=True)
        if n < self.size:
            self.hidden[n:].zero_()
            self.next_tokens[n:].zero_()
            self.positions[n:].copy_(torch.arange(self.width, device=self.positions.device))
            self.lanes[n:].fill_(self.scratch_lane)
            self.last[n:].zero_()
        self.graph.replay()
        return self.drafts[:n]


class MtpDraftGraphs:
    """The draft-pass graphs of one MTP proposer per (padded size, width) for widths
    1 .. max_width: all at the warm-up (`capture_all`), or on first use without one."""

    def __init__(self, model, state, max_batch: int, max_width: int, k: int, vocab_size: int,
                 scratch_lane: int, head_rows: int | None = None) -> None:
        self._model, self._state = model, state
        self._k, self._vocab, self._scratch = k, (vocab_size, head_rows), scratch_lane
        self.max_batch, self.max_width = max_batch, max_width
        self._hidden = (model.config.hidden_size, next(model.parameters()).dtype)
        self._sizes = graph_sizes(max_batch)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int], MtpDraftGraph] = {}
        self.replays = self.captures = 0  # counted for tests and benches (none after warm-up)

    def fits(self, n: int, width: int, last_start: int) -> bool:
        """Whether n rows of `width` kept positions, the furthest starting at `last_start`, can
        replay a graph: within the batch classes and the widths, and every position the chain
        feeds (the alignment's, then k - 1 steps) inside the lane."""
        return (n <= self._sizes[-1] and 1 <= width <= self.max_width
                and last_start + width + self._k - 1 <= self._state.max_len)

    def capture_all(self) -> int:
        """Capture every (padded size, width) graph not captured yet (the start-up warm-up, so
        no capture runs on the request path); returns how many the proposer holds."""
        for size in self._sizes:
            for width in range(1, self.max_width + 1):
                self._get(size, width)
        return len(self._graphs)

    def _get(self, size: int, width: int) -> MtpDraftGraph:
        graph = self._graphs.get((size, width))
        if graph is None:
            graph = MtpDraftGraph(self._model, self._state, size, width, self._k, self._vocab,
                                  *self._hidden, self._scratch, self._pool)
            self._graphs[(size, width)] = graph
            self.captures += 1
        return graph

    def run(self, hidden, next_tokens, positions, lanes, last) -> torch.Tensor:
        n, width = next_tokens.shape
        graph = self._get(next(s for s in self._sizes if s >= n), width)
        self.replays += 1
        return graph.run(hidden, next_tokens, positions, lanes, last)

    def clear(self) -> None:
        self._graphs.clear()
