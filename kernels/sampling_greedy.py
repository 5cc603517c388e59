"""Greedy sampling (T = 0 for every row) as a handful of torch ops: the masked argmax.

The rule is `kernels.sampling_contract`'s for T = 0: the largest penalized logit in the legal set
A, ties to the smaller id; DEAD_END when A is empty; NONFINITE when a legal value is NaN or +inf
or every legal value is -inf. Illegal values are never inspected. It needs no candidate selection
(no sort, no top-k), no sampling parameters when there are no penalties, no host synchronisation,
and it runs on any device (a fixed sequence of kernels on CUDA, capturable in a graph).
`kernels.sampling_ref.sample_reference` with temperature 0 is its oracle in the tests.

`sample_greedy_fast` is the entry the sampler calls: on CUDA without penalties it runs the same
rule as one fused pass over the logits (`kernels.sampling_greedy_triton`, Triton), reading a static
packed `generable` mask instead of a copy of the logits with never-generable ids at -inf; anywhere
else it is `sample_greedy`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.sampling_contract import (
    PenaltyHistory,
    SampleResult,
    SampleStatus,
    SamplingParams,
    mask_words,
)
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
        legal = legal_set(
            mask.view(-1, mask.shape[-1]), mask_row, n, vocab_size, z.device
        )  # [N, V]
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


def generable_words(vocab_size: int, never: torch.Tensor | Sequence[int] | None,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """The packed `generable` mask of `sample_greedy_fast`: int32 words [ceil(V/32)], bit t of
    word t // 32 set unless id t is in `never` (ids outside [0, V) ignored); bits past V zero."""
    keep = torch.ones(mask_words(vocab_size) * 32, dtype=torch.bool)
    keep[vocab_size:] = False
    if never is not None:
        ids = torch.as_tensor(never, dtype=torch.int64).cpu().reshape(-1)
        keep[ids[(ids >= 0) & (ids < vocab_size)]] = False
    words = (keep.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(dim=1)  # [W] unsigned
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).to(device)


def sample_greedy_fast(logits: torch.Tensor, *, vocab_size: int, mask: torch.Tensor | None = None,
                       mask_row: torch.Tensor | None = None, generable: torch.Tensor | None = None,
                       penalties: PenaltyHistory | None = None,
                       params: SamplingParams | None = None) -> SampleResult:
    """`sample_greedy` with the never-generable ids excluded, in one fused pass where it can be.

    generable: packed int32 words [ceil(V/32)] (`generable_words`), the ids that may be chosen;
    the others read as -inf (what an `index_fill` of -inf into a copy of the logits gives, without
    the copy), None = all. On CUDA without penalties, with float32 / bf16 / fp16 logits of unit
    column stride: the Triton kernel pair of `kernels.sampling_greedy_triton` (two launches, no
    host synchronisation, capturable in a CUDA graph). Anywhere else: `sample_greedy` (torch) on
    the logits with the non-generable ids set to -inf. Same result either way."""
    if logits.is_cuda and penalties is None and logits.dim() == 2 and logits.stride(1) == 1 \
            and logits.dtype in (torch.float32, torch.bfloat16, torch.float16):
        from kernels.sampling_greedy_triton import sample_greedy_triton
        return sample_greedy_triton(logits, vocab_size=vocab_size, mask=mask, mask_row=mask_row,
                                    generable=generable)
    if generable is not None:
        keep = legal_set(generable.view(1, -1), torch.zeros(1, dtype=torch.int32,
                                                              device=logits.device),
                         1, vocab_size, logits.device)  # [1, V]
        logits = torch.where(keep, logits[:, :vocab_size], float("-inf"))
    return sample_greedy(logits, vocab_size=vocab_size, mask=mask, mask_row=mask_row,
                         penalties=penalties, params=params)
