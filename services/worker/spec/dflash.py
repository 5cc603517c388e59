"""DFlash / DFlash2 proposer: a draft model conditioned on the target's hidden states
(models/dflash.py) drafts K tokens in one non-causal pass over `[anchor, MASK x K]`.

Two phases per round (design document, "Forward and Finish"):

- context (after every step, `after_step`): the target features (the outputs of the draft's
  `target_layer_ids`, concatenated) of the positions the commit keeps (a prefill chunk's tokens,
  a decode or verify row's anchor and accepted drafts) become K/V in every draft layer's per-lane
  context cache. Context past the committed frontier (rejected drafts, aborted rounds) lies
  beyond what the next block reads and is overwritten first: the cache is always cropped to the
  accepted prefix;
- draft (the next round's Forward, `block_drafts`): the anchor (the row's newest committed
  token, the first token the verify round feeds) and K mask tokens at the following positions,
  one pass on the device, no host synchronisation. DFlash drafts are the argmax of the target head
  (one-hot q); DFlash2 walks the top-16 candidates of each slot with its selector, greedily at
  T = 0, sampled at T > 0 (RNG purpose DRAFT at each draft's output position) with the real q over
  the 16 kept for acceptance. The Program copies the ids to the host, records the ready event
  and runs the target forward over `[anchor, drafts]` before the host waits for the ids
  (`block_drafts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from kernels import rng
from services.worker.program.batch import BatchRow, PendingBatch, RowOutcome, StepBatch
from services.worker.spec.proposer import draft_limit


class DFlashProposer:
    """The device route (spec/proposer.py): `attach` sets each row's draft limit, the Program's
    round drafts through `block_drafts` (captured) or `eager_drafts`, and `after_step` writes
    the tapped target features into the draft's context cache (see the module docstring).
    `target`: the dense or hybrid Qwen3.5 target (its embedding and head are the draft's; its
    layers `config.target_layer_ids`, of any kind, are tapped); `draft`: the draft model;
    `lanes`, `max_len`: the target state's."""

    route = "device"

    def __init__(self, target, draft, lanes: int, max_len: int, k: int, vocab_size: int,
                 *, dtype: torch.dtype, device: torch.device) -> None:
        self.target = target
        self.draft = draft
        self.config = draft.config
        self.k = min(k, self.config.block_size - 1)
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.cache = draft.new_cache(lanes, max_len, dtype=dtype, device=device)
        self.reads = tuple(self.config.target_layer_ids)  # the target layers whose outputs it reads

    def attach(self, batch: StepBatch, max_len: int) -> StepBatch:
        """Each row's draft limit; the Program drafts them in the round's Forward phase."""
        rows = tuple(replace(row, draft_limit=draft_limit(row, self.k, max_len))
                     for row in batch.rows)
        out = StepBatch(rows)
        return out if out.has_drafts else batch

    @torch.inference_mode()
    def after_step(self, pending: PendingBatch, feats: torch.Tensor | None) -> float:
        """feats: [n, W, n_layers * H] target features of the step's fed tokens. Queued on the
        device: the host waits for nothing here."""
        dev = feats.device
        for b, (row, res) in enumerate(zip(pending.batch.rows, pending.results)):
            if res.outcome is RowOutcome.TOKENS:
                m = len(res.tokens) if row.num_drafts else len(row.tokens)
            elif res.outcome is RowOutcome.NO_OUTPUT:
                m = len(row.tokens)
            else:
                continue  # a failed row commits nothing: its request ends
            positions = torch.arange(row.start, row.start + m, device=dev)[None]  # [1, m]
            lane = torch.tensor([row.request.lane], device=dev)
            self.draft.write_context(feats[b:b + 1, :m], positions, self.cache, lane)
        return 0.0

    def eager_drafts(self, rows: Sequence[BatchRow], anchors: torch.Tensor, starts: torch.Tensor,
              lanes: torch.Tensor):
        """The eager block of a round's rows (`block_drafts`); DFlash2 samples its drafts at
        the rows' temperatures when one of them samples."""
        dev = anchors.device
        if not self.config.dflash2 or not any(r.request.sampling.temperature > 0 for r in rows):
            return self.block_drafts(anchors, starts, lanes)
        return self.block_drafts(
            anchors, starts, lanes,
            temperature=torch.tensor([r.request.sampling.temperature for r in rows],
                                     dtype=torch.float32).to(dev),
            seed=torch.tensor([r.request.seed for r in rows]).to(dev),
            out_pos=torch.tensor([r.request.num_output_tokens for r in rows]).to(dev))

    def block_drafts(self, anchors: torch.Tensor, starts: torch.Tensor, lanes: torch.Tensor, *,
              kv_len: int | None = None, temperature: torch.Tensor | None = None,
              seed: torch.Tensor | None = None, out_pos: torch.Tensor | None = None):
        """One block per row on the device. anchors, starts (the anchor's lane position), lanes:
        [n] int64 device tensors; for DFlash2 at T > 0 also temperature [n] float32, seed [n]
        int64 and out_pos [n] (the first draft's output position). Returns (ids [n, K] int64,
        q_ids [n, K, Q] int32 or None, q_probs [n, K, Q] float32 or None)."""
        k, dev = self.k, anchors.device
        n = anchors.shape[0]
        ids = torch.full((n, k + 1), self.config.mask_token_id, dtype=torch.int64, device=dev)
        ids[:, 0] = anchors
        positions = starts[:, None] + torch.arange(k + 1, device=dev)[None]  # [n, K+1]
        embedded = self.target.model.embed_tokens(ids)  # [n, K+1, H]
        hidden = self.draft.block(embedded, positions, self.cache, lanes, starts,
                                        kv_len=kv_len)[:, 1:]  # [n, K, H]
        z = self.draft.logits(hidden, self.target.output_weight)[..., :self.vocab_size]
        if not self.config.dflash2:
            return z.argmax(dim=-1), None, None  # greedy, one-hot q
        if temperature is None:
            temperature = torch.zeros(n, dtype=torch.float32, device=dev)
            u = torch.zeros(n, k, dtype=torch.float32, device=dev)
        else:
            pos = out_pos[:, None] + torch.arange(k, device=dev)[None]
            u = rng.uniform(seed[:, None].expand(-1, k), pos, rng.Purpose.DRAFT)  # [n, K]
        tokens, cand, q = self.draft.select(hidden, z, anchors, temperature, u)
        return tokens, cand, q
