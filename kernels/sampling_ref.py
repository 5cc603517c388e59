"""Plain-torch reference of the sampling kernel family (`kernels.sampling`), same contract.

Written for reading, not speed: it materialises the [N, V] legal set and sorts every row with a
stable descending sort (ties keep the smaller id first). It runs on any device and is the CPU
fallback; `kernels.sampling_contract` states the rule it implements.
"""

from __future__ import annotations

import torch

from kernels import rng
from kernels.sampling_contract import (
    PenaltyHistory,
    SampleResult,
    SampleStatus,
    SamplingParams,
    check_inputs,
)


def penalized_logits(logits: torch.Tensor, vocab_size: int, params: SamplingParams,
                     penalties: PenaltyHistory | None) -> torch.Tensor:
    """Logits [N, V] as float32 after repetition, presence and frequency penalties."""
    z = logits[:, :vocab_size].float().clone()  # [N, V]
    if penalties is None:
        return z
    ids = penalties.ids.long()  # [N, L]
    valid = (ids >= 0) & (ids < vocab_size)
    rows = torch.arange(z.shape[0], device=z.device)[:, None].expand_as(ids)[valid]  # [P]
    cols, counts = ids[valid], penalties.counts[valid]  # [P]
    seen = z[rows, cols]
    rep = params.repetition_penalty[rows]
    seen = torch.where(seen > 0, seen / rep, seen * rep)
    seen = seen - params.presence_penalty[rows] * (counts > 0).float()
    seen = seen - params.frequency_penalty[rows] * counts.float()
    z[rows, cols] = seen
    return z


def legal_set(mask: torch.Tensor | None, mask_row: torch.Tensor | None, rows: int,
              vocab_size: int, device: torch.device) -> torch.Tensor:
    """[N, V] bool: the unpacked mask row of each constrained row, all True for the others
    (without boolean indexing, so no host synchronisation)."""
    if mask is None:
        return torch.ones(rows, vocab_size, dtype=torch.bool, device=device)
    constrained = mask_row >= 0  # [N]
    words = mask.index_select(0, torch.where(constrained, mask_row, 0).long())  # [N, W] int32
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [N, W, 32], lowest bit = smaller id
    legal = bits.view(bits.shape[0], -1)[:, :vocab_size].bool()  # [N, V]
    return legal | ~constrained[:, None]


def sorted_weights(logits, params, vocab_size, mask, mask_row, penalties, candidate_width):
    """Per row, in candidate order (value descending, ties to the smaller id): the final
    unnormalised weights w [N, V] (one-hot at rank 0 for greedy rows, zero for failed rows), the
    token ids `order` [N, V], the kept support `keep` [N, V], `status` [N] and `greedy` [N]."""
    flat_mask = check_inputs(logits, params, vocab_size, mask, mask_row, penalties)
    n = logits.shape[0]
    z = penalized_logits(logits, vocab_size, params, penalties)  # [N, V]
    legal = legal_set(flat_mask, mask_row, n, vocab_size, z.device)  # [N, V]
    bad = (legal & (torch.isnan(z) | (z == float("inf")))).any(dim=1)  # [N]
    z = torch.where(legal, z, float("-inf"))
    z_sorted, order = torch.sort(z, dim=1, descending=True, stable=True)  # [N, V]
    z0 = z_sorted[:, :1]  # [N, 1]
    status = torch.full((n,), SampleStatus.OK, dtype=torch.int32, device=z.device)
    status[bad | (z0[:, 0] == float("-inf"))] = SampleStatus.NONFINITE
    status[legal.sum(dim=1) == 0] = SampleStatus.DEAD_END
    ok = status == SampleStatus.OK
    width = vocab_size if candidate_width is None else candidate_width
    k = params.top_k.long()
    k = torch.where((k <= 0) | (k > width), width, k)[:, None]  # [N, 1]
    greedy = params.temperature[:, None] == 0
    temp = torch.where(greedy, 1.0, params.temperature[:, None])
    w = torch.exp((z_sorted - torch.where(ok[:, None], z0, 0.0)) / temp)  # [N, V]
    rank = torch.arange(vocab_size, device=z.device)
    keep = (rank < k) & (w > 0) & (w >= params.min_p[:, None])  # top-k, support, min-p
    w = torch.where(keep, w, 0.0)
    cum_before = torch.cumsum(w, dim=1) - w
    top_p = params.top_p[:, None]
    keep = keep & ((cum_before < top_p * w.sum(dim=1, keepdim=True)) | (top_p >= 1))  # top-p
    w = torch.where(keep, w, 0.0)
    w = torch.where(greedy, (rank == 0).float(), w)
    w = torch.where(ok[:, None], w, 0.0)
    return w, order, keep, status, greedy[:, 0]


def reference_distribution(logits: torch.Tensor, params: SamplingParams, *, vocab_size: int,
                           mask: torch.Tensor | None = None, mask_row: torch.Tensor | None = None,
                           penalties: PenaltyHistory | None = None,
                           candidate_width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The final normalised distribution `probs [N, V] float32` and `status [N] int32`.

    Greedy rows are one-hot; failed rows are all zero. Arguments as for `sample_reference`."""
    w, order, _, status, _ = sorted_weights(logits, params, vocab_size, mask, mask_row, penalties,
                                             candidate_width)
    total = w.sum(dim=1, keepdim=True)
    p_sorted = w / torch.where(total > 0, total, 1.0)
    return torch.zeros_like(p_sorted).scatter_(1, order, p_sorted), status


def sample_reference(logits: torch.Tensor, params: SamplingParams, *, vocab_size: int,
                     mask: torch.Tensor | None = None, mask_row: torch.Tensor | None = None,
                     penalties: PenaltyHistory | None = None, purpose: int = rng.Purpose.SAMPLE,
                     candidate_width: int | None = None) -> SampleResult:
    """Sample one token per row, exactly as `kernels.sampling.sample` (see its docstring).

    Raises ValueError for inconsistent shapes, dtypes or devices."""
    w, order, keep, status, greedy = sorted_weights(logits, params, vocab_size, mask, mask_row,
                                                     penalties, candidate_width)
    u = rng.uniform(params.seed, params.position, purpose)  # [N] float32
    cum = torch.cumsum(w, dim=1)  # [N, V]
    total = cum[:, -1:]
    rank = torch.arange(vocab_size, device=w.device)
    last_kept = torch.where(keep, rank, 0).amax(dim=1)  # [N]
    idx = torch.minimum((cum <= u[:, None] * total).sum(dim=1), last_kept)  # inverse CDF
    idx = torch.where(greedy, 0, idx)
    ok = status == SampleStatus.OK
    tokens = torch.where(ok, order.gather(1, idx[:, None])[:, 0], 0)
    prob = w.gather(1, idx[:, None])[:, 0] / torch.where(total[:, 0] > 0, total[:, 0], 1.0)
    return SampleResult(tokens=tokens, status=status, prob=torch.where(ok, prob, 0.0), uniform=u)
