"""Speculative decoding on a tiny random Qwen3.5 model (hybrid GDN + attention, MTP module):
MTP drafts (services/worker/spec/mtp.py) and verification rounds whose partial commits roll the
recurrent state back through the model state's commit (models/qwen35_state.py).

Design document, section 8: "Qwen3.5 MTP: the round's drafts ... are kept with the sequence. The
Forward phase runs the target forward with them; Finish completes acceptance, MTP state alignment
and the next proposal, which stays unconstrained." Independent bases: the same engine without
speculation (greedy outputs, token for token), and the MTP drafts recomputed from scratch (a
fresh state, the whole committed sequence in one pass, then k greedy MTP steps).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from bench.oracle import OracleProposer
from bench.random_weights import ByteTokenizer, random_qwen35
from services.worker.runtime import ModelRuntime
from services.worker.spec import ContextProposer
from shared.contract import OutputConstraint
from shared.errors import Unsupported
from shared.frontends.frontend import Frontend
from tests.support.common import byte_domain
from tests.support.worker_support import collect, greedy, open_client, text_request, tiny_runtime

SHAPE = dict(hidden_size=32, intermediate_size=48, num_heads=2, num_kv_heads=1, head_dim=16,
             rotary_dim=4, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
             linear_value_head_dim=8, max_position_embeddings=512,
             layer_types=("linear_attention", "full_attention"))
CASES = [("a", "hello world", greedy(20)),
         ("b", "abab", greedy(20, constraint=OutputConstraint.regex("(ab|cd)+x"))),
         ("c", "zz", greedy(16))]


@pytest.fixture(scope="module")
def runtime():
    d = byte_domain()
    model = random_qwen35(dtype=torch.float64, device="cpu", vocab_size=d.size, mtp=True, seed=3,
                          **SHAPE)
    return ModelRuntime("q35-tiny", model, model.config, Frontend("q35-tiny", d, ByteTokenizer(d)))


async def _run(runtime, *, speculative=None, k=3, drafter=None, record=None, warmup=False,
               draft_vocab=None, max_batch=3):
    client = open_client(runtime, max_batch=max_batch, max_len=128, prefill_chunk=5,
                         speculative=speculative, num_draft_tokens=k, warmup=warmup,
                         draft_vocab=draft_vocab)
    engine = client.engine
    if drafter is not None:
        engine.proposer = drafter(engine)
    if record is not None:
        engine.finish_listeners.append(
            lambda job: record.__setitem__(job.request_id, job.prompt_ids + tuple(job.output_ids)))
    try:
        results = await asyncio.gather(*(collect(client, text_request(r, p, o, runtime.name))
                                         for r, p, o in CASES))
        return [fin for _, fin in results], engine
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def baseline(runtime):
    record: dict = {}
    fins, _ = asyncio.run(_run(runtime, record=record))
    return fins, record


def _same(fins, baseline):
    for got, want in zip(fins, baseline[0]):
        assert got.error is None, got.error
        assert (got.content, got.usage.completion_tokens) == (
            want.content,
            want.usage.completion_tokens,
        )


@torch.inference_mode()
def _mtp_from_scratch(model, sequence: tuple[int, ...], k: int, vocab: int) -> list[int]:
    """k greedy MTP drafts after `sequence`, from a fresh state over the whole sequence."""
    n = len(sequence)
    state = model.new_state(1, n + k + 1, dtype=torch.float64, device="cpu")
    lane = torch.tensor([0])
    tokens = torch.tensor([sequence])
    hidden = model.hidden_states(tokens[:, :-1], torch.arange(n - 1)[None], state, lane)
    logits, out = model.mtp_forward(hidden, tokens[:, 1:], torch.arange(n - 1)[None], state, lane,
                                    logit_index=torch.tensor([[n - 2]]))
    drafts, pos = [], n - 2
    for step in range(k):
        token = int(logits[0, 0, :vocab].argmax())
        drafts.append(token)
        pos += 1
        if step + 1 < k:
            logits, out = model.mtp_forward(out, torch.tensor([[token]]), torch.tensor([[pos]]),
                                            state, lane)
    return drafts


def _recording(seen: list):
    def recording(engine):
        mtp = engine.proposer
        inner = mtp.propose

        def propose(job, n):
            drafts = inner(job, n)
            if drafts:
                seen.append((job.prompt_ids + tuple(job.output_ids), drafts))
            return drafts

        mtp.propose = propose  # the host route's attach asks it for each row's drafts
        return mtp

    return recording


def test_mtp_greedy_equals_ordinary_and_drafts_match_a_fresh_computation(runtime, baseline):
    seen: list[tuple[tuple[int, ...], list[int]]] = []
    fins, engine = asyncio.run(_run(runtime, speculative="mtp", k=3, drafter=_recording(seen)))
    _same(fins, baseline)
    assert engine.speculation.rounds > 0 and len(seen) > 10
    # The prefill chunks (5 tokens), decode and verify rounds all aligned the MTP context.
    for context, drafts in seen[:: max(1, len(seen) // 8)]:
        want = _mtp_from_scratch(runtime.model, context, 3, runtime.domain.size)
        assert drafts == want[:len(drafts)], context


def test_draft_vocab_drafts_are_the_greedy_choice_among_the_first_ids(runtime, baseline):
    """With `draft_vocab` N every draft is one of the first N token ids, each round's first draft
    (the alignment's) is the greedy choice among them recomputed from scratch, and the output is
    ordinary greedy decoding's (drafts are proposals)."""
    seen: list[tuple[tuple[int, ...], list[int]]] = []
    fins, engine = asyncio.run(_run(runtime, speculative="mtp", k=3, drafter=_recording(seen),
                                    draft_vocab=120))
    _same(fins, baseline)
    assert engine.speculation.rounds > 0 and len(seen) > 10
    assert all(t < 120 for _, drafts in seen for t in drafts)
    assert any(t >= 120 for _, drafts in _full_vocab_drafts(runtime) for t in drafts)
    for context, drafts in seen:
        assert drafts[0] == _mtp_from_scratch(runtime.model, context, 1, 120)[0], context


def _full_vocab_drafts(runtime) -> list:
    seen: list = []
    asyncio.run(_run(runtime, speculative="mtp", k=3, drafter=_recording(seen)))
    return seen


def test_mtp_draft_chains_equal_a_fresh_computation_in_a_reused_lane(runtime, baseline):
    """One lane, the three requests one after another (each row alone in its alignment, so its
    attention bounds are its own, as on the eager route): every round's whole draft chain equals
    the from-scratch computation over the committed sequence. Each draft step attends with its
    own bound (it failed when a step read the bound of the forward before it, blind to its own
    key: the second and later drafts after every eager alignment)."""
    seen: list[tuple[tuple[int, ...], list[int]]] = []
    fins, _ = asyncio.run(_run(runtime, speculative="mtp", k=3, drafter=_recording(seen),
                               max_batch=1))
    _same(fins, baseline)
    bad = [(context, drafts) for context, drafts in seen
           if drafts != _mtp_from_scratch(runtime.model, context, 3, runtime.domain.size)[
               :len(drafts)]]
    assert not bad, bad[:3]


def test_draft_vocab_is_refused_where_it_would_change_nothing():
    """Nothing that is set is silently ignored: a draft vocabulary beside another backend than
    mtp is Unsupported, a count below 1 invalid, each naming the field; the flag reaches serve."""
    from services.cli import build_parser
    from services.worker.spec import check_backend
    from shared.errors import InvalidRequest

    check_backend("mtp", None, 32768)
    for backend in (None, "ngram", "grammar"):
        with pytest.raises(Unsupported) as err:
            check_backend(backend, None, 64)
        assert err.value.field == "draft_vocab"
    with pytest.raises(InvalidRequest) as err:
        check_backend("mtp", None, 0)
    assert err.value.field == "draft_vocab"
    args = build_parser().parse_args(["serve", "--speculative", "mtp", "--draft-vocab", "4096"])
    assert args.draft_vocab == 4096


@pytest.mark.parametrize("corrupt", [False, True])
def test_verification_rolls_the_recurrent_state_back(runtime, baseline, corrupt):
    """The target's own continuation as drafts (all accepted: full commits) or with one wrong
    token per round (partial commits: the GDN state replays the kept prefix only)."""
    oracle = OracleProposer()
    for sequence in baseline[1].values():
        oracle.record(sequence)
    calls = {"n": 0}

    class Proposer:
        def propose(self, context, k):
            drafts = oracle.propose(context, k)
            calls["n"] += 1
            if corrupt and drafts:
                drafts[calls["n"] % len(drafts)] = ord("q")
            return drafts

    fins, engine = asyncio.run(_run(runtime, speculative="ngram", k=4,
                                    drafter=lambda e: ContextProposer(Proposer(), 4)))
    _same(fins, baseline)
    spec = engine.speculation
    assert spec.rounds > 0 and spec.accepted > 0
    assert (spec.accepted < spec.drafts) if corrupt else spec.tokens > 2 * spec.rounds


def test_mtp_after_the_start_up_warm_up_equals_ordinary_greedy(runtime, baseline):
    """The warm-up of a speculative hybrid Program runs verify-width forwards on free lanes and
    commits them partially (the replay kernels), the acceptance kernels and MTP's alignment at
    every prefill shape; none of it may leak into a request: outputs equal ordinary greedy
    decoding."""
    fins, engine = asyncio.run(_run(runtime, speculative="mtp", k=3, warmup=True))
    _same(fins, baseline)
    assert engine.warmup.commits > 0 and engine.warmup.acceptance > 0
    # MTP's alignment ran at every prefill shape the target's warm-up did
    assert engine.warmup.proposer_prefill == engine.warmup.prefill > 0
    assert engine.speculation.rounds > 0


def test_a_steps_drafts_are_read_when_the_next_round_asks(runtime, baseline):
    """After a step the draft pass is launched and not read (on CUDA it runs while the host
    commits the step); the next round's `propose` reads every launched pass at once, and the
    host's wait there is counted as exposed draft time by the next `after_step`."""
    seen = {"after": 0, "proposed": 0}

    def hooked(engine):
        mtp = engine.proposer.inner
        after, propose = mtp.after_step, mtp.propose

        def after_step(pending, hidden):
            waited = after(pending, hidden)
            seen["after"] += bool(mtp._launched)  # launched, not read yet
            return waited

        def proposing(job, n):
            drafts = propose(job, n)
            assert not mtp._launched  # read by the round that asks
            seen["proposed"] += bool(drafts)
            return drafts

        mtp.after_step, mtp.propose = after_step, proposing
        return engine.proposer

    fins, engine = asyncio.run(_run(runtime, speculative="mtp", k=3, drafter=hooked))
    _same(fins, baseline)
    assert seen["after"] > 0 and seen["proposed"] > 0 and engine.speculation.rounds > 0


def test_mtp_needs_an_mtp_module():
    from services.worker.engine import Engine, EngineConfig

    with pytest.raises(Unsupported) as exc:
        Engine(tiny_runtime(), grammar=None, config=EngineConfig(speculative="mtp"))
    assert exc.value.field == "speculative" and "MTP" in exc.value.message


def test_mtp_through_preemption_and_replay(runtime):
    """One lane, two requests, preemption after 0 s: each request is paused after every token it
    produces and resumes by Replay (prefill chunks, no sampling), which rebuilds the MTP context
    in its new lane; outputs equal ordinary greedy decoding."""
    cases = CASES[:2]

    async def run(speculative):
        client = open_client(runtime, max_batch=1, max_len=128, prefill_chunk=5,
                             preempt_after_s=0.0, speculative=speculative, num_draft_tokens=2)
        try:
            results = await asyncio.gather(*(collect(client, text_request(r, p, o, runtime.name))
                                             for r, p, o in cases))
            return [fin for _, fin in results], client.engine
        finally:
            await client.aclose()

    base, _ = asyncio.run(run(None))
    fins, engine = asyncio.run(run("mtp"))
    for got, want in zip(fins, base):
        assert got.error is None and got.content == want.content
    assert engine.speculation.rounds > 0  # drafts proposed right after each Replay
