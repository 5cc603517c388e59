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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels.logprobs import processed_logprobs, raw_logprobs, stable_top
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
    """Reads `LogprobSite`s for one Program. `mode`: "processed" or "raw" (see the module
    docstring); raises ValueError for another."""

    def __init__(self, domain: TokenDomain, device: torch.device, mode: str = "processed") -> None:
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs mode must be one of {', '.join(LOGPROBS_MODES)}, got "
                             f"{mode!r}")
        self.domain = domain
        self.mode = mode
        never = sorted(set(range(len(domain.token_bytes), domain.size)) | set(domain.never_ids))
        self._never = torch.tensor(never, dtype=torch.int64, device=device) if never else None
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)

    def read(self, site: LogprobSite) -> TokenLogprob:
        """The token's entry with `site.request.logprobs` alternatives."""
        lp = self.distribution(site)
        n = site.request.logprobs or 0
        top: tuple[TopLogprob, ...] = ()
        if lp is None:  # no finite legal value: the sampler failed the row before this
            return TokenLogprob(site.token, self._bytes(site.token), float("-inf"))
        chosen = float(lp[site.token])
        if n:
            values, ids = stable_top(lp, n)
            top = tuple(TopLogprob(i, self._bytes(i), v)
                        for i, v in zip(ids.tolist(), values.tolist()) if v != float("-inf"))
        return TokenLogprob(site.token, self._bytes(site.token), chosen, top)

    def distribution(self, site: LogprobSite) -> torch.Tensor | None:
        """log p [V] of the site's distribution (see the module docstring)."""
        v = self.domain.size
        z = site.logits[:v].float()
        if self._never is not None:
            z = z.index_fill(0, self._never, float("-inf"))
        if self.mode == "raw":
            return raw_logprobs(z)
        job = site.request
        if job.penalized():
            z = self._penalized(z, job, site.before)
        if site.mask is not None:
            words = site.mask.to(z.device, non_blocking=True)
            legal = ((words[:, None] >> self._shifts) & 1).view(-1)[:v].bool()  # [V]
            z = torch.where(legal, z, float("-inf"))
        s = job.sampling
        return processed_logprobs(z, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                  min_p=s.min_p)

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
