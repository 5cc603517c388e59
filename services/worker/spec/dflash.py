"""DFlash / DFlash2 proposer: a draft model conditioned on the target's hidden states
(models/dflash.py) drafts K tokens in one non-causal pass over `[anchor, MASK x K]`.

After every step the Program hands this proposer the target features (the outputs of the draft's
`target_layer_ids`, concatenated) of the step's fed tokens and each row's result (`after_step`):

1. context: the features of the positions the commit keeps (a prefill chunk's tokens, a decode or
   verify row's anchor and accepted drafts) become K/V in every draft layer's per-lane context
   cache; context past the committed frontier (rejected drafts, aborted rounds) lies beyond what
   the next block reads and is overwritten first, so the cache is always cropped to the accepted
   prefix;
2. block: the anchor (the row's newest token) and K mask tokens at the following positions, one
   pass; DFlash drafts are the argmax of the target head (one-hot q); DFlash2 walks the top-16
   candidates of each slot with its selector, greedily at T = 0, sampled at T > 0 (RNG purpose
   DRAFT at each draft's output position) with the real q over the 16 kept for acceptance.

Drafts are kept per lane with the committed length they continue (as mtp.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels import rng
from services.worker.program.batch import BatchRow, RowOutcome, RowResult
from services.worker.spec.drafter import Proposal


class DFlashProposer:
    """`propose(job, k)` -> Proposal; `after_step(rows, feats, results)` (see the module
    docstring). `target`: the dense target (its embedding and head are the draft's)."""

    def __init__(self, target, draft, lanes: int, max_len: int, k: int, vocab_size: int,
                 *, dtype: torch.dtype, device: torch.device) -> None:
        self.target = target
        self.draft = draft
        self.config = draft.config
        self.k = min(k, self.config.block_size - 1)
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.cache = draft.new_cache(lanes, max_len, dtype=dtype, device=device)
        self.tap = tuple(self.config.target_layer_ids)
        self._drafts: dict[int, tuple[int, Proposal]] = {}  # lane -> (committed length, drafts)

    def propose(self, job, k: int) -> Proposal | list[int]:
        entry = self._drafts.get(job.lane)
        if entry is None or entry[0] != job.num_tokens or k <= 0:
            return []
        p = entry[1]
        if p.q_ids is None:
            return p.tokens[:k]
        return Proposal(p.tokens[:k], p.q_ids[:k], p.q_probs[:k])

    @torch.inference_mode()
    def after_step(self, rows: Sequence[BatchRow], feats: torch.Tensor,
                   results: Sequence[RowResult]) -> None:
        """feats: [n, W, n_layers * H] target features of the step's fed tokens."""
        dev = feats.device
        work = []  # (batch index, kept positions m, committed length after, anchor or None)
        for b, (row, res) in enumerate(zip(rows, results)):
            job = row.request
            self._drafts.pop(job.lane, None)
            if res.outcome is RowOutcome.TOKENS:
                emitted = list(res.tokens)
            elif res.outcome is RowOutcome.NO_OUTPUT:
                emitted = []
            else:
                continue  # a failed row commits nothing: its request ends
            m = len(emitted) if row.num_drafts else len(row.tokens)
            anchor = emitted[-1] if emitted else None
            if anchor is None and job.output_ids and row.end == job.num_tokens - 1:
                anchor = job.output_ids[-1]  # a Replay caught up: its newest token follows
            work.append((b, m, job.num_tokens + len(emitted), anchor))
        if not work:
            return
        for b, m, _, _ in work:  # context: the kept positions' features, one row at a time
            row = rows[b]
            positions = torch.arange(row.start, row.start + m, device=dev)[None]  # [1, m]
            lane = torch.tensor([row.request.lane], device=dev)
            self.draft.write_context(feats[b:b + 1, :m], positions, self.cache, lane)
        sampled = [(b, m, length, anchor) for b, m, length, anchor in work if anchor is not None]
        if sampled and self.k >= 1:
            self._propose(rows, sampled, dev)

    def _propose(self, rows, sampled, dev) -> None:
        # sampled: (batch index, kept positions m, committed length after, anchor)
        k, n = self.k, len(sampled)
        anchors = torch.tensor([a for *_, a in sampled], dtype=torch.int64, device=dev)  # [n]
        ids = torch.full((n, k + 1), self.config.mask_token_id, dtype=torch.int64, device=dev)
        ids[:, 0] = anchors
        p = torch.tensor([rows[b].start + m for b, m, _, _ in sampled], dtype=torch.int64,
                         device=dev)  # [n] the anchor's position
        positions = p[:, None] + torch.arange(k + 1, device=dev)[None]  # [n, K+1]
        lanes = torch.tensor([rows[b].request.lane for b, *_ in sampled], device=dev)
        embedded = self.target.model.embed_tokens(ids)  # [n, K+1, H]
        hidden = self.draft.block(embedded, positions, self.cache, lanes, p)[:, 1:]  # [n, K, H]
        z = self.draft.logits(hidden, self.target.output_weight)[..., :self.vocab_size]
        if not self.config.dflash2:
            tokens = z.argmax(dim=-1)  # [n, K] greedy, one-hot q
            for j, (b, _, length, _) in enumerate(sampled):
                self._drafts[rows[b].request.lane] = (length, Proposal(tokens[j].tolist()))
            return
        jobs = [rows[b].request for b, *_ in sampled]
        temperature = torch.tensor([job.sampling.temperature for job in jobs],
                                   dtype=torch.float32, device=dev)
        seed = torch.tensor([job.seed for job in jobs], dtype=torch.int64, device=dev)
        # The j-th draft is output token (committed after the step) + j.
        out_pos = torch.tensor([job.num_output_tokens + (length - job.num_tokens)
                                for job, (_, _, length, _) in zip(jobs, sampled)],
                               dtype=torch.int64, device=dev)[:, None] + torch.arange(k, device=dev)
        u = rng.uniform(seed[:, None].expand(-1, k), out_pos, rng.Purpose.DRAFT)  # [n, K]
        tokens, cand, q = self.draft.select(hidden, z, anchors, temperature, u)
        for j, (b, _, length, _) in enumerate(sampled):
            sampled_row = float(temperature[j]) > 0
            self._drafts[rows[b].request.lane] = (length, Proposal(
                tokens[j].tolist(), cand[j] if sampled_row else None,
                q[j].float() if sampled_row else None))
