"""The sample stage of a step: the rows' sampling parameters and penalty history on the device,
then the masked sampling kernel (the mask applied before candidate selection).

Triton kernels on CUDA, their plain-torch reference on the CPU (kernels/sampling*.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kernels.sampling_contract import PenaltyHistory, SamplingParams
from shared.frontends.token_domain import TokenDomain

if TYPE_CHECKING:
    from services.worker.request import Request


class Sampler:
    """Samples one token per compact row: `sample(z, requests, mask, mask_row)`."""

    def __init__(self, domain: TokenDomain, device: torch.device) -> None:
        self.domain = domain
        self.device = device
        never = sorted(set(range(len(domain.token_bytes), domain.size)) | set(domain.never_ids))
        self._never = torch.tensor(never, dtype=torch.int64, device=device) if never else None
        if device.type == "cuda":
            from kernels.sampling import sample
        else:
            from kernels.sampling_ref import sample_reference as sample
        self._sample = sample

    def sample(self, z: torch.Tensor, requests: Sequence["Request"], mask: torch.Tensor | None,
               mask_row: torch.Tensor | None):
        """z: [m, V'] logits of the m sampled rows; mask: [B, K+1, W] int32 and mask_row: [m]
        (or None when no row is constrained). Returns the kernel's result (tokens, status)."""
        z, params, width = self.inputs(z, requests)
        return self._sample(z, params, vocab_size=self.domain.size, mask=mask, mask_row=mask_row,
                            penalties=self.penalties(requests), candidate_width=width)

    def inputs(self, z: torch.Tensor, requests: Sequence["Request"]):
        """(logits readable by the kernels with never-generable ids at -inf, the rows'
        SamplingParams at their committed output positions, the candidate width). z: [N, V']
        with N a multiple of len(requests) (a speculative round: K+1 positions per row)."""
        if z.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            z = z.float()  # the sampling kernels read float32 / half logits
        if self._never is not None:
            z = z.index_fill(1, self._never, float("-inf"))  # never-generable ids
        s = [r.sampling for r in requests]
        params = SamplingParams.from_rows(
            len(requests), temperature=[p.temperature for p in s], top_k=[p.top_k for p in s],
            top_p=[p.top_p for p in s], min_p=[p.min_p for p in s],
            repetition_penalty=[p.repetition_penalty for p in s],
            presence_penalty=[p.presence_penalty for p in s],
            frequency_penalty=[p.frequency_penalty for p in s],
            seed=[r.seed for r in requests], position=[r.num_output_tokens for r in requests],
            device=self.device)
        if all(p.temperature == 0 for p in s):
            width = 1
        elif all(p.top_k > 0 for p in s):
            width = min(max(p.top_k for p in s), self.domain.size)
        else:
            width = None
        return z, params, width

    def penalties(self, requests: Sequence["Request"]) -> PenaltyHistory | None:
        if not any(r.penalized() for r in requests):
            return None
        histories = [r.penalty_history() if r.penalized() else ([], []) for r in requests]
        width = max(1, max(len(ids) for ids, _ in histories))
        ids = torch.full((len(requests), width), -1, dtype=torch.int32)  # [m, L]
        counts = torch.zeros((len(requests), width), dtype=torch.int32)  # [m, L]
        for j, (h_ids, h_counts) in enumerate(histories):
            ids[j, :len(h_ids)] = torch.tensor(h_ids, dtype=torch.int32)
            counts[j, :len(h_counts)] = torch.tensor(h_counts, dtype=torch.int32)
        return PenaltyHistory(ids.to(self.device), counts.to(self.device))
