"""Greedy sampling (T = 0 for every row) as a handful of torch ops: the masked argmax.

The rule is `kernels.sampling_contract`'s for T = 0: the largest penalized logit in the legal set
A, ties to the smaller id; DEAD_END when A is empty; NONFINITE when a legal value is NaN or +inf
or every legal value is -inf. Illegal values are never inspected. It needs no candidate selection
(no sort, no top-k), no sampling parameters when there are no penalties, no host synchronisation,
and it runs on any device (a fixed sequence of kernels on CUDA, capturable in a graph).
`kernels.sampling_ref.sample_reference` with temperature 0 is its oracle in the tests.
"""

from __future__ import annotations

import torch

from kernels.sampling_contract import PenaltyHistory, SampleResult, SampleStatus, SamplingParams
from kernels.sampling_ref import legal_set, penalized_logits


def sample_greedy(logits: torch.Tensor, *, vocab_size: int, mask: torch.Tensor | None = None,
                  mask_row: torch.Tensor | None = None, penalties: PenaltyHistory | None = None,
                  params: SamplingParams | None = None) -> SampleResult:
    """One greedy token per row of logits [N, V_pad] (the first vocab_size columns are read).

    mask: packed int32 words [..., ceil(V/32)] flattening to mask rows, mask_row [N] int32 (-1 =
    unconstrained), or both None; penalties with params (their penalty fields) when the rows are
    penalized. Returns tokens (0 for failed rows), status, prob (1 for OK rows, else 0) and a zero
    uniform (greedy draws none)."""
    n = logits.shape[0]
    if penalties is not None:
        if params is None:
            raise ValueError("penalties need params (their penalty fields)")
        z = penalized_logits(logits, vocab_size, params, penalties)  # [N, V] float32
    else:
        z = logits[:, :vocab_size]
    if mask is not None:
        if mask_row is None or mask_row.shape != (n,):
            raise ValueError(f"mask_row: expected int32 [{n}] with a mask")
        legal = legal_set(mask.view(-1, mask.shape[-1]), mask_row, n, vocab_size, z.device)  # [N, V]
        z = torch.where(legal, z, float("-inf"))  # illegal values are never inspected
        dead = ~legal.any(dim=1)
    # amax propagates NaN and +inf and is -inf when nothing is finite: one pass finds every
    # NONFINITE row; argmax returns the first index of the maximum (ties to the smaller id)
    best = z.amax(dim=1)  # [N]
    token = z.argmax(dim=1)  # [N]
    status = torch.where(torch.isfinite(best), int(SampleStatus.OK), int(SampleStatus.NONFINITE))
    if mask is not None:
        status = torch.where(dead, int(SampleStatus.DEAD_END), status)
    status = status.to(torch.int32)
    ok = status == SampleStatus.OK
    return SampleResult(tokens=torch.where(ok, token, 0), status=status, prob=ok.float(),
                        uniform=torch.zeros(n, dtype=torch.float32, device=z.device))
