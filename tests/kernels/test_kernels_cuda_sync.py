"""Issue 14: "Sampling with no host synchronisation in the step": the kernel entry points the
decode step calls never synchronise with the host (torch's sync debug mode raises if they do)."""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_decode_step_kernels_do_not_synchronise():
    from kernels.acceptance import accept_drafts
    from kernels.acceptance_contract import PositionState, speculative_penalties
    from kernels.norms import add_rms_norm
    from kernels.paged_attention import paged_attention
    from kernels.qkv_prepare import prepare_qkv
    from kernels.sampling import sample
    from kernels.sampling_batch import DeviceSamplingParams, RowSampling
    from kernels.sampling_contract import PenaltyHistory
    from kernels.swiglu import swiglu
    dev, dt, v = "cuda", torch.bfloat16, 151_936
    b, k = 8, 4
    x = torch.randn(b, 4096, device=dev, dtype=dt)
    w = torch.randn(4096, device=dev, dtype=dt)
    qkv = torch.randn(b, 1, 48 * 128, device=dev, dtype=dt)
    q, kk, vv = (qkv[..., s:e].view(b, 1, -1, 128) for s, e in ((0, 4096), (4096, 5120),
                                                                (5120, 6144)))
    cs = torch.rand(b, 1, 64, device=dev)
    kc = torch.zeros(b * 8, 16, 8, 128, device=dev, dtype=dt)
    table = torch.arange(b * 8, device=dev, dtype=torch.int32).view(b, 8)
    pos = torch.full((b, 1), 100, device=dev)
    buf = DeviceSamplingParams(b, dev)
    buf.assign([RowSampling(temperature=t) for t in [0.0, 0.7] * (b // 2)], list(range(b)))
    logits = torch.randn(b, v, device=dev, dtype=dt)
    spec_logits = torch.randn(b, k + 1, v, device=dev, dtype=dt)
    drafts = torch.randint(0, v, (b, k), device=dev)
    nd = torch.full((b,), k, dtype=torch.int32, device=dev)
    states = torch.full((b, k + 1), int(PositionState.DISABLED), dtype=torch.int32, device=dev)
    hist = PenaltyHistory(torch.randint(0, v, (b, 30), device=dev, dtype=torch.int32),
                          torch.ones(b, 30, device=dev, dtype=torch.int32))
    torch.cuda.synchronize()
    try:
        with (
            warnings.catch_warnings()
        ):  # "a prototype feature": a warning, which pytest makes an error
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        add_rms_norm(x, x, w, 1e-6)
        swiglu(torch.randn(b, 2 * 12288, device=dev, dtype=dt))
        prepare_qkv(q, kk, vv, cs, cs, kc, kc, table, pos, q_norm=w[:128], k_norm=w[:128])
        paged_attention(q, kc, kc, table, pos, max_seq_len=128)
        params = buf.params()
        sample(logits, params, vocab_size=v, candidate_width=buf.candidate_width(v))
        sample(logits, params, vocab_size=v, candidate_width=1, penalties=hist)
        accept_drafts(spec_logits, params, drafts, nd, states, vocab_size=v,
                      penalties=speculative_penalties(hist, drafts))
        buf.advance(nd)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
