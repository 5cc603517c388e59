"""Triton speculative acceptance: one-hot q, sparse q and greedy verification of a round of drafts.

The contract (inputs, the walk, statuses) is `kernels.acceptance_contract`; the plain-torch
reference is `kernels.acceptance_ref`. Three steps, no host synchronisation:

1. `kernels.sampling.build_candidates` over the B*(K+1) positions: keys with the position's mask
   fused (READY positions only), penalties of the hypothetical prefix, then top-k candidates (an
   argmax for a greedy-only batch), exactly as ordinary sampling builds them.
2. `_position_kernel`, grid (B*(K+1),): per position its status, the acceptance decision for its
   draft and the token it would emit there: the correction (a residual draw) before n_b, the bonus
   (an ordinary draw from p) at n_b. The weights are the sampling kernel's (exp((z - z_max)/T),
   top-k, min-p, top-p) in four passes over the candidates: total, kept total and p(d), residual
   mass, inverse CDF. Residual weights are (w - q * total)+, i.e. (p - q)+ times the total, so
   the bonus (q = 0) is drawn with the same arithmetic as `kernels.sampling.sample`. Positions the
   walk cannot reach (after n_b, UNREACHABLE, DEAD_END, failed) skip the passes.
3. `_walk_kernel`, grid (B,): the first position that ends each row's round (vectorised over the
   K+1 positions), the emitted tokens, counts and status.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import rng
from kernels.acceptance_contract import AcceptResult, PositionState, check_accept_inputs, mask_rows
from kernels.sampling import _candidate_weights, _key_value, _uniform, build_candidates
from kernels.sampling_contract import PenaltyHistory, SamplingParams

_READY = tl.constexpr(int(PositionState.READY))
_DEAD_END = tl.constexpr(int(PositionState.DEAD_END))
_UNREACHABLE = tl.constexpr(int(PositionState.UNREACHABLE))
_POS_INF = tl.constexpr(float("inf"))


@triton.jit
def _token(key):
    return (0x7FFFFFFF - (key & 0xFFFFFFFF)).to(tl.int64)


@triton.jit
def _q_of(tokens, qid, qp, d, bonus, SPARSE: tl.constexpr):
    # q(v) for candidate tokens [BLOCK_W]: sparse q over its ids, one-hot q at the draft; 0 for the
    # bonus position.
    if SPARSE:
        q = tl.sum(tl.where(tokens[:, None] == qid[None, :], qp[None, :], 0.0), axis=1)
    else:
        q = tl.where(tokens == d, 1.0, 0.0)
    return tl.where(bonus, 0.0, q)


@triton.jit
def _position_kernel(cand_ptr, cand_stride, width, stats_ptr, NB, states_ptr, num_drafts_ptr,
                     drafts_ptr, drafts_stride, qid_ptr, qp_ptr, q_sb, q_sk, Q,
                     temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, position_ptr,
                     pstatus_ptr, accept_ptr, token_ptr, qd_ptr, K,
                     ACCEPT_KEY: tl.constexpr, RESIDUAL_KEY: tl.constexpr,
                     SAMPLE_KEY: tl.constexpr, SPARSE: tl.constexpr,
                     BLOCK_W: tl.constexpr, BLOCK_NB: tl.constexpr, BLOCK_Q: tl.constexpr):
    n = tl.program_id(0)
    b = n // (K + 1)
    i = n % (K + 1)
    legal = tl.zeros([BLOCK_NB], tl.int32)
    bad = tl.zeros([BLOCK_NB], tl.int32)
    for start in range(0, NB, BLOCK_NB):
        blk = start + tl.arange(0, BLOCK_NB)
        legal += tl.load(stats_ptr + (n * NB + blk) * 2, mask=blk < NB, other=0)
        bad += tl.load(stats_ptr + (n * NB + blk) * 2 + 1, mask=blk < NB, other=0)
    row = cand_ptr + n.to(tl.int64) * cand_stride
    key0 = tl.load(row)
    z0 = _key_value(key0)
    status = tl.where(tl.sum(legal, axis=0) == 0, 1,
                      tl.where((tl.sum(bad, axis=0) > 0) | (z0 == float("-inf")), 2, 0))
    z0 = tl.where(status == 0, z0, 0.0)
    state = tl.load(states_ptr + n)
    nd = tl.load(num_drafts_ptr + b)
    bonus = i == nd
    slot = tl.maximum(tl.minimum(i, K - 1), 0)  # an in-range draft index for the loads
    d = tl.where(i < nd, tl.load(drafts_ptr + b * drafts_stride + slot), -1)
    d = d.to(tl.int64)
    temp = tl.load(temperature_ptr + b)
    greedy = temp <= 0
    reach = (status == 0) & (i <= nd) & (state != _UNREACHABLE) & (state != _DEAD_END)
    k = tl.load(top_k_ptr + b)
    k = tl.where((k <= 0) | (k > width), width, k)
    k = tl.where(reach & (temp > 0), k, 0)  # greedy rows and unreachable positions skip the passes
    t = tl.where(temp > 0, temp, 1.0)
    min_p = tl.load(min_p_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    j = tl.arange(0, BLOCK_Q)
    q_count = tl.where((i < K) & (i < nd), Q, 0)
    q_off = b.to(tl.int64) * q_sb + slot.to(tl.int64) * q_sk + j
    qid = tl.load(qid_ptr + q_off, mask=j < q_count, other=-1).to(tl.int64)
    qp = tl.load(qp_ptr + q_off, mask=j < q_count, other=0.0)
    if SPARSE:
        q_d = tl.sum(tl.where(qid == d, qp, 0.0), axis=0)
    else:
        q_d = tl.where(i < nd, 1.0, 0.0)
    # Pass 1: total weight after top-k, support and min-p.
    total1 = tl.zeros([BLOCK_W], tl.float32)
    for start in range(0, k, BLOCK_W):
        total1 += _candidate_weights(row, start + tl.arange(0, BLOCK_W), k, z0, t, min_p)
    limit = tl.where(top_p >= 1.0, _POS_INF, top_p * tl.sum(total1, axis=0))
    # Pass 2: top-p; the kept total and the draft's kept weight.
    carry = 0.0
    kept_w = tl.zeros([BLOCK_W], tl.float32)
    w_d = tl.zeros([BLOCK_W], tl.float32)
    for start in range(0, k, BLOCK_W):
        c = start + tl.arange(0, BLOCK_W)
        w = _candidate_weights(row, c, k, z0, t, min_p)
        kw = tl.where(carry + tl.cumsum(w, axis=0) - w < limit, w, 0.0)
        kept_w += kw
        tokens = _token(tl.load(row + c, mask=c < k, other=0))
        w_d += tl.where(tokens == d, kw, 0.0)
        carry += tl.sum(w, axis=0)
    total = tl.sum(kept_w, axis=0)
    w_d = tl.sum(w_d, axis=0)
    u_acc = _uniform(tl.load(seed_ptr + b), tl.load(position_ptr + b) + i, ACCEPT_KEY)
    accept = tl.where(greedy, _token(key0) == d, u_acc * q_d * total < w_d)
    # Pass 3: residual mass, r = (w - q * total)+ over kept candidates (the bonus: r = w).
    carry = 0.0
    mass = tl.zeros([BLOCK_W], tl.float32)
    for start in range(0, k, BLOCK_W):
        c = start + tl.arange(0, BLOCK_W)
        w = _candidate_weights(row, c, k, z0, t, min_p)
        kw = tl.where(carry + tl.cumsum(w, axis=0) - w < limit, w, 0.0)
        tokens = _token(tl.load(row + c, mask=c < k, other=0))
        mass += tl.maximum(kw - _q_of(tokens, qid, qp, d, bonus, SPARSE) * total, 0.0)
        carry += tl.sum(w, axis=0)
    mass_total = tl.sum(mass, axis=0)
    # Pass 4: inverse CDF of r at the residual (or, for the bonus, the sampling) uniform.
    u = _uniform(tl.load(seed_ptr + b), tl.load(position_ptr + b) + i,
                 RESIDUAL_KEY) * (1 - bonus.to(tl.float32)) \
        + _uniform(tl.load(seed_ptr + b), tl.load(position_ptr + b) + i,
                   SAMPLE_KEY) * bonus.to(tl.float32)
    target = u * mass_total
    carry = 0.0
    r_carry = 0.0
    chosen = n * 0 + width
    last = n * 0
    for start in range(0, k, BLOCK_W):
        c = start + tl.arange(0, BLOCK_W)
        w = _candidate_weights(row, c, k, z0, t, min_p)
        kw = tl.where(carry + tl.cumsum(w, axis=0) - w < limit, w, 0.0)
        tokens = _token(tl.load(row + c, mask=c < k, other=0))
        r = tl.maximum(kw - _q_of(tokens, qid, qp, d, bonus, SPARSE) * total, 0.0)
        cum = r_carry + tl.cumsum(r, axis=0)
        chosen = tl.minimum(chosen, tl.min(tl.where((r > 0) & (cum > target), c, width), axis=0))
        last = tl.maximum(last, tl.max(tl.where(r > 0, c, 0), axis=0))
        carry += tl.sum(w, axis=0)
        r_carry += tl.sum(r, axis=0)
    chosen = tl.where(chosen >= width, last, chosen)  # rounding: u * mass reached the end
    chosen = tl.where(greedy | (mass_total <= 0), 0, chosen)
    tl.store(pstatus_ptr + n, status)
    tl.store(accept_ptr + n, accept.to(tl.int32))
    tl.store(token_ptr + n, _token(tl.load(row + chosen)))
    tl.store(qd_ptr + n, q_d)


@triton.jit
def _walk_kernel(states_ptr, pstatus_ptr, accept_ptr, token_ptr, qd_ptr, num_drafts_ptr,
                 drafts_ptr, drafts_stride, temperature_ptr, eos_ptr, E,
                 tokens_ptr, num_ptr, accepted_ptr, status_ptr, end_ptr, K,
                 HAS_EOS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK_K)
    inside = i < K + 1
    base = b * (K + 1) + i
    st = tl.load(states_ptr + base, mask=inside, other=_UNREACHABLE)
    ps = tl.load(pstatus_ptr + base, mask=inside, other=0)
    acc = tl.load(accept_ptr + base, mask=inside, other=0) != 0
    tok = tl.load(token_ptr + base, mask=inside, other=0)
    q_d = tl.load(qd_ptr + base, mask=inside, other=1.0)
    nd = i * 0 + tl.load(num_drafts_ptr + b)  # [BLOCK_K]
    greedy = (i * 0.0 + tl.load(temperature_ptr + b)) <= 0
    d = tl.load(drafts_ptr + b * drafts_stride + i, mask=i < K, other=0).to(tl.int64)
    drafted = i < nd
    if HAS_EOS:
        e = tl.arange(0, BLOCK_E)
        eos = tl.load(eos_ptr + e, mask=e < E, other=-1).to(tl.int64)
        is_eos = tl.sum((d[:, None] == eos[None, :]).to(tl.int32), axis=1) > 0
    else:
        is_eos = i < 0
    unreachable = st == _UNREACHABLE
    dead = (st == _DEAD_END) | (ps == 1)
    bad = (ps == 2) | (drafted & ~greedy & (q_d <= 0))
    emit = (i == nd) | (drafted & ~acc)
    after = drafted & acc & is_eos
    stop = inside & (i <= nd) & (unreachable | dead | bad | emit | after)
    first = tl.min(tl.where(stop, i, BLOCK_K), axis=0)
    here = i == first
    u_end = tl.sum((here & unreachable).to(tl.int32), axis=0) > 0
    dead_end = tl.sum((here & dead).to(tl.int32), axis=0) > 0
    bad_end = tl.sum((here & bad).to(tl.int32), axis=0) > 0
    emit_end = tl.sum((here & emit).to(tl.int32), axis=0) > 0
    failed = ~u_end & (dead_end | bad_end)
    status = tl.where(failed & dead_end, 1, tl.where(failed, 2, 0))
    accepted = tl.where(u_end | emit_end, first, first + 1)
    accepted = tl.where(failed, 0, accepted)
    emits = emit_end & ~failed & ~u_end
    num = tl.where(emits, first + 1, accepted)
    out = tl.where(i < accepted, d, 0)
    out = tl.where(here & (i * 0 + emits.to(tl.int32) > 0), tok, out)
    tl.store(tokens_ptr + base, out, mask=inside)
    tl.store(num_ptr + b, num)
    tl.store(accepted_ptr + b, accepted)
    tl.store(status_ptr + b, status)
    tl.store(end_ptr + b, first)


def accept_drafts(logits: torch.Tensor, params: SamplingParams, drafts: torch.Tensor,
                  num_drafts: torch.Tensor, states: torch.Tensor, *, vocab_size: int,
                  mask: torch.Tensor | None = None, q_ids: torch.Tensor | None = None,
                  q_probs: torch.Tensor | None = None, penalties: PenaltyHistory | None = None,
                  eos_ids: torch.Tensor | None = None, candidate_width: int | None = None,
                  block_v: int = 1024) -> AcceptResult:
    """Verify one round of drafts per row (`kernels.acceptance_contract` states the rule).

    logits: [B, K+1, V_pad] or [B*(K+1), V_pad] target logits (float32/bf16/fp16, unit column
        stride); position i of row b follows committed output + d_0..d_{i-1}.
    params: SamplingParams of the B rows (position = logical output position of d_0).
    drafts: int32/int64 [B, K]; num_drafts: int32 [B], n_b in 0..K (drafts beyond are ignored).
    states: int32 [B, K+1] PositionState per position (DISABLED for unconstrained rows).
    mask: int32 [>= B, K+1, ceil(V/32)] (the Program's buffer); read only at READY positions.
    q_ids, q_probs: int32 / float32 [B, K, Q] the drafter's sparse q per draft (ids -1 pad);
        None = one-hot q (n-gram, MTP, DFlash).
    penalties: one history per position ([B*(K+1), L], see `speculative_penalties`) or None.
    eos_ids: int32 [E] ids that end a round when accepted (optional).
    candidate_width: as `kernels.sampling.sample` (1 for a greedy-only batch: an argmax).
    Returns AcceptResult. Raises ValueError for inconsistent inputs. No host synchronisation."""
    flat, flat_mask = check_accept_inputs(logits, params, drafts, num_drafts, states, vocab_size,
                                          mask, q_ids, q_probs, penalties, eos_ids)
    rows, k = drafts.shape
    n, dev = rows * (k + 1), flat.device
    drafts, num_drafts, states = drafts.contiguous(), num_drafts.contiguous(), states.contiguous()
    width = vocab_size if candidate_width is None else candidate_width
    result = AcceptResult(tokens=torch.empty(rows, k + 1, dtype=torch.int64, device=dev),
                          num_tokens=torch.empty(rows, dtype=torch.int32, device=dev),
                          accepted=torch.empty(rows, dtype=torch.int32, device=dev),
                          status=torch.empty(rows, dtype=torch.int32, device=dev),
                          end=torch.empty(rows, dtype=torch.int32, device=dev))
    if rows == 0:
        return result
    candidates, stats = build_candidates(
        flat, params, vocab_size, flat_mask, mask_rows(states) if flat_mask is not None else None,
        penalties, width, block_v, rows_per_param=k + 1)
    pstatus = torch.empty(n, dtype=torch.int32, device=dev)
    accept = torch.empty(n, dtype=torch.int32, device=dev)
    token = torch.empty(n, dtype=torch.int64, device=dev)
    q_d = torch.empty(n, dtype=torch.float32, device=dev)
    d = drafts if k > 0 else torch.zeros(rows, 1, dtype=drafts.dtype, device=dev)
    sparse = q_ids is not None and k > 0
    qi = q_ids if sparse else d.reshape(rows, -1, 1)[:, :, :1].to(torch.int32)
    qp = q_probs if sparse else torch.ones(qi.shape, dtype=torch.float32, device=dev)
    nb = stats.shape[1]
    _position_kernel[(n,)](
        candidates, candidates.stride(0), width, stats, nb, states, num_drafts, d, d.stride(0),
        qi, qp, qi.stride(0), qi.stride(1), qi.shape[2], params.temperature, params.top_k,
        params.top_p, params.min_p, params.seed, params.position, pstatus, accept, token, q_d, k,
        ACCEPT_KEY=rng.purpose_key(rng.Purpose.ACCEPT),
        RESIDUAL_KEY=rng.purpose_key(rng.Purpose.RESIDUAL),
        SAMPLE_KEY=rng.purpose_key(rng.Purpose.SAMPLE), SPARSE=sparse,
        BLOCK_W=min(triton.next_power_of_2(width), 1024),
        BLOCK_NB=min(triton.next_power_of_2(nb), 1024),
        BLOCK_Q=triton.next_power_of_2(max(1, qi.shape[2])))
    eos = eos_ids if eos_ids is not None and eos_ids.numel() else None
    _walk_kernel[(rows,)](
        states, pstatus, accept, token, q_d, num_drafts, d, d.stride(0), params.temperature,
        eos if eos is not None else num_drafts, 0 if eos is None else eos.shape[0],
        result.tokens, result.num_tokens, result.accepted, result.status, result.end, k,
        HAS_EOS=eos is not None, BLOCK_K=triton.next_power_of_2(k + 1),
        BLOCK_E=triton.next_power_of_2(1 if eos is None else eos.shape[0]))
    return result
