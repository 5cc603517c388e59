"""The KV budget pays for a DFlash draft's context cache (program/budget.py), on a dense and on a
hybrid Qwen3.5 target: the lanes are the longest whose model state (KV pool, recurrent state,
snapshot slots, verify buffers) and the draft's per-lane context cache together fit. Independent
basis: the bytes the Program and the proposer actually allocate."""

from __future__ import annotations

import pytest
import torch

from bench.random_weights import ByteTokenizer, random_qwen35
from services.worker.engine import Engine, EngineConfig
from services.worker.models.dflash import load_dflash
from services.worker.program import Program
from services.worker.program.budget import lane_length
from services.worker.runtime import ModelRuntime
from shared.frontends.frontend import Frontend
from tests.support.common import byte_domain
from tests.support.worker_support import tiny_runtime
from tests.worker.test_worker_spec_dflash import write_checkpoint
from tests.worker.test_worker_spec_mtp import SHAPE

K, LANES, N = 4, 2, 64


def _qwen35():
    d = byte_domain()
    model = random_qwen35(dtype=torch.float32, device="cpu", vocab_size=d.size, seed=3, **SHAPE)
    return ModelRuntime("q35-tiny", model, model.config, Frontend("q35-tiny", d, ByteTokenizer(d)))


@pytest.fixture(scope="module", params=["dense", "qwen35"])
def target(request, tmp_path_factory):
    runtime = tiny_runtime() if request.param == "dense" else _qwen35()
    path = tmp_path_factory.mktemp(f"draft-{request.param}")
    write_checkpoint(path, runtime, dflash2=False)
    return runtime, str(path)


def _engine(runtime, budget: int, draft: str | None) -> Engine:
    return Engine(runtime, None, EngineConfig(
        max_batch=LANES, kv_budget_bytes=budget, num_draft_tokens=K,
        speculative="dflash" if draft else "ngram", draft_model=draft))


def test_the_draft_context_cache_is_paid_from_the_kv_budget(target):
    """A budget of exactly the state of N-position lanes plus the draft's cache of N positions
    per lane gives lanes of N positions with the draft, one byte less gives shorter ones, and
    without the draft the same budget buys longer lanes: the pool shrank by the cache's bytes."""
    runtime, path = target
    per_position = load_dflash(path).cache_bytes_per_position(runtime.dtype)
    state = Program(runtime, max_batch=LANES, max_len=N, max_drafts=K).state.nbytes
    cache = LANES * N * per_position
    assert per_position > 0
    engine = _engine(runtime, state + cache, path)
    program = engine.program
    assert program.max_len == N and program.state.nbytes == state
    got = engine.proposer.cache
    assert got.numel() * got.element_size() == cache  # what was paid is what was allocated
    assert _engine(runtime, state + cache - 1, path).program.max_len < N
    alone = Program(runtime, max_batch=LANES, kv_budget_bytes=state, max_drafts=K)
    assert alone.max_len == N and alone.state.nbytes == state  # the budget less the cache
    assert _engine(runtime, state + cache, None).program.max_len > N  # no draft: longer lanes


def test_a_budget_without_room_for_one_position_beside_the_cache_is_refused(target):
    runtime, path = target
    per_position = load_dflash(path).cache_bytes_per_position(runtime.dtype)
    state = Program(runtime, max_batch=LANES, max_len=16, max_drafts=K,
                    prefix_cache=False).state.nbytes
    with pytest.raises(ValueError, match="draft's context cache"):
        lane_length(runtime.model, LANES, state, runtime.dtype, per_position=per_position,
                    paid=0, verify_width=K + 1)
    assert lane_length(runtime.model, LANES, state + LANES * 16 * per_position, runtime.dtype,
                       per_position=per_position, verify_width=K + 1) == 16
