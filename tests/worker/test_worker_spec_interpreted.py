"""The verify stage (program/verify.py) with the Triton acceptance kernel (the CUDA route's
kernel) run by Triton's interpreter on the CPU, against the plain-torch reference the CPU route
uses: the same inputs the engine builds (K+1 masks along the drafts, per-position penalties,
greedy, sampled and constrained rows in one batch, rows with fewer drafts than K) give the same
accepted prefixes and tokens."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.support.kernel_backends import INTERPRETED, run_interpreted


@pytest.mark.skipif(not INTERPRETED, reason="runs inside the interpreted process only")
def test_verify_kernel_equals_reference_interpreter(monkeypatch):
    from kernels.acceptance import accept_drafts
    from kernels.acceptance_ref import accept_drafts_ref
    from services.worker.program.verify import Verifier
    from shared.contract import OutputConstraint
    from shared.generation import RequestOptions, SamplingParams
    from tests.support.worker_support import greedy, no_z_domain, open_client, tiny_runtime
    from tests.worker.test_worker_spec import Scripted, run_all, with_proposer

    compared = []

    def both(*args, **kw):
        got, want = accept_drafts(*args, **kw), accept_drafts_ref(*args, **kw)
        n = want.num_tokens
        live = torch.arange(want.tokens.shape[1])[None] < n[:, None]
        assert torch.equal(got.num_tokens, n) and torch.equal(got.accepted, want.accepted)
        assert torch.equal(got.status, want.status)
        assert torch.equal(torch.where(live, got.tokens, 0), torch.where(live, want.tokens, 0))
        compared.append(int(n.sum()))
        return want

    init = Verifier.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._accept = both

    monkeypatch.setattr(Verifier, "__init__", patched)
    runtime = tiny_runtime(no_z_domain())

    async def main():
        client = open_client(runtime, max_batch=3, max_len=96, speculative="ngram",
                             num_draft_tokens=3)
        with_proposer(client, Scripted(lambda c, k: c[-k:]), 3)
        sampled = RequestOptions(max_tokens=8, sampling=SamplingParams(
            temperature=0.8, top_k=5, seed=2, presence_penalty=0.3))
        try:
            await run_all(client, runtime, [
                ("g", "abab", greedy(8)),
                ("c", "x", greedy(8, constraint=OutputConstraint.regex("(ab|cd)+x"))),
                ("s", "cdcd", sampled)])
        finally:
            await client.aclose()

    asyncio.run(main())
    assert len(compared) >= 5


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_verify_kernel_under_interpreter():
    run_interpreted(__file__, timeout=600)
