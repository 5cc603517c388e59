"""Greedy sampling as a masked argmax (kernels/sampling_greedy.py) against the reference sampler
at temperature 0 (kernels/sampling_ref.py), which sorts every row.

Contract (kernels/sampling_contract.py): "T = 0 takes the largest z in A, ties to the smaller id";
DEAD_END when A is empty; NONFINITE when a legal value is NaN or +inf, or every legal value is
-inf; illegal values are never inspected.
"""

from __future__ import annotations

import pytest
import torch

from kernels.sampling_contract import PenaltyHistory, SampleStatus, SamplingParams, mask_words
from kernels.sampling_greedy import sample_greedy
from kernels.sampling_ref import sample_reference

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


def _case(device, dtype):
    gen = torch.Generator().manual_seed(3)
    n, v = 8, 100
    z = torch.randn(n, v + 4, generator=gen).to(dtype)  # 4 padding columns never read
    z[:, v:] = 1e4
    z[0, 7] = z[0, 42] = z[0].max() + 1  # a tie: the smaller id wins
    z[1, 5] = float("nan")  # NaN, illegal in row 1's mask below: never inspected
    z[2, 9] = float("inf")  # a legal +inf: NONFINITE
    z[3, :] = float("-inf")  # nothing finite: NONFINITE
    z[6, 50] = float("nan")  # NaN in an unconstrained row: NONFINITE
    words = mask_words(v)
    mask = torch.zeros(n, words, dtype=torch.int32)
    allowed = {1: [3, 4, 6, 70], 2: [9, 10], 3: [1, 2], 5: list(range(0, v, 3))}
    for row, ids in allowed.items():
        for t in ids:
            mask[row, t // 32] |= (1 << (t % 32)) if t % 32 != 31 else -(1 << 31)
    mask_row = torch.tensor([-1, 1, 2, 3, 4, 5, -1, -1], dtype=torch.int32)  # row 4: empty mask
    return z.to(device), mask.to(device), mask_row.to(device), v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_matches_the_reference(device, dtype):
    z, mask, mask_row, v = _case(device, dtype)
    params = SamplingParams.from_rows(z.shape[0], temperature=0.0, seed=list(range(8)),
                                      position=5, device=device)
    want = sample_reference(z, params, vocab_size=v, mask=mask, mask_row=mask_row)
    got = sample_greedy(z, vocab_size=v, mask=mask, mask_row=mask_row)
    assert got.status.tolist() == want.status.tolist()
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.prob.tolist() == want.prob.tolist()
    statuses = got.status.tolist()
    assert statuses[0] == SampleStatus.OK and got.tokens[0] == 7  # tie to the smaller id
    assert statuses[1] == SampleStatus.OK and statuses[4] == SampleStatus.DEAD_END
    assert statuses[2] == statuses[3] == statuses[6] == SampleStatus.NONFINITE
    # unconstrained batch: no mask code at all
    clean = z[[0, 5, 7]]
    p3 = SamplingParams.from_rows(3, temperature=0.0, device=device)
    assert sample_greedy(clean, vocab_size=v).tokens.tolist() == \
        sample_reference(clean, p3, vocab_size=v).tokens.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_with_penalties_matches_the_reference(device):
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(3, 64, generator=gen).to(device)
    top = z.argmax(dim=1)
    ids = torch.stack([top, (top + 1) % 64], dim=1).to(torch.int32)
    history = PenaltyHistory(
        ids, torch.tensor([[2, 0], [1, 1], [0, 0]], dtype=torch.int32).to(device)
    )
    params = SamplingParams.from_rows(3, temperature=0.0, repetition_penalty=[1.5, 1.0, 2.0],
                                      presence_penalty=[0.5, 3.0, 0.0], frequency_penalty=0.7,
                                      device=device)
    want = sample_reference(z, params, vocab_size=64, penalties=history)
    got = sample_greedy(z, vocab_size=64, penalties=history, params=params)
    assert (
        got.tokens.tolist() == want.tokens.tolist() and got.status.tolist() == want.status.tolist()
    )
    with pytest.raises(ValueError, match="params"):
        sample_greedy(z, vocab_size=64, penalties=history)


def test_in_graph_sample_stage_equals_the_sampler():
    """program/sampling.py: the sample stage the decode graph captures (never-generable ids
    excluded, masked argmax) picks what `Sampler.sample` picks for unconstrained greedy rows,
    including a never-generable id holding the largest logit."""
    from types import SimpleNamespace

    from services.worker.program.sampling import Sampler
    from tests.support.worker_support import no_z_domain

    domain = no_z_domain()
    sampler = Sampler(domain, torch.device("cpu"))
    z = torch.randn(
        4, domain.size + 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64
    )
    z[1, ord("z")] = 100.0  # never generable: must not win
    rows = [SimpleNamespace(sampling=SimpleNamespace(temperature=0.0), penalized=lambda: False)
            for _ in range(4)]
    tokens, status = sampler.greedy_in_graph(z)
    want = sampler.sample(z, rows, None, None)
    assert tokens.tolist() == want.tokens.tolist() and status.tolist() == want.status.tolist()
    assert int(tokens[1]) != ord("z")
    assert sampler.graph_ready(rows)
    rows[2] = SimpleNamespace(sampling=SimpleNamespace(temperature=0.0), penalized=lambda: True)
    assert not sampler.graph_ready(rows)  # a penalized row needs the penalty pass


def test_sampler_parameters_follow_batch_membership():
    """Issue 14: "per-batch parameters kept on the device and updated only when the batch's
    membership changes": the same requests in the same order reuse the uploaded parameters
    (only the positions are new); another membership or order rebuilds them."""
    from types import SimpleNamespace

    from services.worker.program.sampling import Sampler
    from tests.support.worker_support import byte_domain

    def request(t, seed):
        return SimpleNamespace(sampling=SimpleNamespace(
            temperature=t, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
            presence_penalty=0.0, frequency_penalty=0.0), seed=seed, num_output_tokens=0)

    sampler = Sampler(byte_domain(), torch.device("cpu"))
    a, b = request(0.7, 11), request(1.2, 22)
    first = sampler.params([a, b])
    a.num_output_tokens, b.num_output_tokens = 3, 5
    second = sampler.params([a, b])
    assert second.temperature is first.temperature and second.seed is first.seed  # reused
    assert second.position.tolist() == [3, 5] and first.position.tolist() == [0, 0]
    swapped = sampler.params([b, a])
    assert swapped.temperature is not first.temperature
    assert swapped.seed.tolist() == [22, 11] and swapped.position.tolist() == [5, 3]
    assert swapped.temperature.tolist() == pytest.approx([1.2, 0.7])
