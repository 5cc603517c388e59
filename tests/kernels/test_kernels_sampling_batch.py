"""Device-resident sampling parameters (kernels/sampling_batch.py) against
`SamplingParams.from_rows` and the sampling reference."""

from __future__ import annotations

import pytest
import torch

from kernels.sampling_batch import DeviceSamplingParams, RowSampling
from kernels.sampling_contract import SamplingParams
from kernels.sampling_ref import sample_reference

ROWS = [RowSampling(temperature=0.7, top_k=40, top_p=0.9, seed=11),
        RowSampling(temperature=0.0, seed=-5),
        RowSampling(temperature=1.3, top_k=5, min_p=0.05, repetition_penalty=1.2,
                    presence_penalty=0.5, frequency_penalty=0.25, seed=2**62)]


def as_rows(rows, positions, device="cpu") -> SamplingParams:
    cols = {f: [getattr(r, f) for r in rows] for f in RowSampling.__dataclass_fields__}
    return SamplingParams.from_rows(len(rows), position=list(positions), device=device, **cols)


def assert_params_equal(a: SamplingParams, b: SamplingParams) -> None:
    for f in SamplingParams.__dataclass_fields__:
        assert torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()), f


def _devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _devices())
def test_assign_then_advance_on_device(device):
    """Issue 14: "per-batch parameters kept on the device and updated only when the batch's
    membership changes": the views equal freshly built SamplingParams, positions advance by each
    row's committed count on the device, and the views keep their addresses across assignments."""
    buf = DeviceSamplingParams(4, device)
    buf.assign(ROWS, [0, 7, 3])
    params = buf.params()
    assert_params_equal(params, as_rows(ROWS, [0, 7, 3]))
    addresses = [getattr(params, f).data_ptr() for f in SamplingParams.__dataclass_fields__]
    buf.advance(1)
    buf.advance(torch.tensor([2, 0, 5], device=device))
    assert_params_equal(buf.params(), as_rows(ROWS, [3, 8, 9]))
    buf.assign(ROWS[::-1][:2], [4, 1])  # membership and order change
    again = buf.params()
    assert_params_equal(again, as_rows(ROWS[::-1][:2], [4, 1]))
    assert [getattr(again, f).data_ptr() for f in SamplingParams.__dataclass_fields__] == addresses
    padded = buf.params(4)  # a graph padded to 4 rows: never-assigned rows are greedy defaults
    assert padded.rows == 4 and float(padded.temperature[3]) == 0.0
    assert float(padded.top_p[3]) == 1.0 and float(padded.repetition_penalty[3]) == 1.0


def test_sampling_with_resident_params_equals_fresh_params():
    """The kernels read the same values: the reference samples identical tokens from both."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 1001, generator=gen)
    buf = DeviceSamplingParams(3, "cpu")
    buf.assign(ROWS, [5, 6, 7])
    a = sample_reference(logits, buf.params(), vocab_size=1001)
    b = sample_reference(logits, as_rows(ROWS, [5, 6, 7]), vocab_size=1001)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.uniform, b.uniform)


def test_candidate_width_summaries():
    """The route is chosen on the host: an argmax for greedy-only batches, max(top_k) when every
    sampled row has one, a full sort otherwise."""
    buf = DeviceSamplingParams(3, "cpu")
    buf.assign([ROWS[1], ROWS[1]], [0, 0])
    assert buf.greedy_only and buf.candidate_width(1000) == 1
    buf.assign([ROWS[0], ROWS[1], ROWS[2]], [0, 0, 0])
    assert not buf.greedy_only and buf.candidate_width(1000) == 40
    assert buf.candidate_width(30) == 30
    buf.assign([ROWS[0], RowSampling(temperature=1.0)], [0, 0])
    assert buf.candidate_width(1000) is None


def test_bad_rows_name_the_field():
    with pytest.raises(ValueError, match=r"top_p\[0\]"):
        RowSampling(top_p=0.0)
    with pytest.raises(ValueError, match=r"temperature\[0\]"):
        RowSampling(temperature=float("inf"))
    buf = DeviceSamplingParams(2, "cpu")
    with pytest.raises(ValueError, match="at most 2 rows"):
        buf.assign(ROWS, [0, 0, 0])
    with pytest.raises(ValueError, match=r"position\[1\]"):
        buf.assign(ROWS[:2], [0, -1])
    buf.assign(ROWS[:2], [0, 0])
    with pytest.raises(ValueError, match="counts"):
        buf.advance(torch.tensor([1.0, 1.0]))
