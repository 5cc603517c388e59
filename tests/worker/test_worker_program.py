"""Program: lanes, mask buffers and descriptors, per-row results, and a commit of device state
only (ledgers are the Request's: tests/worker/test_worker_engine_commit.py)."""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids
from services.worker.output.session import OutputSession
from services.worker.program import BatchRow, Program, RowOutcome, StepBatch
from services.worker.request import Request
from shared.contract import OutputConstraint
from shared.errors import ConstraintDeadEnd, InternalError
from shared.generation import SamplingParams
from tests.support.common import byte_domain
from tests.support.worker_support import hooked, no_z_domain, tiny_runtime


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


@pytest.fixture(scope="module")
def compiler():
    return ModelCompiler(byte_domain())


def make_request(runtime, rid: str, text: str, session: OutputSession, *, seed: int = 0,
                 temperature: float = 1.0) -> Request:
    return Request(
        rid,
        tuple(runtime.tokenizer.encode(text)),
        SamplingParams(temperature=temperature),
        seed,
        session,
        sink=lambda e: None,
        max_new_tokens=32,
    )


def prefill_batch(program: Program, requests) -> StepBatch:
    for r in requests:
        r.lane = program.acquire_lane()
    return StepBatch(tuple(BatchRow(r, r.prompt_ids, 0, True) for r in requests))


def test_buffers_are_allocated_once_with_the_design_shapes(runtime):
    """Design: "pinned host and device mask buffers of shape [B, K+1, ceil(V/32)] int32 allocated
    once at start"; the KV cache holds one region per lane."""
    program = Program(runtime, max_batch=3, max_len=40, max_drafts=2)
    words = (runtime.domain.size + 31) // 32
    masks = program.masks
    assert masks.host.shape == (3, 3, words) and masks.host.dtype == torch.int32
    assert masks.device_masks.shape == (3, 3, words)
    assert program.state.lanes == 3 and program.state.max_len == 40
    assert [program.acquire_lane() for _ in range(4)] == [0, 1, 2, None]
    program.release_lane(1)
    assert program.acquire_lane() == 1


def test_mixed_batch_masks_only_constrained_rows(runtime, compiler):
    """Design: "In a mixed batch unconstrained rows use an explicit disabled descriptor instead of
    materializing an all-ones vocabulary mask", and masks apply before candidate selection: every
    sampled constrained token is legal by a fresh xgrammar matcher's mask."""
    domain = runtime.domain
    grammar = compiler.compile(OutputConstraint.regex("[0-9]{2,4}")).grammar
    legal_mask = xgr.allocate_token_bitmask(1, domain.size)
    grammar.matcher().fill_mask(legal_mask, 0)
    legal = set(legal_ids(legal_mask[0], domain.size))
    for seed in range(6):
        program = Program(runtime, max_batch=2, max_len=40)
        free = make_request(runtime, "free", "abc", OutputSession(domain), seed=seed)
        digits = make_request(runtime, "num", "abc", OutputSession(domain, grammar), seed=seed)
        pending = program.step(prefill_batch(program, [free, digits]))
        assert [r.outcome for r in pending.results] == [RowOutcome.TOKENS, RowOutcome.TOKENS]
        assert pending.results[1].tokens[0] in legal
        assert program.masks.host_row[:2].tolist() == [-1, 1]  # row 0 disabled, row 1 -> row 1
        assert not program.masks.host[0].any()  # no all-ones mask was written for row 0


def committed(request: Request, text: str) -> Request:
    """`request` with `text` already committed as output (session and ledger)."""
    tokens = [ord(c) for c in text]
    request.session.preview(tokens)
    request.session.confirm()
    request.commit(0, tokens)
    return request


def test_per_row_results_and_partial_commit():
    """Design: "the PendingBatch carries an explicit per-row result that separates normal output
    from a request-level constraint failure. The failed row commits zero tokens"; non-finite
    logits are "reported separately" and "never continue through token 0". The Program's commit
    is device state only: no ledger moves there."""
    runtime, model = hooked(tiny_runtime(no_z_domain()))
    domain = runtime.domain
    compiler = ModelCompiler(domain)
    az = compiler.compile(OutputConstraint.choice(["az"])).grammar
    only_a = compiler.compile(OutputConstraint.choice(["a"])).grammar
    program = Program(runtime, max_batch=4, max_len=40)
    free = make_request(runtime, "free", "hello", OutputSession(domain), temperature=0.0)
    dead = committed(make_request(runtime, "dead", "hello", OutputSession(domain, az)), "a")
    eos = committed(make_request(runtime, "eos", "hello", OutputSession(domain, only_a)), "a")
    nan = make_request(runtime, "nan", "hello", OutputSession(domain))
    model.after = lambda logits, positions, lanes: logits[3].fill_(float("nan"))
    pending = program.step(prefill_batch(program, [free, dead, eos, nan]))
    outcomes = [r.outcome for r in pending.results]
    assert outcomes == [
        RowOutcome.TOKENS,
        RowOutcome.DEAD_END,
        RowOutcome.TOKENS,
        RowOutcome.NONFINITE,
    ]
    assert isinstance(pending.results[1].error, ConstraintDeadEnd)
    assert pending.results[1].error.position == 1
    assert pending.results[2].tokens[0] in domain.eos_ids  # the only legal token after "a"
    assert isinstance(pending.results[3].error, InternalError) and pending.results[3].tokens == ()
    program.commit(pending, {0: len(free.prompt_ids)})
    assert free.num_cached == 0 and free.output_ids == []
    assert [r.output_ids for r in (dead, eos, nan)] == [[ord("a")], [ord("a")], []]
