"""kernels/logprobs.py against the sampler's own rule: log of the sort-based reference
distribution (`kernels.sampling_ref.reference_distribution`, its log taken in float64) on an odd
vocabulary size, with masked ids, ties at the truncation points, and every transform."""

from __future__ import annotations

import pytest
import torch

from kernels.logprobs import processed_logprobs, stable_top, untruncated_logprobs
from kernels.sampling_contract import SamplingParams
from kernels.sampling_ref import reference_distribution

V = 997  # not a multiple of 32


def _logits(seed: int, *, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=torch.float64) * 3
    if ties:  # many equal values, so truncation points fall inside runs of ties
        z = torch.round(z * 2) / 2
    z[torch.rand(V, generator=g) < 0.3] = float("-inf")  # the illegal (masked) ids
    return z.float()


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 40, 1.0, 0.0), (0.8, 40, 0.5, 0.0),
    (1.0, 0, 0.999, 0.0), (1.0, 0, 1.0, 0.05), (0.9, 7, 0.8, 0.02), (2.0, 0, 0.3, 0.0)])
def test_processed_logprobs_equal_the_reference_distribution(ties, temperature, top_k, top_p,
                                                             min_p):
    """Design: "At positive temperature the weights are exp(z_v/T - max_C(z/T)), truncated by
    the existing min-p and top-p order and normalized to p": log p here, -inf outside the kept
    support, for every id (ties keep the smaller id first)."""
    for seed in range(4):
        z = _logits(seed, ties=ties)
        got = processed_logprobs(z, temperature=temperature, top_k=top_k, top_p=top_p,
                                 min_p=min_p)
        params = SamplingParams.from_rows(1, temperature=temperature, top_k=top_k, top_p=top_p,
                                          min_p=min_p)
        probs, _ = reference_distribution(z.double()[None], params, vocab_size=V)
        kept = probs[0] > 0
        assert torch.equal(torch.isfinite(got), kept), (seed, int(kept.sum()))
        want = torch.log(probs[0][kept].double())
        assert torch.allclose(got[kept].double(), want, atol=1e-5), seed


def test_greedy_rows_report_the_masked_log_softmax():
    """A greedy row samples a one-hot; its logprobs are the masked log-softmax at T = 1."""
    z = _logits(1, ties=False)
    got = processed_logprobs(z, temperature=0.0, top_k=3, top_p=0.5)
    legal = torch.isfinite(z)
    want = z.double()[legal] - torch.logsumexp(z.double()[legal], 0)
    assert torch.allclose(got[legal].double(), want, atol=1e-5)
    assert not torch.isfinite(got[~legal]).any()


def test_stable_top_breaks_ties_to_the_smaller_id():
    values = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, float("-inf")])
    vals, ids = stable_top(values, 4)
    assert ids.tolist() == [1, 3, 2, 4] and vals.tolist() == [3.0, 3.0, 2.0, 2.0]
    assert processed_logprobs(torch.full((5,), float("-inf")), temperature=1.0) is None


@pytest.mark.gpu
def test_processed_logprobs_on_cuda_equal_the_cpu():
    """The same torch code on the device the worker serves from (float32 on both)."""
    z = _logits(2, ties=True)
    for kwargs in ({"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9},
                   {"temperature": 1.1, "top_k": 40, "min_p": 0.01}):
        cpu = processed_logprobs(z, **kwargs)
        gpu = processed_logprobs(z.cuda(), **kwargs).cpu()
        assert torch.equal(torch.isfinite(cpu), torch.isfinite(gpu))
        assert torch.allclose(cpu[torch.isfinite(cpu)], gpu[torch.isfinite(gpu)], atol=1e-5)


def test_batched_rows_equal_the_row_by_row_rule():
    """The worker's batched pass (rows without top-k / top-p) and batched top-n selection give
    each row what the one-row rule gives it."""
    z = torch.stack([_logits(s, ties=s % 2 == 1) for s in range(5)])
    z[4] = float("-inf")  # a row without a finite legal value
    temperature = torch.tensor([1.0, 0.6, 1.4, 1.0, 1.0])
    min_p = torch.tensor([0.0, 0.1, 0.0, 0.02, 0.0])
    got = untruncated_logprobs(z, temperature, min_p)
    for r in range(4):
        want = processed_logprobs(z[r], temperature=float(temperature[r]),
                                  min_p=float(min_p[r]))
        assert torch.equal(torch.isfinite(got[r]), torch.isfinite(want))
        assert torch.allclose(got[r][torch.isfinite(want)], want[torch.isfinite(want)],
                              atol=1e-6)
    assert not torch.isfinite(got[4]).any()
    values, ids = stable_top(got, 9)
    for r in range(5):
        v, i = stable_top(got[r], 9)
        assert torch.equal(ids[r], i) and torch.equal(values[r], v)
