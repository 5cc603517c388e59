"""Speculative acceptance (Triton, interpreted and CUDA; torch reference) against a float64 oracle.

The oracle is numpy float64 written from the design document's section 8: per position the
ordinary sampling distribution p (tests/test_kernels_sampling.oracle_row, over the hypothetical
prefix's mask and penalty history), then the round's walk with the counter-based uniforms of
tests/test_kernels_sampling_rng.oracle_uniform. Masks come from the design's lookahead
pseudo-code. Decisions within float32 noise of a threshold are "ambiguous" and only checked for
consistency; they must be rare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kernels.acceptance_contract import PositionState, speculative_penalties
from kernels.rng import Purpose
from kernels.sampling_contract import PenaltyHistory, SampleStatus, SamplingParams
from tests.kernels.test_kernels_sampling import oracle_row, pack, params_for
from tests.kernels.test_kernels_sampling_rng import chi2_upper, oracle_uniform
from tests.support.kernel_backends import INTERPRETED, run_interpreted

OK, DEAD, NONFINITE = SampleStatus.OK, SampleStatus.DEAD_END, SampleStatus.NONFINITE
DISABLED, READY = PositionState.DISABLED, PositionState.READY
DEAD_END, UNREACHABLE = PositionState.DEAD_END, PositionState.UNREACHABLE
TOL = 3e-5


@dataclass
class Backend:
    name: str
    device: str
    vocab: int  # an odd vocabulary (not a multiple of 32) for the scenario tests
    draws: int  # rounds of the statistical tests

    def accept(self, *args, **kw):
        if self.name == "reference":
            from kernels.acceptance_ref import accept_drafts_ref
            return accept_drafts_ref(*args, **kw)
        from kernels.acceptance import accept_drafts
        return accept_drafts(*args, **kw)


# The interpreter runs one Python program per position: its statistical tests take few rounds and
# check each against the oracle; the reference and CUDA backends carry the statistics.
BACKENDS = [pytest.param(Backend("interpreter", "cpu", 203, 40), id="interpreter")] \
    if INTERPRETED else [
        pytest.param(Backend("reference", "cpu", 1003, 4000), id="reference"),
        pytest.param(Backend("cuda", "cuda", 151_937, 40_000), id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def backend(request) -> Backend:
    return request.param


# ----------------------------------------------------------------------------- rounds


@dataclass
class Round:
    logits: np.ndarray  # [B, K+1, V_pad] float32
    vocab: int
    drafts: np.ndarray  # [B, K] int64
    num_drafts: list  # n_b per row
    legal: list  # per row: None (unconstrained) or bool [K+1, V]
    states: np.ndarray  # [B, K+1] PositionState
    params: dict  # per-row SamplingParams.from_rows columns
    history: list  # per row: [(token, output count)] committed
    q: tuple | None = None  # (ids [B, K, Q] int32, probs [B, K, Q] float32) or one-hot
    eos: list | None = None
    width: int | None = None

    @property
    def rows(self) -> int:
        return self.drafts.shape[0]

    @property
    def k(self) -> int:
        return self.drafts.shape[1]


def lookahead(legal: np.ndarray, drafts, n: int, eos=()) -> list:
    """The design's mask pseudo-code for one row: READY, DEAD_END, then UNREACHABLE."""
    states = [UNREACHABLE] * legal.shape[0]
    for i in range(legal.shape[0]):
        if not legal[i].any():
            states[i] = DEAD_END
            break
        states[i] = READY
        if i == n or not legal[i][drafts[i]] or drafts[i] in eos:
            break
    return states


def make_round(gen, vocab, rows, k, *, constrained, density=0.3, legal_draft=0.8, scale=2.0,
               eos=None, **param_lists) -> Round:
    """Random logits; drafts that are mostly the target's likely tokens; random masks on the
    constrained rows with most drafts legal; states from the lookahead."""
    logits = gen.normal(0, scale, (rows, k + 1, vocab + 3)).astype(np.float32)
    logits[:, :, vocab:] = 1e4  # physical padding beyond V is never a token
    drafts = np.zeros((rows, k), np.int64)
    legal, states = [], np.full((rows, k + 1), DISABLED, np.int64)
    num = [int(x) for x in gen.integers(0, k + 1, rows)]
    for b in range(rows):
        for i in range(k):
            top = np.argsort(-logits[b, i, :vocab], kind="stable")[:4]
            drafts[b, i] = gen.choice(top) if gen.random() < 0.7 else gen.integers(0, vocab)
        if constrained[b]:
            m = gen.random((k + 1, vocab)) < density
            for i in range(k):
                m[i, drafts[b, i]] = gen.random() < legal_draft
            legal.append(m)
            states[b] = lookahead(m, drafts[b], num[b], eos or ())
        else:
            legal.append(None)
    return Round(logits, vocab, drafts, num, legal, states, params_for(rows, **param_lists),
                 [[] for _ in range(rows)], eos=eos)


def run(backend: Backend, rnd: Round, *, garbage_mask=True):
    dev = backend.device
    b, k1 = rnd.rows, rnd.k + 1
    mask = None
    if any(x is not None for x in rnd.legal):
        words = -(-rnd.vocab // 32)
        buf = torch.full((b + 1, k1, words), -1, dtype=torch.int32)  # garbage where not READY
        if not garbage_mask:
            buf.zero_()
        for r, legal in enumerate(rnd.legal):
            for i in range(k1):
                if rnd.states[r, i] == READY:
                    buf[r, i] = pack(legal[i][None])[0]
        mask = buf.to(dev)
    params = SamplingParams.from_rows(b, **rnd.params, device=dev)
    penalties = None
    width_l = max(len(h) for h in rnd.history)
    if width_l:
        ids = np.full((b, width_l), -1, np.int32)
        counts = np.zeros((b, width_l), np.int32)
        for r, hist in enumerate(rnd.history):
            for j, (tok, c) in enumerate(hist):
                ids[r, j], counts[r, j] = tok, c
        base = PenaltyHistory(torch.from_numpy(ids).to(dev), torch.from_numpy(counts).to(dev))
        penalties = speculative_penalties(base, torch.from_numpy(rnd.drafts).to(dev))
    q_ids = q_probs = None
    if rnd.q is not None:
        q_ids, q_probs = (torch.from_numpy(x).to(dev) for x in rnd.q)
    eos = None if rnd.eos is None else torch.tensor(rnd.eos, dtype=torch.int32, device=dev)
    res = backend.accept(torch.from_numpy(rnd.logits).to(dev), params,
                         torch.from_numpy(rnd.drafts).to(dev),
                         torch.tensor(rnd.num_drafts, dtype=torch.int32, device=dev),
                         torch.from_numpy(rnd.states).to(torch.int32).to(dev),
                         vocab_size=rnd.vocab, mask=mask, q_ids=q_ids, q_probs=q_probs,
                         penalties=penalties, eos_ids=eos, candidate_width=rnd.width)
    return type(res)(*(t.cpu() for t in (res.tokens, res.num_tokens, res.accepted, res.status,
                                         res.end)))


# ----------------------------------------------------------------------------- float64 oracle


def merged_history(base, drafts_before):
    counts = dict(base)
    for d in drafts_before:
        counts[int(d)] = counts.get(int(d), 0) + 1
    return list(counts.items())


def oracle_walk(rnd: Round, b: int):
    """(status, tokens, accepted, ambiguous) of row b, in float64."""
    prm = {name: values[b] for name, values in rnd.params.items()}
    n, d = rnd.num_drafts[b], rnd.drafts[b]
    tokens, ambiguous = [], False
    for i in range(rnd.k + 1):
        state = rnd.states[b, i]
        if state == UNREACHABLE:
            return OK, tokens, len(tokens), ambiguous
        if state == DEAD_END:
            return DEAD, [], 0, ambiguous
        legal = rnd.legal[b][i] if state == READY else None
        pos = dict(prm, position=prm["position"] + i)
        exp = oracle_row(rnd.logits[b, i, :rnd.vocab], legal, merged_history(rnd.history[b], d[:i]),
                         pos, rnd.width)
        if exp.status != OK:
            return exp.status, [], 0, ambiguous
        ambiguous |= exp.ambiguous
        if i == n:  # bonus from p of the full prefix
            tok, margin = exp.pick(oracle_uniform(pos["seed"], pos["position"], Purpose.SAMPLE))
            return OK, tokens + [tok], len(tokens), ambiguous or (margin < TOL and not exp.greedy)
        if exp.greedy:
            if d[i] != exp.order[0]:
                return OK, tokens + [int(exp.order[0])], len(tokens), ambiguous
        else:
            p = dict(zip(exp.order.tolist(), exp.p.tolist()))
            if rnd.q is None:
                q = {int(d[i]): 1.0}
            else:
                q = {}
                for qi, qp in zip(rnd.q[0][b, i].tolist(), rnd.q[1][b, i].tolist()):
                    if qi >= 0:
                        q[qi] = q.get(qi, 0.0) + float(np.float32(qp))
            q_d = q.get(int(d[i]), 0.0)
            if q_d <= 0:
                return NONFINITE, [], 0, ambiguous
            u = oracle_uniform(pos["seed"], pos["position"], Purpose.ACCEPT)
            ratio = p.get(int(d[i]), 0.0) / q_d
            ambiguous |= abs(u - ratio) < TOL
            if not u < ratio:  # rejection: draw from (p - q)+ in candidate order
                r = np.array([max(0.0, p[v] - q.get(v, 0.0)) for v in exp.order.tolist()])
                if r.sum() <= 0:
                    return OK, tokens + [int(exp.order[0])], len(tokens), True
                cdf = np.cumsum(r / r.sum())
                u_r = oracle_uniform(pos["seed"], pos["position"], Purpose.RESIDUAL)
                j = min(int(np.searchsorted(cdf, u_r, side="right")), len(cdf) - 1)
                ambiguous |= float(np.min(np.abs(cdf - u_r))) < TOL
                return OK, tokens + [int(exp.order[j])], len(tokens), ambiguous
        tokens.append(int(d[i]))
        if rnd.eos is not None and int(d[i]) in rnd.eos:
            return OK, tokens, len(tokens), ambiguous
    raise AssertionError("the walk always stops by position n_b")


def check(rnd: Round, res) -> list:
    """Every row against the oracle; returns the oracle's (status, tokens, accepted) per row."""
    out, ambiguous = [], 0
    for b in range(rnd.rows):
        status, tokens, accepted, amb = oracle_walk(rnd, b)
        out.append((status, tokens, accepted))
        got = res.tokens[b, :int(res.num_tokens[b])].tolist()
        if amb:
            ambiguous += 1
            assert int(res.accepted[b]) <= rnd.num_drafts[b]
            continue
        assert int(res.status[b]) == status, f"row {b}: status"
        assert got == tokens and int(res.accepted[b]) == accepted, \
            f"row {b}: got {got} accepted {int(res.accepted[b])}, oracle {tokens} {accepted}"
        assert res.tokens[b, len(got):].tolist() == [0] * (rnd.k + 1 - len(got)), f"row {b} tail"
    # Over V = 151,937 (the CUDA backend) a float32 CDF lands within TOL of a uniform draw far
    # more often than over the CPU's small vocabulary (measured on the H200: up to 5 of 10 rows);
    # the test stays a test while at least half the rows are checked exactly.
    limit = max(1, rnd.rows // 10) if rnd.vocab < 100_000 else rnd.rows // 2
    assert ambiguous <= limit, "too many float32-ambiguous rows to be a test"
    return out


# ----------------------------------------------------------------------------- scenarios


def test_one_hot_round_matches_oracle(backend):
    """Design section 8: one-hot q (MTP, n-gram, DFlash) accepts d with p(d) and on rejection
    draws from the residual (p without d); the bonus samples p of the full accepted prefix; the
    target is constrained (READY masks, applied before candidate filtering), the drafts are not;
    greedy rows take the argmax over legal candidates; penalties follow the hypothetical prefix."""
    gen = np.random.default_rng(1)
    rows, k = 12, 4
    rnd = make_round(gen, backend.vocab, rows, k, constrained=[r % 2 == 0 for r in range(rows)],
                     temperature=[0.8, 1.0, 0, 1.3, 0.6, 0, 1.0, 2.0, 0.9, 1.0, 0, 1.1],
                     top_k=[0, 20, 0, 5, 0, 0, 3, 0, 50, 0, 0, 8],
                     top_p=[1, 0.9, 1, 1, 0.8, 1, 1, 0.7, 1, 1, 1, 0.95],
                     min_p=[0, 0, 0, 0.05, 0, 0, 0, 0, 0, 0.02, 0, 0],
                     repetition_penalty=1.2, presence_penalty=0.4, frequency_penalty=0.2,
                     seed=list(range(50, 50 + rows)), position=[7 * r for r in range(rows)])
    for b in range(rows):  # committed history; drafts repeat tokens so penalties move p
        rnd.history[b] = [(int(t), int(gen.integers(0, 3)))
                          for t in gen.choice(backend.vocab, 5, replace=False)]
        rnd.drafts[b, 2] = rnd.drafts[b, 0]
    res = run(backend, rnd)
    check(rnd, res)
    assert (res.status == OK).any() and (res.accepted > 0).any() and (res.accepted < 4).any()


def test_sparse_q_round_matches_oracle(backend):
    """DFlash2: the real sparse q over 16 candidates; accept with min(1, p(d)/q(d)), on rejection
    the positive part of p - q normalised. q's ids include illegal tokens and tokens outside p's
    support, and the draft is sampled from q (q is never revised at verification)."""
    gen = np.random.default_rng(2)
    rows, k, width = 10, 3, 16
    rnd = make_round(gen, backend.vocab, rows, k, constrained=[r % 3 != 0 for r in range(rows)],
                     density=0.5, temperature=[1.0, 0.7, 1.5, 0, 1.0, 0.9, 1.2, 1.0, 0.5, 1.0],
                     top_k=[0, 0, 30, 0, 10, 0, 0, 5, 0, 0], top_p=[1, 0.9] * 5,
                     seed=list(range(9, 9 + rows)), position=list(range(rows)))
    ids = np.full((rows, k, width), -1, np.int32)
    probs = np.zeros((rows, k, width), np.float32)
    for b in range(rows):
        for i in range(k):
            top = np.argsort(-rnd.logits[b, i, :rnd.vocab], kind="stable")[:40]
            cand = gen.choice(top, 14, replace=False)
            cand = np.append(cand, gen.choice(rnd.vocab, 2, replace=False))  # far tokens
            cand = np.unique(cand)
            w = gen.dirichlet(np.ones(len(cand)) * 0.7).astype(np.float32)
            ids[b, i, :len(cand)], probs[b, i, :len(cand)] = cand, w
            w64 = w.astype(np.float64)
            rnd.drafts[b, i] = gen.choice(cand, p=w64 / w64.sum())
        if rnd.legal[b] is not None:
            rnd.states[b] = lookahead(rnd.legal[b], rnd.drafts[b], rnd.num_drafts[b])
    rnd.q = (ids, probs)
    check(rnd, run(backend, rnd))


def test_rejection_at_every_position(backend):
    """A round ends at its first rejection with the correction, at every position 0..K, and all
    accepted gives the bonus: greedy rows whose drafts follow the legal argmax up to position j
    (design: "the unconstrained argmax the target forward already produced is never reused as a
    constrained row's answer"); T > 0 rows whose draft at j is illegal ("An illegal d_i has
    p(d_i)=0 ... takes the normal rejection; it is never dropped and treated as an ordinary
    bonus")."""
    gen = np.random.default_rng(3)
    k = 4
    rows = 2 * (k + 1)
    rnd = make_round(gen, backend.vocab, rows, k, constrained=[True] * rows, density=0.4,
                     legal_draft=1.0, temperature=[0] * (k + 1) + [1.0] * (k + 1),
                     seed=list(range(rows)))
    for b in range(rows):
        j = b % (k + 1)
        rnd.num_drafts[b] = k
        for i in range(k):
            z = np.where(rnd.legal[b][i], rnd.logits[b, i, :rnd.vocab], -np.inf)
            best = int(np.argmax(z))  # legal argmax, ties to the smaller id
            if b <= k:  # greedy: follow the argmax before j, leave it at j
                rnd.drafts[b, i] = best if i != j else int(np.argsort(-z, kind="stable")[1])
            else:  # sampled: an illegal draft at j
                rnd.drafts[b, i] = best
                if i == j:
                    rnd.drafts[b, i] = int(np.flatnonzero(~rnd.legal[b][i])[0])
        rnd.states[b] = lookahead(rnd.legal[b], rnd.drafts[b], k)
    res = run(backend, rnd)
    check(rnd, res)
    differs = 0  # greedy corrections where the unconstrained argmax is illegal
    for b in range(rows):
        j = b % (k + 1)
        if b <= k:
            assert int(res.accepted[b]) == j and int(res.num_tokens[b]) == j + 1
            z = rnd.logits[b, j, :rnd.vocab]
            legal_best = int(np.argmax(np.where(rnd.legal[b][j], z, -np.inf)))
            assert int(res.tokens[b, j]) == legal_best  # never the unconstrained argmax
            differs += legal_best != int(np.argmax(z))
        else:
            assert int(res.accepted[b]) <= j, f"row {b}: an illegal draft was accepted"
            if j < k:
                assert rnd.states[b, j] == READY and rnd.states[b, j + 1] == UNREACHABLE
        emitted = res.tokens[b, :int(res.num_tokens[b])].tolist()
        for i, tok in enumerate(emitted):  # every emitted token is legal at its position
            assert rnd.legal[b][i][tok], f"row {b}: illegal token {tok} at {i}"
    assert differs > 0, "the scenario must include an illegal unconstrained argmax"


def test_eos_inside_the_window(backend):
    """Design: "if EOS was accepted: later positions are Unreachable; stop": an accepted EOS ends
    the round without a bonus, for constrained rows by their descriptors and for unconstrained
    rows through eos_ids; a rejected EOS draft is corrected as any other."""
    gen = np.random.default_rng(4)
    vocab, k, eos = backend.vocab, 3, backend.vocab - 2
    rnd = make_round(gen, vocab, 4, k, constrained=[True, False, True, False], density=0.5,
                     temperature=0, eos=[eos])
    for b in range(4):
        rnd.num_drafts[b] = k
        for i in range(k):
            z = rnd.logits[b, i, :vocab]
            if rnd.legal[b] is not None:
                rnd.legal[b][i][eos] = True
                z = np.where(rnd.legal[b][i], z, -np.inf)
            rnd.drafts[b, i] = int(np.argmax(z))
        rnd.logits[b, 1, eos] = 1e3 if b < 2 else -1e3  # rows 0, 1: the target takes EOS at 1
        rnd.drafts[b, 1] = eos
        if rnd.legal[b] is not None:
            rnd.states[b] = lookahead(rnd.legal[b], rnd.drafts[b], k, [eos])
    assert list(rnd.states[0]) == [READY, READY, UNREACHABLE, UNREACHABLE]
    res = run(backend, rnd)
    check(rnd, res)
    for b in (0, 1):
        assert res.tokens[b, :int(res.num_tokens[b])].tolist()[-1] == eos
        assert int(res.accepted[b]) == 2 and int(res.num_tokens[b]) == 2  # no bonus after EOS
    for b in (2, 3):
        assert int(res.accepted[b]) == 1 and int(res.tokens[b, 1]) != eos


def test_dead_end_reached_or_not(backend):
    """Design: DeadEnd "fails the request only if verification actually reaches it"; "If the
    target rejected a draft leading there earlier, the request continues normally". A failed row
    commits zero tokens; the other rows of the batch are unaffected."""
    gen = np.random.default_rng(5)
    vocab, k = backend.vocab, 3
    rnd = make_round(gen, vocab, 3, k, constrained=[True, True, False], density=0.4,
                     temperature=0)
    for b in range(3):
        rnd.num_drafts[b] = k
        for i in range(k):
            z = rnd.logits[b, i, :vocab]
            if rnd.legal[b] is not None:
                z = np.where(rnd.legal[b][i], z, -np.inf)
            rnd.drafts[b, i] = int(np.argmax(z))
    for b in (0, 1):
        rnd.legal[b][2][:] = False  # d_0 d_1 leads to a prefix with no legal next token
    z = np.where(rnd.legal[1][1], rnd.logits[1, 1, :vocab], -np.inf)
    rnd.drafts[1, 1] = int(np.argsort(-z, kind="stable")[1])  # row 1: the target rejects d_1
    for b in (0, 1):
        rnd.states[b] = lookahead(rnd.legal[b], rnd.drafts[b], k)
        assert list(rnd.states[b]) == [READY, READY, DEAD_END, UNREACHABLE]
    res = run(backend, rnd)
    check(rnd, res)
    assert int(res.status[0]) == DEAD and int(res.num_tokens[0]) == 0 and int(res.end[0]) == 2
    assert int(res.status[1]) == OK and int(res.num_tokens[1]) == 2 and int(res.accepted[1]) == 1
    assert int(res.status[2]) == OK and int(res.num_tokens[2]) == k + 1


def test_nonfinite_only_where_reached(backend):
    """Design: non-finite model values are reported per row and never continue through token 0:
    NaN logits at a reached position fail the row (zero tokens); the same NaN at a position after
    the round's rejection is never inspected."""
    gen = np.random.default_rng(6)
    vocab, k = backend.vocab, 2
    rnd = make_round(gen, vocab, 2, k, constrained=[False, False], temperature=0)
    for b in range(2):
        rnd.num_drafts[b] = k
        rnd.drafts[b] = [int(np.argmax(rnd.logits[b, i, :vocab])) for i in range(k)]
    rnd.logits[0, 1, 5] = np.nan  # reached: d_0 is the argmax
    rnd.drafts[1, 0] = int(np.argsort(-rnd.logits[1, 0, :vocab])[1])  # rejected at 0
    rnd.logits[1, 1, 5] = np.nan  # never reached
    res = run(backend, rnd)
    check(rnd, res)
    assert int(res.status[0]) == NONFINITE and int(res.num_tokens[0]) == 0
    assert int(res.status[1]) == OK and int(res.num_tokens[1]) == 1


def test_counter_example_a_b_never_three_quarters(backend):
    """Design section 8: p(a) = p(b) = 0.5, p(x) = 0; q(a) = q(x) = 0.5. "With the correct
    algorithm proposal a is accepted and proposal x is rejected with b drawn from the residual,
    0.5 each. Dropping x and drawing the bonus from p would give a = 0.75, b = 0.25."

    Drafts are sampled from q (numpy, fixed seed), one per round, x illegal by the mask. The first
    emitted token is a with probability 1/2: the count must lie within 5 binomial standard
    deviations of n/2, a two-sided false-failure probability of 5.7e-7 (the seeds are fixed, so
    the test is deterministic: it either always passes or always fails). The wrong rule's mean
    0.75 n lies at least 5 standard deviations beyond the band's edge for n >= 400, so the same
    band rejects it except with probability below 3e-7."""
    n, vocab = backend.draws, 37
    a, b, x = 3, 20, 33
    gen = np.random.default_rng(7)
    logits = np.full((n, 2, vocab), -5.0, np.float32)
    logits[:, :, [a, b]] = 2.0  # legal: a and b, equal: p = 1/2 each
    legal = np.zeros((2, vocab), bool)
    legal[:, [a, b]] = True
    drafts = np.where(gen.random(n) < 0.5, a, x)[:, None].astype(np.int64)
    states = np.array([lookahead(legal, d, 1) for d in drafts])
    q_ids = np.tile(np.array([a, x, -1, -1], np.int32), (n, 1, 1))
    q_probs = np.tile(np.array([0.5, 0.5, 0, 0], np.float32), (n, 1, 1))
    rnd = Round(logits, vocab, drafts, [1] * n, [legal] * n, states,
                params_for(n, temperature=1.0, seed=[int(s) for s in np.arange(n) // 100 + 1],
                           position=[int(p) for p in np.arange(n) % 100 * 3]),
                [[] for _ in range(n)], q=(q_ids, q_probs))
    res = run(backend, rnd)
    first = res.tokens[:, 0].numpy()
    assert set(first.tolist()) <= {a, b} and (res.status == OK).all()
    is_x = drafts[:, 0] == x
    assert (first[is_x] == b).all(), "x is always rejected with b from the residual"
    assert (first[~is_x] == a).all() and (res.accepted.numpy()[~is_x] == 1).all()
    if n < 400:  # interpreter: every round equals the oracle's (the statistics run elsewhere)
        check(rnd, res)
        return
    count, sd = int((first == a).sum()), 0.5 * np.sqrt(n)
    assert abs(count - n / 2) <= 5 * sd, f"a was emitted {count} of {n} times"
    assert 0.75 * n - (n / 2 + 5 * sd) >= 5 * sd  # the band separates the wrong rule


def test_emitted_distribution_is_p_whatever_the_drafts(backend):
    """Losslessness: with one-hot q the first emitted token is distributed as p_0 whichever token
    was drafted (chi-square, 1e-6 false-alarm bound, deterministic seeds); a legal draft outside
    p's support and an illegal one are always rejected."""
    n, vocab = backend.draws, 11
    gen = np.random.default_rng(8)
    row = gen.normal(0, 1, vocab).astype(np.float32)
    legal = np.ones((2, vocab), bool)
    legal[:, 7] = False
    logits = np.tile(row, (n, 2, 1))
    drafts = gen.integers(0, vocab, (n, 1))  # any token, 7 illegal
    states = np.array([lookahead(legal, d, 1) for d in drafts])
    rnd = Round(logits, vocab, drafts, [1] * n, [legal] * n, states,
                params_for(n, temperature=0.9, top_k=6, seed=[int(s) for s in np.arange(n) // 50],
                           position=[int(p) for p in np.arange(n) % 50 * 2]),
                [[] for _ in range(n)])
    res = run(backend, rnd)
    exp = oracle_row(row, legal[0], [], {k: v[0] for k, v in rnd.params.items()}, None)
    first = res.tokens[:, 0].numpy()
    assert set(first.tolist()) <= set(exp.order.tolist())
    assert (res.accepted.numpy()[~np.isin(drafts[:, 0], exp.order)] == 0).all()
    if n < 400:
        check(rnd, res)
        return
    counts = np.array([(first == t).sum() for t in exp.order])
    expected = n * exp.p
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2_upper(len(exp.order) - 1)


def test_speculative_penalties_follow_the_hypothetical_prefix():
    """Design: "The target distribution at position i is fixed by committed prefix + draft[0:i]:
    its ... penalty history ... use the same hypothetical prefix": position i's history merges
    the committed one with d_0..d_{i-1} as output tokens, one entry per token."""
    base = PenaltyHistory(torch.tensor([[4, 9, -1], [2, -1, -1]], dtype=torch.int32),
                          torch.tensor([[1, 0, 0], [3, 0, 0]], dtype=torch.int32))
    drafts = torch.tensor([[9, 5, 5], [7, 2, 7]])
    out = speculative_penalties(base, drafts)
    for b in range(2):
        committed = [(int(t), int(c)) for t, c in zip(base.ids[b], base.counts[b]) if t >= 0]
        for i in range(4):
            row = b * 4 + i
            got = {int(t): int(c) for t, c in zip(out.ids[row], out.counts[row]) if t >= 0}
            assert (out.ids[row] >= 0).sum() == len(got)  # unique
            assert got == dict(merged_history(committed, drafts[b, :i].tolist())), (b, i)


def test_inputs_are_checked():
    from kernels.acceptance_ref import accept_drafts_ref
    params = SamplingParams.from_rows(2)
    logits = torch.zeros(2, 3, 40)
    drafts = torch.zeros(2, 2, dtype=torch.int64)
    nd = torch.tensor([2, 1], dtype=torch.int32)
    states = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_drafts"):
        accept_drafts_ref(logits, params, drafts, nd.long(), states, vocab_size=40)
    with pytest.raises(ValueError, match="states"):
        accept_drafts_ref(logits, params, drafts, nd, states[:, :2], vocab_size=40)
    with pytest.raises(ValueError, match="mask"):
        accept_drafts_ref(logits, params, drafts, nd, states, vocab_size=40,
                          mask=torch.zeros(2, 3, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="q_ids and q_probs"):
        accept_drafts_ref(logits, params, drafts, nd, states, vocab_size=40,
                          q_ids=torch.zeros(2, 2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="logits"):
        accept_drafts_ref(logits[:, :2], params, drafts, nd, states, vocab_size=40)


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_acceptance_kernels_under_interpreter():
    """Every backend scenario above on the Triton kernels in a fresh interpreted process."""
    run_interpreted(__file__)
