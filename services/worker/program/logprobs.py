"""The log-probabilities a row asked for (`Request.logprobs`), read after its token is chosen.

Sampling is untouched: a step samples every row as it would anyway (the decode graph's sample
stages included), then this reads, for the rows that asked only, the logits the token was chosen
from. Mode "processed" (the default): the distribution the token was sampled from, the row's
penalties, its legal mask at that position (illegal ids are -inf and never listed) and its
sampling transforms applied (kernels/logprobs.py; a greedy row: the masked log-softmax at
temperature 1). Mode "raw": the model's own log-softmax, before penalties, mask and transforms.
A speculative round reads each committed token at its own verify position, with that position's
mask and the penalty history of the prefix before it, so the values equal plain decoding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels.logprobs import processed_logprobs, raw_logprobs, stable_top, untruncated_logprobs
from kernels.sampling_contract import PenaltyHistory, SamplingParams
from kernels.sampling_ref import penalized_logits
from shared.frontends.token_domain import TokenDomain
from shared.generation import TokenLogprob, TopLogprob

if TYPE_CHECKING:
    from services.worker.request import Request

LOGPROBS_MODES = ("processed", "raw")


@dataclass(frozen=True)
class LogprobSite:
    """One committed token to read: the logits it was chosen from, its mask row (host int32
    words, None when unconstrained) and the tokens before it in this round (drafts whose
    penalties its distribution saw)."""

    request: "Request"
    logits: torch.Tensor  # [V'] the row's logits at this position
    mask: torch.Tensor | None  # [ceil(V/32)] int32
    token: int
    before: tuple[int, ...] = ()


class LogprobReader:
    """Reads a step's `LogprobSite`s for one Program. `mode`: "processed" or "raw" (see the
    module docstring); raises ValueError for another."""

    def __init__(self, domain: TokenDomain, device: torch.device, mode: str = "processed") -> None:
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs mode must be one of {', '.join(LOGPROBS_MODES)}, got "
                             f"{mode!r}")
        self.domain = domain
        self.mode = mode
        never = sorted(set(range(len(domain.token_bytes), domain.size)) | set(domain.never_ids))
        self._never = torch.tensor(never, dtype=torch.int64, device=device) if never else None
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)

    def read(self, sites: Sequence[LogprobSite]) -> list[TokenLogprob]:
        """Each site's entry with its request's `logprobs` alternatives, read in one batch: one
        [R, V] pass for the rows without top-k / top-p truncation (greedy rows among them), a
        per-row pass for the truncated ones, one top-n selection and one copy to the host."""
        if not sites:
            return []
        lp = self.distributions(sites)  # [R, V]
        tokens = torch.tensor([s.token for s in sites], dtype=torch.int64, device=lp.device)
        chosen = lp.gather(1, tokens[:, None])[:, 0].tolist()
        n = max(s.request.logprobs or 0 for s in sites)
        values, ids = stable_top(lp, n) if n else (lp[:, :0], tokens[:, None][:, :0])
        values, ids = values.tolist(), ids.tolist()
        out = []
        for site, value, top_v, top_i in zip(sites, chosen, values, ids):
            k = site.request.logprobs or 0
            top = tuple(TopLogprob(i, self._bytes(i), v)
                        for i, v in zip(top_i[:k], top_v[:k]) if v != float("-inf"))
            out.append(TokenLogprob(site.token, self._bytes(site.token), value, top))
        return out

    def distributions(self, sites: Sequence[LogprobSite]) -> torch.Tensor:
        """log p [R, V] of the sites' distributions (see the module docstring); a row with no
        finite legal value (the sampler failed it) is all -inf."""
        v = self.domain.size
        z = torch.stack([s.logits[:v] for s in sites]).float()  # [R, V]
        if self._never is not None:
            z = z.index_fill(1, self._never, float("-inf"))
        if self.mode == "raw":
            return raw_logprobs(z)
        for r, site in enumerate(sites):
            if site.request.penalized():
                z[r] = self._penalized(z[r], site.request, site.before)
        masked = [r for r, site in enumerate(sites) if site.mask is not None]
        if masked:
            words = torch.stack([sites[r].mask for r in masked]).to(z.device)  # [M, W]
            legal = ((words[:, :, None] >> self._shifts) & 1).view(len(masked), -1)[:, :v]
            rows = torch.tensor(masked, dtype=torch.int64, device=z.device)
            z[rows] = torch.where(legal.bool(), z[rows], float("-inf"))
        params = [s.request.sampling for s in sites]
        greedy = [p.temperature == 0 for p in params]
        temperature = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                                   device=z.device)
        if any(not g and p.min_p > 0 for p, g in zip(params, greedy)):
            lp = untruncated_logprobs(z, temperature, torch.tensor(
                [0.0 if g else p.min_p for p, g in zip(params, greedy)], device=z.device))
        else:  # the same without a min-p cut: one log-softmax (a row of -inf stays -inf)
            lp = torch.log_softmax(z / temperature[:, None], 1)
            lp = torch.where(torch.isnan(lp), float("-inf"), lp)
        for r, (p, g) in enumerate(zip(params, greedy)):
            if not g and (p.top_k > 0 or p.top_p < 1):  # truncated: its own candidate walk
                row = processed_logprobs(z[r], temperature=p.temperature, top_k=p.top_k,
                                         top_p=p.top_p, min_p=p.min_p)
                lp[r] = float("-inf") if row is None else row
        return lp

    def _penalized(self, z: torch.Tensor, job: "Request", before: tuple[int, ...]):
        # The request's penalty history with this round's earlier tokens as output tokens.
        counts = dict(job.output_counts)
        for t in before:
            counts[t] = counts.get(t, 0) + 1
        if job.sampling.repetition_penalty != 1.0:
            for t in job.prompt_ids:
                counts.setdefault(t, 0)
        if not counts:
            return z
        s, dev = job.sampling, z.device
        params = SamplingParams.from_rows(
            1, repetition_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, device=dev)
        history = PenaltyHistory(torch.tensor([list(counts)], dtype=torch.int32, device=dev),
                                 torch.tensor([list(counts.values())], dtype=torch.int32,
                                              device=dev))
        return penalized_logits(z[None], self.domain.size, params, history)[0]

    def _bytes(self, token: int) -> bytes:
        table = self.domain.token_bytes
        return table[token] if token < len(table) else b""
