"""DFlash and DFlash2 on a hybrid Qwen3.5 target: a tiny random transformers Qwen3.5 saved with
save_pretrained and served by the Engine on the CPU in float32, with a random draft checkpoint
directory (bench/random_weights.py `write_random_dflash`) whose target_layer_ids tap GDN and
attention layers alike.

Design document, "Speculation": "At temperature 0 speculative output is token-identical to plain
decoding"; section 8 of the seed: DFlash proposes greedily (one-hot q), DFlash2 "the actual sparse
q over 16 candidates"; "DFlash pending features update the context by the actually committed
prefix". Each verification keeps the hybrid state (GDN recurrent state and conv windows) at the
accepted prefix through the model state's commit. Independent bases: the same engine without
speculation (greedy outputs, token for token), and the drafts recomputed from scratch (a fresh
target state over the whole committed sequence, the draft's context written at once).
"""

from __future__ import annotations

import asyncio
import re

import pytest
import torch

from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from shared.errors import Unsupported
from shared.generation import RequestOptions, SamplingParams
from tests.support.qwen35_support import LAYER_TYPES, hf_causal_lm
from tests.support.worker_support import collect, greedy, open_client, text_request
from tests.worker.test_worker_spec_dflash import (
    drafts_from_scratch,
    record_drafts,
    write_checkpoint,
)

TAPS = (1, 2, 3)  # GDN, attention, GDN layers of the target
SCHEMA = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
CASES = [("a", "The capital of France is", greedy(16)),
         ("b", "1, 2, 3,", greedy(16, constraint=OutputConstraint.json_schema(SCHEMA))),
         ("c", "abab", greedy(12, constraint=OutputConstraint.regex("(ab|cd)+x")))]
K = 4


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35")
    hf_causal_lm(seed=3).save_pretrained(str(path))
    return load_runtime(str(path))  # float32 on the CPU


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, runtime):
    assert {LAYER_TYPES[i] for i in TAPS} == {"linear_attention", "full_attention"}
    out = {}
    for kind in ("dflash", "dflash2"):
        path = tmp_path_factory.mktemp(kind)
        write_checkpoint(path, runtime, dflash2=kind == "dflash2", target_layer_ids=TAPS)
        out[kind] = str(path)
    return out


async def _run(runtime, cases=CASES, *, seen=None, wrap=None, prefill_chunk=6, max_batch=3,
               **config):
    client = open_client(runtime, max_batch=max_batch, max_len=96, prefill_chunk=prefill_chunk,
                         num_draft_tokens=K, **config)
    if wrap is not None:
        wrap(client.engine.proposer)
    if seen is not None:
        record_drafts(client.engine.program, seen)
    try:
        results = await asyncio.gather(*(collect(client, text_request(r, p, o, runtime.name))
                                         for r, p, o in cases))
        return [fin for _, fin in results], client.engine
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def baseline(runtime):
    record: dict = {}

    async def run():
        client = open_client(runtime, max_batch=3, max_len=96, prefill_chunk=6)
        client.engine.finish_listeners.append(lambda job: record.__setitem__(
            job.prompt_ids, job.prompt_ids + tuple(job.output_ids)))
        try:
            return [fin for _, fin in await asyncio.gather(*(
                collect(client, text_request(r, p, o, runtime.name)) for r, p, o in CASES))]
        finally:
            await client.aclose()

    return asyncio.run(run()), record


def _same(fins, baseline):
    for got, want in zip(fins, baseline[0]):
        assert got.error is None, got.error
        assert (got.content, got.usage.completion_tokens) == (
            want.content, want.usage.completion_tokens)


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_greedy_with_the_draft_on_a_hybrid_target_equals_greedy_without(runtime, drafts,
                                                                          baseline, kind):
    """The three prompts prefill in one forward padded past the verify width (the tapped
    prefill keeps each row's real token count: padding never enters a lane's recurrent state);
    the partly-accepted test below prefills in chunks of 6 tokens."""
    seen = []
    fins, engine = asyncio.run(_run(runtime, speculative=kind, draft_model=drafts[kind],
                                    seen=seen, prefill_chunk=32))
    _same(fins, baseline)
    assert fins[1].content.startswith("{")  # the constrained row verified its drafts too
    assert engine.speculation.rounds > 0 and len(seen) > 10
    draft = engine.proposer.draft
    assert draft.config.target_layer_ids == TAPS
    for context, got, _ in seen[:: max(1, len(seen) // 8)]:  # the context is the prefix's
        assert got == drafts_from_scratch(runtime, draft, list(context), K)[:len(got)]


def test_partly_accepted_rounds_keep_the_hybrid_state_at_the_accepted_prefix(runtime, drafts,
                                                                             baseline):
    """Rounds whose first j drafts are the greedy continuation (j = 0 .. K in turn, the rest
    the draft's own): every verification keeps j + 1 of the K + 1 fed positions, so the GDN
    recurrent state and conv windows are rolled back to each prefix length, and the draft's
    context holds the committed prefix only (its own drafts equal the from-scratch ones)."""
    futures = baseline[1]
    turn = [0]
    own = []

    def wrap(proposer):
        inner = proposer.eager_drafts

        def eager_drafts(rows, anchors, starts, lanes):
            ids, q_ids, q_probs = inner(rows, anchors, starts, lanes)
            ids = ids.clone()
            for i, row in enumerate(rows):
                job = row.request
                done = job.prompt_ids + tuple(job.output_ids)
                own.append((done, ids[i].tolist()))
                j = turn[0] % (K + 1)
                turn[0] += 1
                right = list(futures[job.prompt_ids][len(done):len(done) + j])
                ids[i, :len(right)] = torch.tensor(right)
            return ids, q_ids, q_probs

        proposer.eager_drafts = eager_drafts

    fins, engine = asyncio.run(_run(runtime, speculative="dflash", draft_model=drafts["dflash"],
                                    wrap=wrap))
    _same(fins, baseline)
    s = engine.speculation
    assert s.rounds > 10 and 0 < s.accepted < s.drafts
    draft = engine.proposer.draft
    for context, got in own[:: max(1, len(own) // 8)]:
        assert got == drafts_from_scratch(runtime, draft, list(context), K)


def test_preempted_requests_resume_with_their_draft_context(runtime, drafts, baseline):
    """Three requests through two lanes, preempted at once: a paused request resumes in a lane
    by Replay (the hybrid state and the draft's context rebuilt for what it prefills again)
    and its output stays plain greedy's."""
    fins, engine = asyncio.run(_run(runtime, speculative="dflash", draft_model=drafts["dflash"],
                                    max_batch=2, preempt_after_s=0.0))
    _same(fins, baseline)
    assert engine.metrics.preemptions._value.get() >= 1 and engine.speculation.rounds > 0


def test_dflash2_sampled_rounds_on_a_hybrid_target_use_the_sparse_q(runtime, drafts):
    """T > 0: the drafts come with their q over the selector's candidates (min(1, p/q)
    acceptance); outputs stay in the constraint's language; one seed, one stream."""
    seen = []
    opts = RequestOptions(max_tokens=16, constraint=OutputConstraint.regex("(ab|abc|c)+d"),
                          sampling=SamplingParams(temperature=1.0, seed=3))
    fins, engine = asyncio.run(_run(runtime, [(f"s{i}", "abc", opts) for i in range(2)],
                                    speculative="dflash2", draft_model=drafts["dflash2"],
                                    seen=seen))
    qs = [(d, q) for _, d, q in seen if q is not None]
    assert qs and len(qs) == len(seen) and engine.speculation.rounds > 0
    for got, (q_ids, q_probs) in qs:
        assert q_ids.shape == (len(got), 6)
        assert torch.allclose(q_probs.sum(-1), torch.ones(len(got)))
        for t, ids, q in zip(got, q_ids, q_probs):  # each draft was a candidate, q > 0
            assert q[(ids == t).nonzero()[0, 0]] > 0
    for fin in fins:
        assert fin.error is None
        if fin.finish_reason.value == "stop":
            assert re.fullmatch("(ab|abc|c)+d", fin.content)
    assert fins[0].content == fins[1].content


def test_draft_targets_are_checked(runtime, drafts):
    """A Qwen3.5 target is served (check_model); a draft tapping past its layers is refused
    (field draft_model); other targets stay refused (field speculative)."""
    from services.worker.engine import Engine, EngineConfig
    from services.worker.spec import check_model

    check_model("dflash", runtime.model)
    check_model("dflash2", runtime.model)
    with pytest.raises(Unsupported) as exc:
        check_model("dflash", torch.nn.Linear(2, 2))
    assert exc.value.field == "speculative"
    path = drafts["dflash"] + "-far"
    import os

    os.makedirs(path)
    write_checkpoint(path, runtime, dflash2=False, target_layer_ids=(1, len(LAYER_TYPES)))
    with pytest.raises(Unsupported, match="target_layer_ids") as exc:
        Engine(runtime, None, EngineConfig(speculative="dflash", draft_model=path, max_len=64))
    assert exc.value.field == "draft_model"


def test_a_draft_in_the_published_qwen35_layout_loads(runtime, tmp_path):
    """config.json as published Qwen3.5 DFlash drafts spell it (block_size and rope_theta at the
    top level, dflash_config holding only mask_token_id and target_layer_ids, model_type qwen3,
    num_target_layers), tensors under the loader's names: the Engine loads it for the Qwen3.5
    target by its config and names."""
    import json

    raw = write_checkpoint(tmp_path, runtime, dflash2=False, target_layer_ids=TAPS)
    layout = {k: v for k, v in raw.items() if k not in ("dflash_config", "rope_parameters")}
    layout.update(block_size=3, rope_theta=1e7, rope_scaling=None, model_type="qwen3",
                  num_target_layers=len(LAYER_TYPES), dtype="bfloat16",
                  dflash_config={"mask_token_id": runtime.domain.size - 2,
                                 "target_layer_ids": list(TAPS)})
    (tmp_path / "config.json").write_text(json.dumps(layout))
    from services.worker.engine import Engine, EngineConfig

    engine = Engine(runtime, None, EngineConfig(speculative="dflash", draft_model=str(tmp_path),
                                                max_len=64, num_draft_tokens=4))
    c = engine.proposer.config
    assert (c.block_size, c.mask_token_id, c.target_layer_ids, c.rope.theta) == (
        3, runtime.domain.size - 2, TAPS, 1e7)
    assert engine.proposer.k == 2  # block_size - 1 drafts a round
