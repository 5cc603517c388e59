"""The verify stage of a speculative round: K+1 masks along each row's draft chain, then acceptance.

A verification round feeds, per row b, its anchor (the newest committed output token) and its
n_b <= K drafts; the target forward gives the logits at the K+1 positions of
`[anchor, d_0, ..., d_{K-1}]` (positions past n_b are padding). Then, on the worker thread:

1. masks: each constrained row's OutputSession looks ahead along its own chain (design document
   section 8: Ready, DeadEnd, Unreachable; the first illegal draft's position is Ready with the
   legal prefix's mask; the position after an accepted EOS is Unreachable) into the Program's
   `[B, K+1, ceil(V/32)]` buffer and rolls back to its baseline; unconstrained rows get the
   disabled descriptor and no mask;
2. acceptance (`kernels.acceptance`, plain-torch reference on the CPU): greedy rows accept a draft
   iff it is the argmax over the legal candidates (never the unconstrained argmax), sampled rows
   accept d with min(1, p(d)/q(d)) and draw the correction from the residual, the bonus from p of
   the full prefix; one-hot q for n-gram, MTP and DFlash, the drafter's sparse q for DFlash2;
3. per-row results: the emitted tokens (accepted drafts + correction or bonus) for the commit
   path, or a dead end / non-finite failure that commits zero tokens while the other rows commit.

Nothing is committed here: the commit path previews the tokens, the Program keeps the KV of the
anchor and the accepted prefix (later positions lie past the frontier and are overwritten before
being read; recurrent state through the model state's commit), then the sessions confirm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from kernels.acceptance_contract import PositionState, speculative_penalties
from kernels.sampling_contract import SampleStatus
from services.worker.output.positions import LookaheadResult
from services.worker.program.batch import BatchRow, RowOutcome, RowResult
from services.worker.program.logprobs import LogprobReader, LogprobSite
from services.worker.program.masks import MaskBuffers
from services.worker.program.sampling import Sampler
from shared.errors import InternalError
from shared.frontends.token_domain import TokenDomain


class Verifier:
    """Masks and acceptance of one round (see the module docstring). `max_drafts`: K >= 1."""

    def __init__(self, domain: TokenDomain, device: torch.device, masks: MaskBuffers,
                 sampler: Sampler, max_drafts: int, logprobs: LogprobReader | None = None) -> None:
        if max_drafts < 1:
            raise ValueError(f"max_drafts must be >= 1 for verification, got {max_drafts}")
        self.domain = domain
        self.device = device
        self.masks = masks
        self.sampler = sampler
        self.k = max_drafts
        self.logprobs = logprobs if logprobs is not None else LogprobReader(domain, device)
        self.cuda = device.type == "cuda"
        eos = sorted(domain.eos_ids)
        self._eos = torch.tensor(eos, dtype=torch.int32, device=device) if eos else None
        if self.cuda:
            from kernels.acceptance import accept_drafts
        else:
            from kernels.acceptance_ref import accept_drafts_ref as accept_drafts
        self._accept = accept_drafts

    def fill(self, rows: Sequence[BatchRow]) -> tuple[torch.Tensor, list[LookaheadResult | None]]:
        """The K+1 position states [m, K+1] int32 (host) of the round's rows, mask rows written
        into the host buffer (compact row j at `masks.host[j]`). Raises what lookahead raises."""
        k = self.k
        states = torch.full((len(rows), k + 1), int(PositionState.DISABLED), dtype=torch.int32)
        looks: list[LookaheadResult | None] = []
        for j, row in enumerate(rows):
            session = row.request.session
            if not session.constrained:
                looks.append(None)
                continue
            drafts = row.tokens[1:]
            look = session.lookahead(drafts, self.masks.host[j],
                                     position=row.request.num_output_tokens)
            states[j, :len(drafts) + 1] = torch.tensor([int(s) for s in look.states],
                                                       dtype=torch.int32)
            states[j, len(drafts) + 1:] = int(PositionState.UNREACHABLE)
            looks.append(look)
        return states, looks

    def _logprobs(self, rows: Sequence[BatchRow], logits: torch.Tensor, looks,
                  results: list[RowResult]) -> list[RowResult]:
        # Token i of a round was chosen at verify position i (the anchor's logits for the
        # first): that position's logits, its lookahead mask (Ready along the accepted chain)
        # and the penalty history of the tokens before it. One read for every row that asked.
        sites, owners = [], []
        for j, (row, res) in enumerate(zip(rows, results)):
            if row.request.logprobs is None or res.outcome is not RowOutcome.TOKENS:
                continue
            for i, t in enumerate(res.tokens):
                sites.append(LogprobSite(row.request, logits[j, i], self.masks.host[j, i]
                                         if looks[j] is not None else None, t, res.tokens[:i]))
                owners.append(j)
        entries: dict[int, list] = {}
        for j, entry in zip(owners, self.logprobs.read(sites)):
            entries.setdefault(j, []).append(entry)
        return [replace(res, logprobs=tuple(entries[j])) if j in entries else res
                for j, res in enumerate(results)]

    def _sparse_q(self, rows: Sequence[BatchRow], drafts: torch.Tensor):
        """(q_ids, q_probs) [m, K, Q] when some row's drafter has a real q (DFlash2 at T > 0);
        the other rows' one-hot q as the same sparse form. (None, None): one-hot q for all."""
        if not any(r.draft_q is not None for r in rows):
            return None, None
        width = max(r.draft_q[0].shape[1] for r in rows if r.draft_q is not None)
        m, k = drafts.shape
        ids = torch.full((m, k, width), -1, dtype=torch.int32)
        probs = torch.zeros((m, k, width), dtype=torch.float32)
        for j, row in enumerate(rows):
            n = row.num_drafts
            if row.draft_q is None:
                ids[j, :n, 0] = drafts[j, :n].to(torch.int32)
                probs[j, :n, 0] = 1.0
            else:
                qi, qp = row.draft_q
                ids[j, :n, :qi.shape[1]] = qi[:n].cpu()
                probs[j, :n, :qp.shape[1]] = qp[:n].cpu()
        return ids.to(self.device), probs.to(self.device)

    def warm(self, sizes: Sequence[int], kinds: Sequence, dtype: torch.dtype) -> int:
        """Run acceptance once per batch size in `sizes`, sampling kind (`kinds`: objects with
        the Request's `sampling`, `seed`, `num_output_tokens` a Sampler reads) and mask (none, and
        every position Ready under an all-empty mask): the kernels compile at the warm-up, not in
        a request's first round. Returns how many runs."""
        k, runs = self.k, 0
        for rows in sizes:
            z = torch.zeros(rows * (k + 1), self.domain.size, dtype=dtype, device=self.device)
            drafts = torch.zeros(rows, k, dtype=torch.int64, device=self.device)
            num = torch.full((rows,), k, dtype=torch.int32, device=self.device)
            for kind in kinds:
                logits, params, width = self.sampler.inputs(z, [kind] * rows)
                for masked in (False, True):
                    state = PositionState.READY if masked else PositionState.DISABLED
                    states = torch.full((rows, k + 1), int(state), dtype=torch.int32,
                                        device=self.device)
                    mask = None
                    if masked:
                        self.masks.host[:rows].zero_()
                        mask, _ = self.masks.upload(rows)
                    self._accept(logits, params, drafts, num, states,
                                 vocab_size=self.domain.size, mask=mask, q_ids=None,
                                 q_probs=None, penalties=None, eos_ids=self._eos,
                                 candidate_width=width)
                    runs += 1
        return runs

    def verify(self, rows: Sequence[BatchRow], logits: torch.Tensor) -> list[RowResult]:
        """logits: [m, W, V'] target logits of the rows' W <= K+1 fed positions. Fills the masks
        (the forward may still run on the device meanwhile), runs acceptance and returns one
        RowResult per row."""
        m, width = logits.shape[:2]
        raw_logits = logits  # [m, W, V'] each committed token's own position, for logprobs
        k = self.k
        assert width <= k + 1 and m == len(rows) <= self.masks.host.shape[0], (logits.shape, k)
        states, looks = self.fill(rows)  # the CPU's lookahead while the forward runs
        if width < k + 1:  # positions past every row's n_b: finite filler the walk never reaches
            logits = torch.cat([logits, logits.new_zeros(m, k + 1 - width, logits.shape[2])], 1)
        requests = [r.request for r in rows]
        z, params, cand_width = self.sampler.inputs(logits.reshape(m * (k + 1), -1), requests)
        drafts = torch.zeros(m, k, dtype=torch.int64)  # [m, K]
        for j, row in enumerate(rows):
            drafts[j, :row.num_drafts] = torch.tensor(row.tokens[1:], dtype=torch.int64)
        num = torch.tensor([r.num_drafts for r in rows], dtype=torch.int32)  # [m]
        constrained = any(look is not None for look in looks)
        mask = None
        if constrained:
            mask, _ = self.masks.upload(m)  # [B, K+1, W] on the compute stream
        dev = self.device
        drafts_d = drafts.to(dev, non_blocking=self.cuda)
        base = self.sampler.penalties(requests)
        penalties = speculative_penalties(base, drafts_d) if base is not None else None
        q_ids, q_probs = self._sparse_q(rows, drafts)
        result = self._accept(z, params, drafts_d, num.to(dev, non_blocking=self.cuda),
                              states.to(dev, non_blocking=self.cuda), vocab_size=self.domain.size,
                              mask=mask, q_ids=q_ids, q_probs=q_probs, penalties=penalties,
                              eos_ids=self._eos, candidate_width=cand_width)
        # One copy to the host (it waits here) instead of one synchronising copy per field.
        packed = torch.cat([result.tokens, torch.stack(
            [result.num_tokens, result.accepted, result.status, result.end], 1).long()], 1).cpu()
        tokens = packed[:, :k + 1]  # [m, K+1]
        count, accepted, status, end = packed[:, k + 1:].unbind(1)  # [m] each
        row_bytes = 4 * self.domain.mask_words * (k + 1) if self.cuda else 0
        out = []
        for j, row in enumerate(rows):
            look, st = looks[j], int(status[j])
            if st == SampleStatus.OK:
                n = int(count[j])
                out.append(RowResult(RowOutcome.TOKENS, tuple(tokens[j, :n].tolist()),
                                     mask_bytes=row_bytes if look is not None else 0,
                                     accepted_drafts=int(accepted[j])))
            elif st == SampleStatus.DEAD_END and look is not None \
                    and look.dead_end_at == int(end[j]):
                out.append(RowResult(RowOutcome.DEAD_END, error=look.dead_end_error()))
            else:
                position = row.request.num_output_tokens + int(end[j])
                what = "non-finite logits" if st == SampleStatus.NONFINITE else \
                    "an empty legal set on the device where the CPU mask said Ready"
                out.append(RowResult(RowOutcome.NONFINITE, error=InternalError(
                    f"verification found {what} at output position {position}")))
        return self._logprobs(rows, raw_logits, looks, out)
