"""MTP proposer: the Qwen3.5 multi-token-prediction module drafts k tokens per round.

The MTP layer at position t reads (h_t, x_{t+1}) (the target's final hidden state and the next
token) and predicts x_{t+2} (models/mtp_head.py); its own KV (in the model state) must hold every
committed position before the one it reads. So after every step the Program hands this proposer
the step's target hidden states and what each row emits (`after_step`), and it

1. aligns the MTP context: for each row the positions the commit keeps (a prefill chunk's tokens,
   or a decode/verify row's anchor and accepted drafts), fed with the next committed token of
   each (the prompt's next token, the accepted drafts, the correction or bonus);
2. proposes (rows that sampled, and Replays that caught up with their ledger): the prediction at
   the last kept position is the first draft after the new anchor;
   k - 1 more steps feed the module its own output hidden state and its previous draft, at the
   following positions (greedy, one-hot q, never constrained). With CUDA graphs the Program
   calls `use_graphs`: the alignment and the k steps of a decode or verify row group then replay
   one captured graph (spec/mtp_graphs.py); prefill chunks and rows near the lane's end run the
   same function eagerly.

Drafts are kept per lane with the committed length they continue; a round that commits something
else (an aborted round, a failed row, a pause) simply finds no matching drafts and decodes
ordinarily. MTP KV written past the committed frontier (draft steps, aborted rounds) is rewritten
by the next alignment before anything reads it.
"""

from __future__ import annotations

import time

import torch

from services.worker.program.batch import PendingBatch, RowOutcome
from services.worker.spec.mtp_graphs import MtpDraftGraphs, draft_chain
from services.worker.spec.proposer import FINAL, HostProposer


class MtpProposer(HostProposer):
    """Drafts from the model's MTP module (`model.mtp_forward`), `k` per round (>= 1), on the
    host route (spec/proposer.py), reading the target's final hidden states. Raises ValueError
    when the model has no MTP module."""

    reads = FINAL

    def __init__(self, model, state, k: int, vocab_size: int) -> None:
        if getattr(model, "mtp", None) is None or getattr(state, "mtp_layer", None) is None:
            raise ValueError("mtp: the model (or its state) has no MTP module")
        super().__init__(k)
        self.model = model
        self.state = state
        self.vocab_size = vocab_size
        self._drafts: dict[int, tuple[int, list[int]]] = {}  # lane -> (committed length, drafts)
        self._graphs: MtpDraftGraphs | None = None  # `use_graphs`: the draft pass replayed

    def propose(self, job, k: int) -> list[int]:
        """The drafts proposed for `job`'s committed output, at most k; [] when none match."""
        entry = self._drafts.get(job.lane)
        if entry is None or entry[0] != job.num_tokens or k <= 0:
            return []
        return entry[1][:k]

    def after_step(self, pending: PendingBatch, hidden: torch.Tensor | None) -> float:
        """hidden: [n, W, H] target hidden states of the step's rows (row b's fed tokens at
        [b, :len(tokens)]); pending: the step's per-row results (nothing is committed yet).
        The host waits here for the next round's drafts: all of it is exposed draft time."""
        start = time.perf_counter()
        self._align(pending.batch.rows, hidden, pending.results)
        return time.perf_counter() - start

    @torch.inference_mode()
    def _align(self, rows, hidden: torch.Tensor, results) -> None:
        dev = hidden.device
        max_len = self.state.max_len
        work = []  # (batch index, kept positions m, next tokens, committed length after, sample)
        for b, (row, res) in enumerate(zip(rows, results)):
            job = row.request
            self._drafts.pop(job.lane, None)
            if res.outcome is RowOutcome.TOKENS:
                emitted = list(res.tokens)
            elif res.outcome is RowOutcome.NO_OUTPUT:
                emitted = []
            else:
                continue  # a failed row commits nothing: its request ends
            future = list(job.prompt_ids) + job.output_ids + emitted
            # Kept positions: a verify row's anchor and accepted drafts (its emitted count),
            # every fed token otherwise (a prefill chunk, a decode row's one token).
            m = len(emitted) if row.num_drafts else len(row.tokens)
            nxt = future[row.start + 1:row.start + 1 + m]  # the next committed token of each
            if len(nxt) < m:
                continue  # nothing known after the chunk (a final chunk always samples)
            # Draft when the row's newest token follows: sampled now, or a Replay caught up
            # (its last chunk ends one behind the ledger, whose newest token is the anchor).
            drafting = bool(emitted) or (bool(job.output_ids) and row.end == job.num_tokens - 1)
            work.append((b, m, nxt, len(future), drafting))
        if not work:
            return
        width = max(m for _, m, _, _, _ in work)
        if any(rows[b].start + width > max_len for b, *_ in work):
            groups = [[w] for w in work]  # padding would leave the lane: one row at a time
        else:
            groups = [work]
        for group in groups:
            self._align_and_propose(rows, hidden, group, dev)

    def use_graphs(self, max_batch: int, scratch_lane: int) -> None:
        """Replay the draft pass from CUDA graphs (spec/mtp_graphs.py) for groups of up to
        `max_batch` rows and widths up to K+1, padding rows writing `scratch_lane`."""
        held = self._graphs
        if held is not None and held.max_batch == max_batch:
            return  # the same Program again (a wrapper installed over this proposer)
        self._graphs = MtpDraftGraphs(self.model, self.state, max_batch, self.k + 1, self.k,
                                      self.vocab_size, scratch_lane)

    def warm_graphs(self) -> int:
        """Capture every draft-pass graph now (the Program's warm-up); how many there are."""
        return 0 if self._graphs is None else self._graphs.capture_all()

    @property
    def graph_replays(self) -> int:
        """Draft passes replayed from a graph so far (0 without `use_graphs`)."""
        return 0 if self._graphs is None else self._graphs.replays

    def close(self) -> None:
        if self._graphs is not None:
            self._graphs.clear()

    def _align_and_propose(self, rows, hidden, group, dev) -> None:
        width = max(m for _, m, _, _, _ in group)
        n = len(group)
        h = torch.stack([hidden[b, :width] for b, *_ in group])  # [n, M, H]; M <= W
        nxt = torch.zeros(n, width, dtype=torch.int64)
        for j, (_, m, tokens, _, _) in enumerate(group):
            nxt[j, :m] = torch.tensor(tokens, dtype=torch.int64)
        starts = torch.tensor([rows[b].start for b, *_ in group], dtype=torch.int64)  # [n]
        positions = starts[:, None] + torch.arange(width)[None]  # [n, M]
        lanes = torch.tensor([rows[b].request.lane for b, *_ in group], dtype=torch.int64)
        last = torch.tensor([m - 1 for _, m, _, _, _ in group], dtype=torch.int64)[:, None]
        sampled = [j for j, w in enumerate(group) if w[4]]
        inputs = (h, nxt.to(dev), positions.to(dev), lanes.to(dev), last.to(dev))
        graphs = self._graphs
        if sampled and graphs is not None and graphs.fits(n, width, int(starts.max())):
            drafted = graphs.run(*inputs)
        else:
            # The last kept position of the furthest row; the chain stops where the lane ends.
            end = int((starts + last[:, 0]).max())
            steps = min(self.k, self.state.max_len - end) if sampled else 1
            kv_lens = [int(positions.max()) + 1] + [end + s + 1 for s in range(1, steps)]
            drafted = draft_chain(self.model, self.state, *inputs, self.vocab_size, kv_lens)
        if not sampled:
            return
        chains = drafted.tolist()  # one copy to the host for every row and step
        for j in sampled:
            b, _, _, length, _ = group[j]
            self._drafts[rows[b].request.lane] = (length, chains[j])
