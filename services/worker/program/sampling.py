"""The sample stage of a step: the rows' sampling parameters and penalty history on the device,
then the masked sampling kernel (the mask applied before candidate selection).

A batch whose rows are all greedy takes the masked argmax (kernels/sampling_greedy.py: no sort,
no top-k, no parameters unless penalized) on every device; on CUDA without penalties it is one
fused Triton pass over the logits (`sample_greedy_fast`) that reads a static packed mask of the
generable ids, built once, instead of a copy of the logits with never-generable ids at -inf.
Otherwise the Triton kernels on CUDA, their plain-torch reference on the CPU (kernels/sampling*.py).
The parameters are built and uploaded once per batch membership (the same requests in the same
order); a step of an unchanged batch only uploads the output positions (the RNG key), from a pinned
buffer without blocking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kernels.sampling_contract import PenaltyHistory, SamplingParams
from kernels.sampling_greedy import generable_words, sample_greedy, sample_greedy_fast
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
        # the same ids as a static packed mask [ceil(V/32)] int32 of what may be chosen: the fused
        # greedy kernel reads it instead of `_generable`'s copy of the logits (None: all generable)
        self._generable_mask = generable_words(domain.size, never, device) if never else None
        self._fused_greedy = device.type == "cuda"  # the CPU keeps the torch path
        if device.type == "cuda":
            from kernels.sampling import sample
        else:
            from kernels.sampling_ref import sample_reference as sample
        self._sample = sample
        self._members: list = []  # the requests whose parameters `_static` holds, in order
        self._static: SamplingParams | None = None
        self._host_position = torch.zeros(0, dtype=torch.int64)

    def sample(self, z: torch.Tensor, requests: Sequence["Request"], mask: torch.Tensor | None,
               mask_row: torch.Tensor | None):
        """z: [m, V'] logits of the m sampled rows; mask: [B, K+1, W] int32 and mask_row: [m]
        (or None when no row is constrained). Returns the kernel's result (tokens, status)."""
        penalties = self.penalties(requests)
        if all(r.sampling.temperature == 0 for r in requests):
            if self._fused_greedy and penalties is None:
                return sample_greedy_fast(z, vocab_size=self.domain.size, mask=mask,
                                          mask_row=mask_row, generable=self._generable_mask)
            return sample_greedy(self._generable(z), vocab_size=self.domain.size, mask=mask,
                                 mask_row=mask_row, penalties=penalties,
                                 params=None if penalties is None else self.params(requests))
        z, params, width = self.inputs(z, requests)
        return self._sample(z, params, vocab_size=self.domain.size, mask=mask, mask_row=mask_row,
                            penalties=penalties, candidate_width=width)

    def inputs(self, z: torch.Tensor, requests: Sequence["Request"]):
        """(logits readable by the kernels with never-generable ids at -inf, the rows'
        SamplingParams at their committed output positions, the candidate width). z: [N, V']
        with N a multiple of len(requests) (a speculative round: K+1 positions per row)."""
        s = [r.sampling for r in requests]
        if all(p.temperature == 0 for p in s):
            width = 1
        elif all(p.top_k > 0 for p in s):
            width = min(max(p.top_k for p in s), self.domain.size)
        else:
            width = None
        return self._generable(z), self.params(requests), width

    def graph_ready(self, requests: Sequence["Request"]) -> bool:
        """Whether the decode graph's own sample stage (`greedy_in_graph`) serves these rows:
        every row greedy and unpenalized (the caller checks that no row is constrained)."""
        return all(r.sampling.temperature == 0 and not r.penalized() for r in requests)

    def greedy_in_graph(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy sample stage of an unconstrained, unpenalized batch, capturable in a CUDA
        graph: logits [S, V'] -> (tokens [S] int64, status [S] int32)."""
        if self._fused_greedy:
            result = sample_greedy_fast(logits, vocab_size=self.domain.size,
                                        generable=self._generable_mask)
        else:
            result = sample_greedy(self._generable(logits), vocab_size=self.domain.size)
        return result.tokens, result.status

    @property
    def graph_masked(self) -> bool:
        """Whether decode graphs can capture `masked_greedy_in_graph` (the fused kernel: CUDA)."""
        return self._fused_greedy

    def masked_greedy_in_graph(self, logits: torch.Tensor, mask: torch.Tensor,
                               mask_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The greedy sample stage of a constrained, unpenalized batch, capturable in a CUDA
        graph (the fused kernel: CUDA only, else None): logits [S, V'], the mask buffer and
        mask_row [S] int32 (-1 = unconstrained row) -> (tokens [S] int64, status [S] int32)."""
        if not self._fused_greedy:
            return None
        result = sample_greedy_fast(
            logits,
            vocab_size=self.domain.size,
            mask=mask,
            mask_row=mask_row,
            generable=self._generable_mask,
        )
        return result.tokens, result.status

    def _generable(self, z: torch.Tensor) -> torch.Tensor:
        """Logits as the sampling kernels read them (float32 / half), never-generable ids at
        -inf."""
        if z.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            z = z.float()
        if self._never is not None:
            z = z.index_fill(1, self._never, float("-inf"))
        return z

    def params(self, requests: Sequence["Request"]) -> SamplingParams:
        """The rows' parameters on the device: rebuilt when the membership changed, else only
        the positions are uploaded (non-blocking from pinned memory on CUDA)."""
        n = len(requests)
        if self._static is None or len(self._members) != n or \
                any(a is not b for a, b in zip(self._members, requests)):
            s = [r.sampling for r in requests]
            self._static = SamplingParams.from_rows(
                n, temperature=[p.temperature for p in s], top_k=[p.top_k for p in s],
                top_p=[p.top_p for p in s], min_p=[p.min_p for p in s],
                repetition_penalty=[p.repetition_penalty for p in s],
                presence_penalty=[p.presence_penalty for p in s],
                frequency_penalty=[p.frequency_penalty for p in s],
                seed=[r.seed for r in requests], position=0, device=self.device)
            self._members = list(requests)
        if self._host_position.shape[0] < n:
            self._host_position = torch.zeros(max(n, 2 * self._host_position.shape[0]),
                                              dtype=torch.int64,
                                              pin_memory=self.device.type == "cuda")
        host = self._host_position[:n]
        host.copy_(torch.tensor([r.num_output_tokens for r in requests], dtype=torch.int64))
        position = host.to(self.device, non_blocking=True) if self.device.type == "cuda" \
            else host.clone()
        return dataclasses.replace(self._static, position=position)

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
        return PenaltyHistory(ids.to(self.device, non_blocking=True),  # staged: no host wait
                              counts.to(self.device, non_blocking=True))
