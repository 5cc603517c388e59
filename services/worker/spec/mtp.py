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
   same function eagerly. The pass is launched after the step and its drafts are read by the next
   round's `propose`, so on CUDA it runs while the host commits the step.

Drafts are kept per lane with the committed length they continue; a round that commits something
else (an aborted round, a failed row, a pause) simply finds no matching drafts and decodes
ordinarily. MTP KV written past the committed frontier (draft steps, aborted rounds) is rewritten
by the next alignment before anything reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from services.worker.program.batch import PendingBatch, RowOutcome
from services.worker.program.buckets import plan_widths, prefill_width, prefill_widths
from services.worker.spec.mtp_graphs import MtpDraftGraphs, draft_chain
from services.worker.spec.proposer import FINAL, HostProposer


class MtpProposer(HostProposer):
    """Drafts from the model's MTP module (`model.mtp_forward`), `k` per round (>= 1), on the
    host route (spec/proposer.py), reading the target's final hidden states. Raises ValueError
    when the model has no MTP module."""

    reads = FINAL

    def __init__(self, model, state, k: int, vocab_size: int,
                 draft_vocab: int | None = None) -> None:
        if getattr(model, "mtp", None) is None or getattr(state, "mtp_layer", None) is None:
            raise ValueError("mtp: the model (or its state) has no MTP module")
        super().__init__(k)
        self.model = model
        self.state = state
        # Drafts are chosen among the first `draft_vocab` token ids where one is set, and the LM
        # head then computes those rows only: the head (vocab x hidden) is most of a draft
        # step's bytes (~2 GB of ~2.5 on Qwen3.5-9B). A BPE vocabulary's ids rise with merge
        # order, so its leading ids are its most frequent tokens; a target token outside them
        # is never drafted (fewer drafts accepted, the output unchanged: drafts are proposals).
        self.vocab_size = vocab_size if draft_vocab is None else min(vocab_size, draft_vocab)
        self.head_rows = None if draft_vocab is None else self.vocab_size
        self._drafts: dict[int, tuple[int, list[int]]] = {}  # lane -> (committed length, drafts)
        self._graphs: MtpDraftGraphs | None = None  # `use_graphs`: the draft pass replayed
        # Alignments of prefill chunks at the Program's warmed widths (program/buckets.py), on
        # CUDA, where each new width would compile kernels; the CPU compiles nothing.
        self.bucketed = next(model.parameters()).device.type == "cuda"
        self.widths = prefill_widths(state.max_len, state.max_len)
        self.lane_end_rows = 0  # alignments split into pieces at a lane's end (cumulative)
        # Draft passes launched, not read yet: (drafts [n, k] on the device, (lane, committed
        # length, row) of each drafting row); and the host's wait reading the last ones.
        self._launched: list[tuple[torch.Tensor, list[tuple[int, int, int]]]] = []
        self._waited = 0.0

    def propose(self, job, k: int) -> list[int]:
        """The drafts proposed for `job`'s committed output, at most k; [] when none match."""
        self._materialize()
        entry = self._drafts.get(job.lane)
        if entry is None or entry[0] != job.num_tokens or k <= 0:
            return []
        return entry[1][:k]

    def after_step(self, pending: PendingBatch, hidden: torch.Tensor | None) -> float:
        """hidden: [n, W, H] target hidden states of the step's rows (row b's fed tokens at
        [b, :len(tokens)]); pending: the step's per-row results (nothing is committed yet).
        Launches the draft pass and returns without reading its drafts: on CUDA it runs while
        the host commits the step, and the next round's `propose` reads them (one copy). The
        seconds returned are exposed draft time: launching this pass, and the last read's wait."""
        start = time.perf_counter()
        self._align(pending.batch.rows, hidden, pending.results)
        waited, self._waited = self._waited, 0.0
        return time.perf_counter() - start + waited

    def _materialize(self) -> None:
        # The launched draft passes' drafts to the host (the host waits for them here).
        if not self._launched:
            return
        start = time.perf_counter()
        for drafted, entries in self._launched:
            chains = drafted.tolist()
            for lane, length, j in entries:
                self._drafts[lane] = (length, chains[j])
        self._launched.clear()
        self._waited += time.perf_counter() - start

    @torch.inference_mode()
    def _align(self, rows, hidden: torch.Tensor, results) -> None:
        self._materialize()  # drafts of an earlier step nobody asked for: before the pops below
        dev = hidden.device
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
        if work:
            self._align_and_propose(rows, hidden, work, dev)

    def use_graphs(self, max_batch: int, scratch_lane: int) -> None:
        """Replay the draft pass from CUDA graphs (spec/mtp_graphs.py) for groups of up to
        `max_batch` rows and widths up to K+1, padding rows writing `scratch_lane`."""
        held = self._graphs
        if held is not None and held.max_batch == max_batch:
            return  # the same Program again (a wrapper installed over this proposer)
        self._graphs = MtpDraftGraphs(self.model, self.state, max_batch, self.k + 1, self.k,
                                      self.vocab_size, scratch_lane, self.head_rows)

    def warm_graphs(self) -> int:
        """Capture every draft-pass graph now (the Program's warm-up); how many there are."""
        return 0 if self._graphs is None else self._graphs.capture_all()

    @property
    def graph_replays(self) -> int:
        """Draft passes replayed from a graph so far (0 without `use_graphs`)."""
        return 0 if self._graphs is None else self._graphs.replays

    @property
    def graph_captures(self) -> int:
        """Draft-pass graphs captured so far (0 without `use_graphs`)."""
        return 0 if self._graphs is None else self._graphs.captures

    def close(self) -> None:
        if self._graphs is not None:
            self._graphs.clear()

    def warm_prefill(self, shapes) -> int:
        """Run the eager alignment (and its k - 1 steps) at every prefill shape (rows, width,
        kv_len) the Program's warm-up visits, on the free lanes from position kv_len - width, so
        a prompt's alignment compiles nothing on the request path; how many passes ran."""
        dev = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        hidden_size = self.model.config.hidden_size
        for rows, width, kv_len in shapes:
            steps = max(1, min(self.k, self.state.max_len - kv_len + 1))
            h = torch.zeros(rows, width, hidden_size, dtype=dtype, device=dev)
            tokens = torch.zeros(rows, width, dtype=torch.int64, device=dev)
            positions = (kv_len - width + torch.arange(width, device=dev))[None].repeat(rows, 1)
            lanes = torch.arange(rows, dtype=torch.int64, device=dev)
            last = torch.full((rows, 1), width - 1, dtype=torch.int64, device=dev)
            draft_chain(self.model, self.state, h, tokens, positions, lanes, last,
                        self.vocab_size, [kv_len + s for s in range(steps)], self.head_rows)
        return len(shapes)

    def _align_and_propose(self, rows, hidden, group, dev) -> None:
        self._align_rows([_Align(rows[b].start, rows[b].request.lane, hidden[b, :m], tokens,
                                 length, drafting)
                          for b, m, tokens, length, drafting in group], dev)

    def _align_rows(self, group: list["_Align"], dev, pad: bool = True) -> None:
        width = max(len(a.tokens) for a in group)
        n = len(group)
        starts = torch.tensor([a.start for a in group], dtype=torch.int64)  # [n]
        # The width the alignment runs at: a prefill chunk's padded to the Program's warmed
        # widths (program/buckets.py) on CUDA, where each new width would compile kernels.
        padded = prefill_width(width) if self.bucketed and pad else width
        if int(starts.max()) + padded > self.state.max_len:  # padding would leave a lane
            if n > 1:
                for one in group:
                    self._align_rows([one], dev)
            else:
                self._align_pieces(group[0], dev)
            return
        h = group[0].hidden.new_zeros(n, padded, group[0].hidden.shape[-1])  # [n, P, H]
        nxt = torch.zeros(n, padded, dtype=torch.int64)
        for j, a in enumerate(group):
            h[j, :len(a.tokens)] = a.hidden
            nxt[j, :len(a.tokens)] = torch.tensor(a.tokens, dtype=torch.int64)
        positions = starts[:, None] + torch.arange(padded)[None]  # [n, P]
        lanes = torch.tensor([a.lane for a in group], dtype=torch.int64)
        last = torch.tensor([len(a.tokens) - 1 for a in group], dtype=torch.int64)[:, None]
        sampled = [j for j, a in enumerate(group) if a.drafting]
        inputs = (h, nxt.to(dev), positions.to(dev), lanes.to(dev), last.to(dev))
        graphs = self._graphs
        replayed = bool(sampled) and graphs is not None and graphs.fits(n, padded,
                                                                        int(starts.max()))
        if replayed:
            drafted = graphs.run(*inputs)
        else:
            # The last kept position of the furthest row; the chain stops where the lane ends.
            end = int((starts + last[:, 0]).max())
            steps = min(self.k, self.state.max_len - end) if sampled else 1
            kv_lens = [int(positions.max()) + 1] + [end + s + 1 for s in range(1, steps)]
            drafted = draft_chain(self.model, self.state, *inputs, self.vocab_size, kv_lens,
                                  self.head_rows)
        if not sampled:
            return
        # Read by the next `propose` (one copy for every row and step); a graph's static output
        # is copied first, since another group of this step may replay the same graph.
        owned = drafted.clone() if replayed else drafted
        self._launched.append((owned, [(group[j].lane, group[j].length, j) for j in sampled]))

    def _align_pieces(self, a: "_Align", dev) -> None:
        # One row whose padded alignment would leave its lane: consecutive alignments of warmed
        # widths inside it (program/buckets.py `plan_widths`, as the target's prefill there),
        # the last one drafting; each piece's MTP KV is written before the next one reads it.
        plan = plan_widths(a.start, len(a.tokens), self.state.max_len, self.widths)
        if plan is None or len(plan) == 1:  # nothing warmed fits: the row's own width
            self._align_rows([a], dev, pad=False)
            return
        self.lane_end_rows += 1
        offset = 0
        for i, (count, _) in enumerate(plan):
            last = i + 1 == len(plan)
            self._align_rows([_Align(a.start + offset, a.lane, a.hidden[offset:offset + count],
                                     a.tokens[offset:offset + count], a.length,
                                     a.drafting and last)], dev)
            offset += count


@dataclass(frozen=True)
class _Align:
    """One row's alignment: its kept positions from `start` in `lane`, their target hidden
    states [m, H] and next committed tokens (m), the committed length after them, and whether
    the row drafts."""

    start: int
    lane: int
    hidden: torch.Tensor
    tokens: list[int]
    length: int
    drafting: bool
