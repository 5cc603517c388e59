"""DFlash and DFlash2 draft models (models/dflash.py, services/worker/spec/dflash.py) loaded from
a checkpoint directory built here with random weights, on a tiny random dense target.

Design document, section 8: drafts are never constrained; DFlash proposes greedily (one-hot q),
DFlash2 "the actual sparse q over 16 candidates", accepted with min(1, p/q), "q is never revised
retroactively". Independent bases: greedy outputs of the same engine without speculation (token
for token), and the draft recomputed from scratch (a fresh target pass over the whole committed
sequence, the context written at once, one block) for the drafts the engine proposed.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import torch

from bench.random_weights import write_random_dflash
from services.worker.models.dflash import load_dflash
from shared.contract import OutputConstraint
from shared.errors import InvalidRequest, Unsupported
from shared.generation import RequestOptions, SamplingParams
from tests.support.worker_support import collect, greedy, open_client, text_request, tiny_runtime

CASES = [("a", "hello hello", greedy(18)),
         ("b", "abab", greedy(18, constraint=OutputConstraint.regex("(ab|cd)+x"))),
         ("c", "json", greedy(18, constraint=OutputConstraint.json_schema(
             {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})))]


def write_checkpoint(path, runtime, *, dflash2: bool, seed: int = 5,
                     target_layer_ids: tuple[int, ...] = (0, 1)) -> dict:
    """A small random draft for `runtime`'s target (a sliding-window layer and a full one)."""
    extra = {"selector_rank": 8, "selector_top_k": 6, "final_logit_softcapping": 30.0} \
        if dflash2 else {}
    return write_random_dflash(
        str(path), runtime.config, mask_token_id=runtime.domain.size - 1, dflash2=dflash2,
        block=5, target_layer_ids=target_layer_ids, seed=seed, std=0.4,
        config={"intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "rms_norm_eps": 1e-5, "is_causal": False,
                "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6},
        dflash_config={"output_multiplier": 0.9, **extra})


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, runtime):
    out = {}
    for kind in ("dflash", "dflash2"):
        path = tmp_path_factory.mktemp(kind)
        write_checkpoint(path, runtime, dflash2=kind == "dflash2")
        out[kind] = str(path)
    return out


def record_drafts(program, seen: list) -> None:
    """Record (committed context, drafts, draft q) of every row the Program drafted."""
    inner = program.rounds.device

    def device_verify(batch):
        pending = inner(batch)
        for row in pending.batch.rows:
            if row.num_drafts:
                job = row.request
                seen.append((job.prompt_ids + tuple(job.output_ids), list(row.tokens[1:]),
                             row.draft_q))
        return pending

    program.rounds.device = device_verify


async def _run(runtime, cases, *, speculative=None, draft=None, seen=None, k=4):
    client = open_client(runtime, max_batch=3, max_len=128, prefill_chunk=6,
                         speculative=speculative, draft_model=draft, num_draft_tokens=k)
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
    fins, _ = asyncio.run(_run(runtime, CASES))
    return fins


@torch.inference_mode()
def drafts_from_scratch(runtime, draft, sequence, k):
    """Greedy DFlash drafts after `sequence` (its last token is the anchor): a fresh target
    state (dense KV, or a hybrid model's KV and recurrent state) over the whole sequence."""
    model, n = runtime.model, len(sequence)
    state = model.new_state(1, n, dtype=runtime.dtype, device="cpu")
    lane = torch.tensor([0])
    _, feats = model.hidden_states(torch.tensor([sequence]), torch.arange(n)[None], state, lane,
                                   tap=tuple(draft.config.target_layer_ids))
    ctx = draft.new_cache(1, n + k + 1, dtype=runtime.dtype, device="cpu")
    draft.write_context(feats[:, :n - 1], torch.arange(n - 1)[None], ctx, lane)
    ids = torch.tensor([[sequence[-1]] + [draft.config.mask_token_id] * k])
    hidden = draft.block(model.model.embed_tokens(ids), (n - 1 + torch.arange(k + 1))[None], ctx,
                         lane, torch.tensor([n - 1]))[:, 1:]
    z = draft.logits(hidden, model.output_weight)[..., :runtime.domain.size]
    if not draft.config.dflash2:
        return z.argmax(-1)[0].tolist()
    tokens, _, _ = draft.select(hidden, z, ids[:, 0], torch.zeros(1), torch.zeros(1, k))
    return tokens[0].tolist()


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_greedy_with_the_draft_model_equals_greedy_without(runtime, checkpoints, baseline, kind):
    seen = []
    fins, engine = asyncio.run(_run(runtime, CASES, speculative=kind, draft=checkpoints[kind],
                                    seen=seen))
    for got, want in zip(fins, baseline):
        assert got.error is None, got.error
        assert (got.content, got.usage.completion_tokens) == (
            want.content,
            want.usage.completion_tokens,
        )
    assert engine.speculation.rounds > 0 and len(seen) > 10
    draft = engine.proposer.draft
    assert engine.program.draft_wait_seconds > 0
    for context, drafts, _ in seen[:: max(1, len(seen) // 8)]:  # the context is the prefix's
        assert drafts == drafts_from_scratch(runtime, draft, list(context), 4)[:len(drafts)]


def test_dflash2_sampled_rounds_use_the_sparse_q(runtime, checkpoints):
    """T > 0: the drafts come with their q over the selector's candidates and are verified
    with min(1, p/q); outputs stay in the constraint's language."""
    seen = []
    opts = RequestOptions(max_tokens=24, constraint=OutputConstraint.regex("(ab|abc|c)+d"),
                          sampling=SamplingParams(temperature=1.0, seed=3))
    cases = [(f"s{i}", "abc", opts) for i in range(2)]
    fins, engine = asyncio.run(_run(runtime, cases, speculative="dflash2",
                                    draft=checkpoints["dflash2"], seen=seen))
    qs = [(drafts, q) for _, drafts, q in seen if q is not None]
    assert qs and len(qs) == len(seen) and engine.speculation.rounds > 0
    for drafts, (q_ids, q_probs) in qs:
        assert q_ids.shape == (len(drafts), 6)
        assert torch.allclose(q_probs.sum(-1), torch.ones(len(drafts)))
        for t, ids, q in zip(drafts, q_ids, q_probs):  # each draft was a candidate, q > 0
            assert q[(ids == t).nonzero()[0, 0]] > 0
    for fin in fins:
        assert fin.error is None
        if fin.finish_reason.value == "stop":
            assert re.fullmatch("(ab|abc|c)+d", fin.content)
    assert fins[0].content == fins[1].content  # one seed, one stream


def test_draft_checkpoints_are_checked(runtime, checkpoints, tmp_path):
    from services.worker.engine import Engine, EngineConfig

    with pytest.raises(Unsupported) as exc:  # a DFlash2 checkpoint asked to run as DFlash
        Engine(
            runtime, None, EngineConfig(speculative="dflash", draft_model=checkpoints["dflash2"])
        )
    assert exc.value.field == "draft_model"
    with pytest.raises(InvalidRequest) as exc:
        Engine(runtime, None, EngineConfig(speculative="dflash", draft_model=str(tmp_path / "no")))
    assert exc.value.field == "draft_model"
    small = tiny_runtime(hidden_size=32)
    with pytest.raises(Unsupported, match="hidden_size"):
        Engine(small, None, EngineConfig(speculative="dflash", draft_model=checkpoints["dflash"]))
    model = load_dflash(checkpoints["dflash2"])
    assert model.config.dflash2 and model.layers[0].attention_conv is not None
    assert model.layers[0].window == 6 and model.layers[1].window is None
