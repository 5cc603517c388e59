"""Sampling kernels (Triton, interpreted and CUDA) and the torch reference against a float64 oracle.

Every scenario runs per backend: `reference` (kernels.sampling_ref, in process), `interpreter`
(kernels.sampling under TRITON_INTERPRET=1, small shapes, in a child pytest: triton.language's own
helpers are jit functions decorated when triton is imported, so the variable must be set before
triton's first import and cannot be switched inside one process) and `cuda` (native, large V,
marked gpu). The oracle below is numpy float64, written from the design document's rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from kernels.rng import Purpose
from kernels.sampling_contract import PenaltyHistory, SampleStatus, SamplingParams, check_inputs
from tests.kernels.test_kernels_sampling_rng import chi2_upper, oracle_uniform
from tests.support.kernel_backends import INTERPRETED, run_interpreted

OK, DEAD_END, NONFINITE = SampleStatus.OK, SampleStatus.DEAD_END, SampleStatus.NONFINITE


# ----------------------------------------------------------------------------- float64 oracle


@dataclass
class Expected:
    status: int
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # final support
    p: np.ndarray = field(default_factory=lambda: np.zeros(0))  # probabilities, same order
    greedy: bool = False
    ambiguous: bool = False  # a truncation threshold within float32 noise of a candidate

    def pick(self, u: float) -> tuple[int, float]:
        """Inverse CDF in candidate order: first with cumulative p > u; and the distance to a
        step."""
        cdf = np.cumsum(self.p)
        i = min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)
        return int(self.order[i]), float(np.min(np.abs(cdf - u)))


def oracle_row(z32: np.ndarray, legal: np.ndarray | None, history, prm: dict,
               width: int | None) -> Expected:
    vocab = z32.shape[0]
    z = z32.astype(np.float64)
    for tok, count in history:  # HF / vLLM repetition, then presence and frequency
        x = z[tok]
        x = x / prm["repetition_penalty"] if x > 0 else x * prm["repetition_penalty"]
        z[tok] = x - prm["presence_penalty"] * (count > 0) - prm["frequency_penalty"] * count
    legal = np.ones(vocab, bool) if legal is None else legal
    if not legal.any():
        return Expected(DEAD_END)
    zl = z[legal]
    if np.isnan(zl).any() or (zl == np.inf).any() or (zl == -np.inf).all():
        return Expected(NONFINITE)
    ids = np.flatnonzero(legal & (z > -np.inf))
    order = ids[np.lexsort((ids, -z[ids]))]  # value descending, ties to the smaller id
    if prm["temperature"] == 0:
        return Expected(OK, order[:1], np.ones(1), greedy=True)
    k = prm["top_k"] if prm["top_k"] > 0 else vocab
    k = min(k, width or vocab)
    ambiguous = len(order) > k and z[order[k - 1]] - z[order[k]] < 1e-5 * (1 + abs(z[order[k]]))
    order = order[:k]
    w = np.exp((z[order] - z[order[0]]) / prm["temperature"])
    if prm["min_p"] > 0:
        ambiguous |= bool(np.any(np.abs(w - prm["min_p"]) < 1e-5))
    keep = (w > 0) & (w >= prm["min_p"])
    order, w = order[keep], w[keep]
    if prm["top_p"] < 1:
        before = np.cumsum(w) - w
        limit = prm["top_p"] * w.sum()
        ambiguous |= bool(np.any(np.abs(before - limit) < 1e-5 * w.sum()))
        keep = before < limit
        order, w = order[keep], w[keep]
    return Expected(OK, order, w / w.sum(), ambiguous=ambiguous)


# ----------------------------------------------------------------------------- cases and backends


@dataclass
class Case:
    logits: np.ndarray  # [N, V_pad] float32
    vocab: int
    legal: list  # per row: bool [V] or None (unconstrained)
    history: list  # per row: [(token, output count)], unique tokens
    params: dict  # SamplingParams.from_rows keyword -> list of N values
    width: int | None = None

    @property
    def rows(self) -> int:
        return self.logits.shape[0]

    def row_params(self, n: int) -> dict:
        return {name: values[n] for name, values in self.params.items()}

    def expected(self) -> list[Expected]:
        return [oracle_row(self.logits[n, :self.vocab], self.legal[n], self.history[n],
                           self.row_params(n), self.width) for n in range(self.rows)]


def pack(legal: np.ndarray) -> torch.Tensor:
    """bool [R, V] -> int32 [R, ceil(V/32)]: bit i of word w = token 32w + i, zero bits beyond V."""
    rows, vocab = legal.shape
    padded = np.zeros((rows, -(-vocab // 32) * 32), bool)
    padded[:, :vocab] = legal
    return torch.from_numpy(np.packbits(padded, axis=1, bitorder="little").view("<i4").copy())


def params_for(n: int, **given) -> dict:
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                    presence_penalty=0.0, frequency_penalty=0.0, seed=12345, position=0)
    out = {}
    for name, default in defaults.items():
        value = given.get(name, default)
        out[name] = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * n
    return out


@dataclass
class Backend:
    name: str
    device: str
    vocab: int  # the "large" odd vocabulary of this backend
    draws: int  # rows for the statistical test
    kwargs: dict

    def sample(self, *args, **kw):
        if self.name == "reference":
            from kernels.sampling_ref import sample_reference
            return sample_reference(*args, **kw)
        from kernels.sampling import sample
        return sample(*args, **kw, **self.kwargs)

    def run(self, case: Case, purpose: int = Purpose.SAMPLE, mask_rows_extra: int = 0):
        n = case.rows
        logits = torch.from_numpy(case.logits).to(self.device)
        mask = mask_row = None
        rows = [legal for legal in case.legal if legal is not None]
        if rows:
            mask_np = np.stack(rows + [np.ones(case.vocab, bool)] * mask_rows_extra)
            mask = pack(mask_np).to(self.device)
            index, nxt = [], 0
            for legal in case.legal:
                index.append(-1 if legal is None else nxt)
                nxt += legal is not None
            mask_row = torch.tensor(index, dtype=torch.int32, device=self.device)
        penalties = None
        width_l = max(len(h) for h in case.history)
        if width_l:
            ids = np.full((n, width_l), -1, np.int32)
            counts = np.zeros((n, width_l), np.int32)
            for r, hist in enumerate(case.history):
                for j, (tok, c) in enumerate(hist):
                    ids[r, j], counts[r, j] = tok, c
            penalties = PenaltyHistory(torch.from_numpy(ids).to(self.device),
                                       torch.from_numpy(counts).to(self.device))
        params = SamplingParams.from_rows(n, **case.params, device=self.device)
        res = self.sample(logits, params, vocab_size=case.vocab, mask=mask, mask_row=mask_row,
                          penalties=penalties, purpose=purpose, candidate_width=case.width)
        return type(res)(*(t.cpu() for t in (res.tokens, res.status, res.prob, res.uniform)))


# The interpreter backend exists only in the interpreted child process that
# test_triton_kernels_under_interpreter starts (TRITON_INTERPRET must be set before triton is first
# imported); this process runs the reference and, on a GPU, the native kernels.
BACKENDS = [
    pytest.param(Backend("interpreter", "cpu", 1000, 12, {"block_v": 512}), id="interpreter"),
] if INTERPRETED else [
    pytest.param(Backend("reference", "cpu", 10_007, 40_000, {}), id="reference"),
    pytest.param(Backend("cuda", "cuda", 248_077, 400_000, {}), id="cuda", marks=pytest.mark.gpu),
]


@pytest.fixture(params=BACKENDS)
def backend(request) -> Backend:
    return request.param


def check(case: Case, res, purpose: int = Purpose.SAMPLE, tol: float = 3e-5) -> list[Expected]:
    """Statuses, uniforms, tokens and probabilities of every row against the oracle.

    A sampled token must be the oracle's inverse-CDF pick; where u lies within `tol` of a CDF step
    (float32 sums over thousands of candidates), the token's own CDF interval must contain u up to
    `tol`. Rows whose truncation threshold is within float32 noise only need a token of the support,
    and they must be rare."""
    expected = case.expected()
    ambiguous = 0
    for n, exp in enumerate(expected):
        prm = case.row_params(n)
        assert int(res.status[n]) == exp.status, f"row {n}"
        u = oracle_uniform(prm["seed"], prm["position"], purpose)
        assert float(res.uniform[n]) == u
        token = int(res.tokens[n])
        if exp.status != OK:
            assert token == 0 and float(res.prob[n]) == 0.0, f"row {n} placeholder"
            continue
        assert token in set(exp.order.tolist()), f"row {n}: token {token} outside the support"
        want, margin = exp.pick(u)
        if exp.greedy:
            assert token == want and float(res.prob[n]) == 1.0, f"row {n}"
        elif exp.ambiguous:
            ambiguous += 1
        elif margin > tol:
            assert token == want, f"row {n}"
            i = int(np.flatnonzero(exp.order == token)[0])
            assert float(res.prob[n]) == pytest.approx(exp.p[i], rel=2e-4), f"row {n}"
        else:
            cdf = np.concatenate([[0.0], np.cumsum(exp.p)])
            i = int(np.flatnonzero(exp.order == token)[0])
            assert cdf[i] - tol <= u <= cdf[i + 1] + tol, f"row {n}: u={u} outside token's step"
    assert ambiguous <= max(1, case.rows // 10), "too many float32-ambiguous rows to be a test"
    return expected


# ----------------------------------------------------------------------------- scenarios


def test_mixed_batch_matches_oracle(backend):
    """Design: "With penalized logits z and legal set A, the existing top-k candidates C are chosen
    over v in A. At positive temperature the weights are exp(z_v/T - max_C(z/T)), truncated by the
    existing min-p and top-p order and normalized to p; greedy takes the largest z in A"; mixed
    batches use "an explicit disabled descriptor" for unconstrained rows."""
    gen = np.random.default_rng(7)
    n, vocab = 12, backend.vocab
    logits = np.empty((n, vocab + 5), np.float32)
    logits[:, :vocab] = gen.normal(0, 3, (n, vocab))
    logits[:, vocab:] = 1e4  # physical padding beyond V is never a token
    densities = [None, 0.5, None, 0.05, 0.002, None, 0.3, 0.9, None, 0.01, 0.2, None]
    legal = [None if d is None else gen.random(vocab) < d for d in densities]
    history = [[(int(t), int(gen.integers(0, 3))) for t in gen.choice(vocab, 6, replace=False)]
               if r % 3 else [] for r in range(n)]
    prm = params_for(
        n, temperature=[0, 0.7, 1.0, 1.3, 0.5, 0, 1.0, 2.0, 0.9, 1.0, 0.6, 1.1],
        top_k=[0, 40, 0, 5, 0, 1, 20, 0, 100, 3, 0, 50],
        top_p=[1, 0.9, 1, 1, 0.5, 1, 0.95, 0.7, 1, 1, 0.8, 0.6],
        min_p=[0, 0, 0.05, 0, 0, 0, 0.02, 0, 0.1, 0, 0, 0],
        repetition_penalty=[1.3] * n, presence_penalty=[0.5] * n, frequency_penalty=[0.25] * n,
        seed=list(range(100, 100 + n)), position=[3 * r for r in range(n)])
    case = Case(logits, vocab, legal, history, prm)
    check(case, backend.run(case))


def test_legal_tokens_beyond_unconstrained_top_k(backend):
    """Design: "Filtering an already chosen top 20 does not meet this contract: a legal token may
    lie beyond the original 20th." Only tokens ranked 21..30 are legal; top_k = 20."""
    gen = np.random.default_rng(11)
    n, vocab = 8, backend.vocab
    logits = gen.normal(0, 1, (n, vocab)).astype(np.float32)
    legal = []
    for r in range(n):
        ranked = np.argsort(-logits[r], kind="stable")
        row = np.zeros(vocab, bool)
        row[ranked[20:30]] = True
        legal.append(row)
    case = Case(logits, vocab, legal, [[]] * n,
                params_for(n, temperature=[0, 1.0] * 4, top_k=20, seed=list(range(n))))
    res = backend.run(case)
    check(case, res)
    for r in range(n):
        assert int(res.tokens[r]) in set(np.argsort(-logits[r], kind="stable")[20:30].tolist())


def test_fewer_legal_tokens_than_top_k(backend):
    """Design: "When fewer legal candidates exist than top-k, the support uses the actual count;
    negative-infinity padding is never a samplable token." 3 legal tokens, one of them -inf."""
    n, vocab = 8, backend.vocab
    gen = np.random.default_rng(3)
    logits = gen.normal(0, 1, (n, vocab)).astype(np.float32)
    legal_ids = [5, vocab // 2, vocab - 1]
    logits[:, vocab // 2] = -np.inf
    row = np.zeros(vocab, bool)
    row[legal_ids] = True
    case = Case(logits, vocab, [row] * n, [[]] * n,
                params_for(n, temperature=1.0, top_k=50, seed=7, position=list(range(n))))
    res = backend.run(case)
    check(case, res)
    assert set(res.tokens.tolist()) <= {5, vocab - 1}  # the finite legal tokens, nothing else


def test_single_legal_token(backend):
    """Design: illegal tokens "take no part in argmax, top-k or later normalization": a single
    legal token is chosen with probability 1 at any temperature, whatever its logit."""
    vocab = backend.vocab
    ids = [0, 31, 32, vocab - 1, 31, vocab - 1]  # first bit, sign bit, next word, last valid bit
    n = len(ids)
    logits = np.random.default_rng(5).normal(0, 1, (n, vocab)).astype(np.float32)
    legal = []
    for r, tok in enumerate(ids):
        row = np.zeros(vocab, bool)
        row[tok] = True
        legal.append(row)
        logits[r, tok] = -50.0  # far below every illegal value
    case = Case(logits, vocab, legal, [[]] * n,
                params_for(n, temperature=[1.0, 0.5, 0, 2.0, 1.0, 0], top_k=[0, 1, 0, 10, 0, 0],
                           top_p=[1, 0.1, 1, 1, 1, 1], seed=list(range(n))))
    res = backend.run(case)
    check(case, res)
    assert res.tokens.tolist() == ids and res.prob.tolist() == [1.0] * n


def test_empty_mask_is_dead_end_never_token_zero(backend):
    """Design: "An empty mask and non-finite model values are reported separately and never continue
    through token 0"; DEAD_END rows write 0 only as a placeholder, other rows are unaffected."""
    n, vocab = 6, backend.vocab
    logits = np.random.default_rng(9).normal(0, 1, (n, vocab)).astype(np.float32)
    logits[:, 0] = 30.0  # token 0 is the best value everywhere
    only_zero = np.zeros(vocab, bool)
    only_zero[0] = True
    empty = np.zeros(vocab, bool)
    case = Case(logits, vocab, [empty, None, only_zero, empty, np.ones(vocab, bool), empty],
                [[]] * n, params_for(n, temperature=[1.0, 1.0, 1.0, 0, 0.7, 0.3], seed=1))
    res = backend.run(case)
    check(case, res)
    assert res.status.tolist() == [DEAD_END, OK, OK, DEAD_END, OK, DEAD_END]
    assert res.tokens[2] == 0 and res.status[2] == OK  # a real token 0 is distinguishable


def test_nonfinite_logits_fail_only_their_row(backend):
    """Design: "a row without a finite selection sets its ... nonfinite flag and writes token 0 only
    as an in-range placeholder"; illegal values are never inspected; other rows are unaffected."""
    n, vocab = 8, backend.vocab
    logits = np.random.default_rng(13).normal(0, 1, (n, vocab + 3)).astype(np.float32)
    logits[:, vocab:] = np.nan  # padding beyond V is never read
    logits[0, 17] = np.nan  # legal NaN
    logits[1, 18] = np.inf  # legal +inf
    logits[2, :vocab] = -np.inf  # every legal value -inf
    logits[3, 19] = np.nan  # NaN, but illegal in row 3
    logits[4, 20] = -np.inf  # one legal -inf is fine
    logits[5, 21] = np.inf  # +inf, illegal in row 5
    logits[6, 22] = np.nan  # greedy row with a legal NaN
    legal3 = np.ones(vocab, bool)
    legal3[19] = False
    legal5 = np.ones(vocab, bool)
    legal5[21] = False
    case = Case(logits, vocab, [None, None, None, legal3, None, legal5, None, None], [[]] * n,
                params_for(n, temperature=[1, 1, 1, 1, 0.8, 0.8, 0, 0], top_k=[0, 10] * 4,
                           seed=list(range(n))))
    res = backend.run(case)
    check(case, res)
    assert res.status.tolist() == [NONFINITE] * 3 + [OK] * 3 + [NONFINITE, OK]


def test_greedy_ties_go_to_the_smaller_id(backend):
    """Design: "greedy takes the largest z in A, ties to the smaller token id"."""
    vocab = backend.vocab
    ties = [(40, vocab - 1), (3, 700), (600, 900), (31, 32), (1, 2)]
    n = len(ties) + 1
    logits = np.random.default_rng(17).normal(0, 1, (n, vocab)).astype(np.float32)
    legal = [None] * n
    for r, (a, b) in enumerate(ties):
        logits[r, a] = logits[r, b] = 9.0
    logits[1, 0] = 9.0  # an even smaller id with the same value, but illegal
    legal[1] = np.ones(vocab, bool)
    legal[1][0] = False
    logits[2, 600], logits[2, 900] = 0.0, -0.0  # -0.0 ties with +0.0
    logits[2, :600] = logits[2, 601:] = -1.0
    logits[2, 900] = -0.0
    logits[4] = 9.0 * (np.arange(vocab) % 3 == 0)
    logits[4, 1] = logits[4, 2] = 9.0
    logits[5] = 1.5  # a flat row: every token ties
    case = Case(logits, vocab, legal, [[]] * n, params_for(n, temperature=0))
    res = backend.run(case)
    check(case, res)
    assert res.tokens.tolist() == [40, 3, 600, 31, 0, 0]


def test_penalties_follow_hf_vllm(backend):
    """Design: "Logits are read over the vocabulary with the existing presence/frequency penalties"
    and "Penalties the caller sets still apply": a penalised favourite loses the argmax."""
    vocab = backend.vocab
    logits = np.zeros((4, vocab), np.float32)
    logits[:, 10], logits[:, 11], logits[:, 12] = 4.0, 3.0, -1.0
    history = [[(10, 0)], [(10, 2)], [(10, 1), (11, 0)], [(12, 0), (10, 0)]]
    case = Case(logits, vocab, [None] * 4, history,
                params_for(4, temperature=0, repetition_penalty=[2.0, 1.0, 1.0, 1.5],
                           presence_penalty=[0, 0.5, 2.0, 0], frequency_penalty=[0, 0.4, 0, 0]))
    res = backend.run(case)
    check(case, res)
    # 4 / 2 = 2; 4 - 0.5 - 2 * 0.4 = 2.7; 4 - 2 = 2 (prompt-only 11 keeps 3); 4 / 1.5 = 2.67:
    # token 10 loses to 3.0 in every row.
    assert res.tokens.tolist() == [11, 11, 11, 11]


def test_same_seed_and_position_same_token_in_any_row(backend):
    """Design: "a changing compact row never resets a request's random stream": the draw depends on
    (seed, position, purpose) and the row's own inputs, not on its batch row or the batch size."""
    gen = np.random.default_rng(19)
    vocab, n = backend.vocab, 6
    base = gen.normal(0, 1, (n, vocab)).astype(np.float32)
    legal = [None, gen.random(vocab) < 0.3, None, gen.random(vocab) < 0.1, None, None]
    prm = params_for(n, temperature=1.0, top_k=[0, 50, 10, 0, 0, 5], top_p=[1, 0.9, 1, 1, 0.8, 1],
                     seed=[5, 5, 6, 6, 7, 7], position=[0, 1, 0, 1, 9, 9])
    first = backend.run(Case(base, vocab, legal, [[]] * n, prm))
    perm = [3, 5, 0, 4, 2, 1]
    extra = gen.normal(0, 1, (2, vocab)).astype(np.float32)
    logits2 = np.concatenate([extra[:1], base[perm], extra[1:]])
    legal2 = [None] + [legal[i] for i in perm] + [None]
    prm2 = {k: [v[0]] + [v[i] for i in perm] + [v[-1]] for k, v in prm.items()}
    second = backend.run(Case(logits2, vocab, legal2, [[]] * (n + 2), prm2))
    assert second.tokens[1:-1].tolist() == first.tokens[perm].tolist()
    assert second.uniform[1:-1].tolist() == first.uniform[perm].tolist()


def test_speculative_mask_layout_and_purpose(backend):
    """Design: "mask[row, position, word]" with a fixed stride, "the logical position is row x (K+1)
    + position"; each logits row names its mask row; purposes are separate RNG streams."""
    gen = np.random.default_rng(23)
    vocab, b, k1 = backend.vocab, 2, 3
    legal = gen.random((b, k1, vocab)) < 0.2
    buffer = pack(legal.reshape(-1, vocab)).reshape(b, k1, -1)  # [B, K+1, W]
    buffer = torch.cat([buffer, torch.full_like(buffer[:1], -1)])  # an unused lane of garbage
    rows = [(1, 2), (0, 0), (1, 0), None, (0, 1)]
    n = len(rows)
    logits = gen.normal(0, 2, (n, vocab)).astype(np.float32)
    prm = params_for(n, temperature=[0.8, 1.0, 0, 1.2, 1.0], top_k=[0, 30, 0, 0, 4],
                     seed=9, position=list(range(n)))
    params = SamplingParams.from_rows(n, **prm, device=backend.device)
    mask_row = torch.tensor([-1 if r is None else r[0] * k1 + r[1] for r in rows],
                            dtype=torch.int32, device=backend.device)
    case = Case(logits, vocab, [None if r is None else legal[r] for r in rows], [[]] * n, prm)
    for purpose in (Purpose.ACCEPT, Purpose.RESIDUAL):
        res = backend.sample(torch.from_numpy(logits).to(backend.device), params, vocab_size=vocab,
                             mask=buffer.to(backend.device), mask_row=mask_row, purpose=purpose)
        check(case, type(res)(*(t.cpu() for t in (res.tokens, res.status, res.prob, res.uniform))),
              purpose)


def test_candidate_width_is_exact_when_it_covers_top_k(backend):
    """Design: top-k candidates over A; a batch's candidate width of max(top_k) (1 when greedy) is
    only an execution choice and never changes a result."""
    gen = np.random.default_rng(29)
    vocab, n = backend.vocab, 6
    logits = gen.normal(0, 2, (n, vocab)).astype(np.float32)
    legal = [None, gen.random(vocab) < 0.05, None, gen.random(vocab) < 0.5, None, None]
    prm = params_for(n, temperature=[1.0, 0.7, 0, 1.0, 2.0, 1.0], top_k=[7, 3, 0, 16, 16, 1],
                     top_p=[1, 1, 1, 0.7, 1, 1], seed=31, position=list(range(n)))
    check(Case(logits, vocab, legal, [[]] * n, prm, width=16), backend.run(
        Case(logits, vocab, legal, [[]] * n, prm, width=16)))
    greedy = params_for(n, temperature=0, seed=31)
    check(Case(logits, vocab, legal, [[]] * n, greedy, width=1),
          backend.run(Case(logits, vocab, legal, [[]] * n, greedy, width=1)))


def test_greedy_batch_is_an_argmax_with_ties_to_the_smaller_id(backend):
    """Design: "greedy takes the largest z in A, ties to the smaller token id"; issue 14: greedy
    rows through an argmax over the masked logits, not a top-k. A greedy-only batch (candidate
    width 1) with equal maxima in different vocabulary blocks, a legal maximum below an illegal
    one, penalties that move the maximum, and an empty row."""
    gen = np.random.default_rng(31)
    n, vocab = 6, backend.vocab
    logits = gen.normal(0, 1, (n, vocab)).astype(np.float32)
    top = [3, vocab - 2, 700 % vocab, 40, 5, 9]
    twin = [vocab - 1, 1, 2, 41, vocab // 2, 10]  # equal value at another id
    for r in range(n):
        logits[r, top[r]] = logits[r, twin[r]] = 9.0
    legal = [None, None, gen.random(vocab) < 0.3, np.ones(vocab, bool), None, np.zeros(vocab, bool)]
    legal[3][[40, 41]] = False  # the twins are illegal: the legal argmax is elsewhere
    history = [[], [], [], [], [(min(top[4], twin[4]), 2)], []]
    for cols in ([], history):
        case = Case(logits, vocab, legal, cols if cols else [[]] * n,
                    params_for(n, temperature=0, repetition_penalty=1.5, frequency_penalty=1.0),
                    width=1)
        res = backend.run(case)
        check(case, res)
        assert res.status.tolist()[5] == DEAD_END
        assert int(res.tokens[0]) == min(top[0], twin[0]) and int(res.tokens[1]) == 1
        if cols:  # the penalised twin lost: the other one wins
            assert int(res.tokens[4]) == max(top[4], twin[4])


def test_sampling_frequencies_match_oracle(backend):
    """Design: the token is drawn from p by the counter-based RNG: over many (seed, position) keys
    the empirical frequencies match the oracle's p (chi-square, 1e-6 false-alarm bound; the draws
    are deterministic, so the test cannot flake), and the same counts reject a plausible wrong
    rule (filtering the unconstrained top-k, or ignoring temperature)."""
    gen = np.random.default_rng(37)
    n, vocab = backend.draws, 37
    row = gen.normal(0, 1.5, vocab).astype(np.float32)
    legal = gen.random(vocab) < 0.7
    hist = [(int(np.flatnonzero(legal)[0]), 1), (int(np.flatnonzero(legal)[1]), 0)]
    prm = params_for(n, temperature=0.8, top_k=12, top_p=0.97, min_p=0.01, repetition_penalty=1.2,
                     presence_penalty=0.3, frequency_penalty=0.1,
                     seed=[int(s) for s in np.arange(n) // 1000 * 7919 + 3],
                     position=[int(p) for p in np.arange(n) % 1000])
    case = Case(np.tile(row, (n, 1)), vocab, [legal] * n, [hist] * n, prm)
    res = backend.run(case)
    if n < 1000:  # interpreter: exact inverse-CDF agreement row by row is the check
        check(case, res)
        return
    exp = oracle_row(row, legal, hist, case.row_params(0), None)  # every row is the same
    counts = np.bincount(res.tokens.numpy(), minlength=vocab)
    assert counts.sum() == counts[exp.order].sum(), "a token outside the support was drawn"

    def chi2(order, p):
        expected = n * p
        big = expected >= 5
        obs = np.append(counts[order][big], counts[order][~big].sum())
        want = np.append(expected[big], expected[~big].sum())
        keep = want > 0
        return float(((obs[keep] - want[keep]) ** 2 / want[keep]).sum()), int(keep.sum()) - 1

    stat, df = chi2(exp.order, exp.p)
    assert stat < chi2_upper(df)
    wrong = oracle_row(row, None, hist, case.row_params(0), None)  # unconstrained, then filtered
    p_wrong = np.array([wrong.p[wrong.order == t].sum() for t in exp.order])
    if p_wrong.sum() > 0:
        assert chi2(exp.order, p_wrong / p_wrong.sum())[0] > chi2_upper(df)
    hot = oracle_row(row, legal, hist, dict(case.row_params(0), temperature=1.0), None)
    p_hot = np.array([hot.p[hot.order == t].sum() for t in exp.order])
    assert chi2(exp.order, p_hot / p_hot.sum())[0] > chi2_upper(df)


# ----------------------------------------------------------------------------- reference-only


def test_reference_distribution_matches_oracle():
    """Design: "Illegal tokens take no part in argmax, top-k or later normalization": the
    reference's full distribution equals the oracle's p (zero outside the final support)."""
    from kernels.sampling_ref import reference_distribution
    gen = np.random.default_rng(41)
    n, vocab = 8, 50_001
    logits = gen.normal(0, 2, (n, vocab)).astype(np.float32)
    legal = [None, gen.random(vocab) < 0.01, None, gen.random(vocab) < 0.5, None, None,
             np.zeros(vocab, bool), None]
    history = [[(int(t), int(c)) for t, c in zip(gen.choice(vocab, 9, replace=False),
                                                 gen.integers(0, 4, 9))]] * n
    prm = params_for(n, temperature=[1.0, 0.6, 0, 1.5, 0.9, 1.0, 1.0, 0.3],
                     top_k=[0, 0, 0, 50, 400, 0, 0, 20], top_p=[1, 0.9, 1, 0.8, 1, 0.5, 1, 1],
                     min_p=[0, 0, 0, 0, 0.01, 0.1, 0, 0], repetition_penalty=1.1,
                     presence_penalty=0.2, frequency_penalty=0.1)
    case = Case(logits, vocab, legal, history, prm)
    B = Backend("reference", "cpu", vocab, 0, {})
    params = SamplingParams.from_rows(n, **prm)
    mask = pack(np.stack([x for x in legal if x is not None]))
    mask_row = torch.tensor([-1, 0, -1, 1, -1, -1, 2, -1], dtype=torch.int32)
    ids = torch.tensor([[t for t, _ in h] for h in history], dtype=torch.int32)
    counts = torch.tensor([[c for _, c in h] for h in history], dtype=torch.int32)
    probs, status = reference_distribution(torch.from_numpy(logits), params, vocab_size=vocab,
                                           mask=mask, mask_row=mask_row,
                                           penalties=PenaltyHistory(ids, counts))
    for r, exp in enumerate(case.expected()):
        assert int(status[r]) == exp.status
        want = np.zeros(vocab)
        want[exp.order] = exp.p
        assert np.abs(probs[r].double().numpy() - want).max() < 1e-5, f"row {r}"
    check(case, B.run(case))


def test_invalid_inputs_name_the_field():
    """STYLE: errors name the field and give expected and actual values."""
    with pytest.raises(ValueError, match=r"top_p\[1\]"):
        SamplingParams.from_rows(2, top_p=[1.0, 0.0])
    with pytest.raises(ValueError, match=r"temperature\[0\]"):
        SamplingParams.from_rows(1, temperature=float("nan"))
    with pytest.raises(ValueError, match="expected 3 rows"):
        SamplingParams.from_rows(3, seed=[1, 2])
    params = SamplingParams.from_rows(2)
    logits = torch.zeros(2, 100)
    with pytest.raises(ValueError, match="mask"):
        check_inputs(logits, params, 100, torch.zeros(2, 3, dtype=torch.int32),
                     torch.zeros(2, dtype=torch.int32), None)  # needs ceil(100/32) = 4 words
    with pytest.raises(ValueError, match="mask_row"):
        check_inputs(logits, params, 100, torch.zeros(2, 4, dtype=torch.int32), None, None)
    with pytest.raises(ValueError, match="vocab_size"):
        check_inputs(logits, params, 101, None, None, None)


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_triton_kernels_under_interpreter():
    """Design: "kernels have torch references and Triton's interpreter (TRITON_INTERPRET=1) for
    small shapes": every scenario above, run on the Triton kernels in a fresh interpreted
    process."""
    run_interpreted(__file__)
