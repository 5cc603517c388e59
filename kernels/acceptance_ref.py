"""Plain-torch reference of the speculative acceptance kernels (`kernels.acceptance`).

Same contract (`kernels.acceptance_contract`), written for reading and as the CPU path: every
position's full sorted distribution comes from `kernels.sampling_ref.sorted_weights`, then each
position's decision, correction and bonus are computed for all positions at once and the walk
picks, per row, the first position that ends the round.
"""

from __future__ import annotations

import torch

from kernels import rng
from kernels.acceptance_contract import (
    AcceptResult,
    PositionState,
    check_accept_inputs,
    mask_rows,
    position_params,
)
from kernels.sampling_contract import PenaltyHistory, SampleStatus, SamplingParams
from kernels.sampling_ref import sorted_weights


def position_outcomes(logits: torch.Tensor, params: SamplingParams, drafts: torch.Tensor,
                      num_drafts: torch.Tensor, states: torch.Tensor, vocab_size: int,
                      flat_mask: torch.Tensor | None, q_ids: torch.Tensor | None,
                      q_probs: torch.Tensor | None, penalties: PenaltyHistory | None,
                      candidate_width: int | None):
    """Per position (b, i), flattened to N = B*(K+1): (status [N] int32, accept [N] bool, token
    [N] int64 (the correction for i < n_b, the bonus for i == n_b), q(d) [N] float32,
    greedy [N])."""
    rows, k = drafts.shape
    n = rows * (k + 1)
    dev = logits.device
    prm = position_params(params, k + 1)
    w, order, _, status, greedy = sorted_weights(
        logits, prm, vocab_size, flat_mask, mask_rows(states) if flat_mask is not None else None,
        penalties, candidate_width)  # w, order: [N, V] in candidate order
    total = w.sum(dim=1)  # [N]
    i = torch.arange(k + 1, device=dev).repeat(rows)  # [N] position index
    nd = num_drafts.long().repeat_interleave(k + 1)  # [N]
    d = torch.cat([drafts.long(), torch.full((rows, 1), -1, device=dev)], 1).reshape(n)  # [N]
    if q_ids is None:  # one-hot q: the draft itself with probability 1
        qi = d[:, None]
        qp = torch.ones(n, 1, device=dev)
    else:
        qi = torch.cat([q_ids.long(), torch.full((rows, 1, q_ids.shape[2]), -1, device=dev)],
                       1).reshape(n, -1)  # [N, Q]
        qp = torch.cat([q_probs, torch.zeros(rows, 1, q_probs.shape[2], device=dev)],
                       1).reshape(n, -1)
    bonus = i == nd
    qp = torch.where(bonus[:, None] | (qi < 0), 0.0, qp)  # the bonus samples p itself
    q_d = (qp * (qi == d[:, None])).sum(dim=1)  # [N] q(d)
    w_d = (w * (order == d[:, None])).sum(dim=1)  # [N] unnormalised p(d)
    u_acc = rng.uniform(prm.seed, prm.position, rng.Purpose.ACCEPT)
    accept = torch.where(greedy, order[:, 0] == d, u_acc * q_d * total < w_d)
    # q in candidate order: [N, V]; residual r = (w - q * total)+, i.e. (p - q)+ up to the scale
    vocab = order.shape[1]
    q_full = torch.zeros(n, vocab + 1, device=dev).scatter_add_(
        1, torch.where(qi < 0, vocab, qi).clamp(max=vocab), qp)  # [N, V+1], column V: padding
    q_sorted = q_full.gather(1, order)  # [N, V]
    r = torch.clamp(w - q_sorted * total[:, None], min=0.0)
    u = torch.where(bonus, rng.uniform(prm.seed, prm.position, rng.Purpose.SAMPLE),
                    rng.uniform(prm.seed, prm.position, rng.Purpose.RESIDUAL))
    cum = torch.cumsum(r, dim=1)
    rank = torch.arange(r.shape[1], device=dev)
    last = torch.where(r > 0, rank, 0).amax(dim=1)
    idx = torch.minimum((cum <= (u * cum[:, -1])[:, None]).sum(dim=1), last)  # inverse CDF
    idx = torch.where(greedy | (cum[:, -1] <= 0), 0, idx)  # no residual mass: p's top candidate
    token = order.gather(1, idx[:, None])[:, 0]
    return status, accept, token, q_d, greedy


def walk(drafts: torch.Tensor, num_drafts: torch.Tensor, states: torch.Tensor,
         status: torch.Tensor, accept: torch.Tensor, token: torch.Tensor, q_d: torch.Tensor,
         greedy: torch.Tensor, eos_ids: torch.Tensor | None) -> AcceptResult:
    """The per-row walk of `kernels.acceptance_contract` over per-position outcomes [B*(K+1)]."""
    rows, k = drafts.shape
    dev = drafts.device
    shape = (rows, k + 1)
    st, ps = states.long(), status.view(shape).long()
    acc, tok = accept.view(shape), token.view(shape)
    i = torch.arange(k + 1, device=dev)[None, :]
    nd = num_drafts.long()[:, None]
    d = torch.cat([drafts.long(), torch.zeros(rows, 1, dtype=torch.long, device=dev)], 1)
    drafted = i < nd
    is_eos = torch.isin(d, eos_ids.long()) if eos_ids is not None else torch.zeros_like(drafted)
    unreachable = st == PositionState.UNREACHABLE
    dead = (st == PositionState.DEAD_END) | (ps == SampleStatus.DEAD_END)
    bad = (ps == SampleStatus.NONFINITE) | (drafted & ~greedy.view(shape) & (q_d.view(shape) <= 0))
    emit = (i == nd) | (drafted & ~acc)  # bonus or correction
    after = drafted & acc & is_eos  # an accepted EOS ends the round
    stop = (i <= nd) & (unreachable | dead | bad | emit | after)
    first = stop.int().argmax(dim=1)  # [B]; i == n_b always stops
    at = lambda x: x.gather(1, first[:, None])[:, 0]  # noqa: E731
    u_end, dead_end, bad_end, emit_end = at(unreachable), at(dead), at(bad), at(emit)
    failed = ~u_end & (dead_end | bad_end)
    out_status = torch.where(failed & dead_end, int(SampleStatus.DEAD_END),
                             torch.where(failed, int(SampleStatus.NONFINITE), int(SampleStatus.OK)))
    accepted = torch.where(u_end | emit_end, first, first + 1)
    accepted = torch.where(failed, 0, accepted)
    num = torch.where(emit_end & ~failed & ~u_end, first + 1, accepted)
    tokens = torch.where(i < accepted[:, None], d, 0)
    tokens = torch.where((i == first[:, None]) & (emit_end & ~failed & ~u_end)[:, None], tok,
                         tokens)
    return AcceptResult(tokens=tokens, num_tokens=num.int(), accepted=accepted.int(),
                        status=out_status.int(), end=first.int())


def accept_drafts_ref(logits: torch.Tensor, params: SamplingParams, drafts: torch.Tensor,
                      num_drafts: torch.Tensor, states: torch.Tensor, *, vocab_size: int,
                      mask: torch.Tensor | None = None, q_ids: torch.Tensor | None = None,
                      q_probs: torch.Tensor | None = None,
                      penalties: PenaltyHistory | None = None,
                      eos_ids: torch.Tensor | None = None,
                      candidate_width: int | None = None) -> AcceptResult:
    """Verify one round of drafts, exactly as `kernels.acceptance.accept_drafts` (its docstring
    has the arguments). Raises ValueError for inconsistent inputs."""
    flat, flat_mask = check_accept_inputs(logits, params, drafts, num_drafts, states, vocab_size,
                                          mask, q_ids, q_probs, penalties, eos_ids)
    status, accept, token, q_d, greedy = position_outcomes(
        flat, params, drafts, num_drafts, states, vocab_size, flat_mask, q_ids, q_probs,
        penalties, candidate_width)
    return walk(drafts, num_drafts, states, status, accept, token, q_d, greedy, eos_ids)
