"""Our Qwen3.5 text model against Hugging Face `transformers`' Qwen3_5ForCausalLM (the independent
oracle) on a tiny random checkpoint with the real 248,320-row vocabulary, 3 Gated DeltaNet and 2
gated-attention layers, written by save_pretrained and read back by our loader.

DESIGN 'Models and token domain': "The model code is our own ... weights load by their Hugging Face
names. Hugging Face transformers is used in tests as an independent oracle (same weights, same
logits within tolerance)."
"""

from __future__ import annotations

import copy

import pytest
import torch

from services.worker.models.config import ModelConfigError
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.models.qwen35_loading import load_qwen35_model
from tests.support.qwen35_support import (
    VOCAB,
    assert_close,
    hf_causal_lm,
    reference_logits,
    run_schedule,
    text_config,
)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small forwards run fastest on one thread on the shared 2-core machine; restored
    afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


CUDA = torch.cuda.is_available()
# (device, dtype, relative tolerance of logits): the CPU in float32, and on the GPU float32 (the
# Triton kernels, all in float32 arithmetic: gdn_chunk keeps float32 off fla-core's TF32 dots) and
# bf16 (the serving dtype; see test_prefill_and_decode_match_transformers for its bound).
SETUPS = [pytest.param(("cpu", torch.float32, 2e-5), id="cpu-fp32")] + [
    pytest.param(
        ("cuda", dtype, tol),
        id=f"cuda-{name}",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")],
    )
    for dtype, tol, name in ((torch.float32, 2e-3, "fp32"), (torch.bfloat16, 6e-2, "bf16"))
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen35"))
    hf = hf_causal_lm(seed=0)
    hf.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def checkpoint(saved):
    path, hf = saved
    model, config = load_qwen35_model(path)
    return path, hf, model, config


@pytest.fixture(params=SETUPS)
def setup(request, saved):
    """(hf, model, device, dtype, tol) for one device/dtype."""
    device, dtype, tol = request.param
    path, hf = saved
    model, _ = load_qwen35_model(path, dtype, device)
    return hf, model, device, dtype, tol


def sequences(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


# Per step, tokens fed per row (0: the row sits out). Row 0: one 40-token prefill chunk (the
# chunked GDN form, > 32 tokens) then decode; row 1: chunks of 5, 9 and 3 beside the others
# (padded rows), then decode; row 2: a 12-token prompt in one chunk, then decode. Eight decode
# steps close every row.
SCHEDULE = ((40, 5, 0), (0, 9, 12), (1, 3, 1)) + ((1, 1, 1),) * 8


def test_prefill_and_decode_match_transformers(setup):
    """Chunked prefill (recurrent and chunked GDN forms), right-padded rows with num_tokens, a row
    sitting out a step, and 8 batched decode steps through the lane state must give, for every real
    token, the logits transformers computes (float32, CPU) for the whole sequence without a
    cache."""
    hf, model, device, dtype, tol = setup
    config = model.config
    assert config.layer_types.count("full_attention") == 2 and len(config.gdn_layers) == 3
    assert config.vocab_size == VOCAB and config.rotary_dim == 4
    lengths = [sum(step[b] for step in SCHEDULE) for b in range(3)]
    seqs = sequences(lengths, seed=1)
    state = model.new_state(5, 64, dtype=dtype, device=device)
    ours = run_schedule(model, state, [3, 0, 1], seqs, SCHEDULE, device=device)
    ref = reference_logits(hf, seqs)
    assert min(r.abs().max().item() for r in ref) > 1.0  # logits spread enough to catch errors
    if dtype != torch.float32:
        # This tiny random model amplifies rounding ~100x: transformers itself in bf16 (its torch
        # path) lands 0.22 of the logit scale away from its float32 logits (ours on the CPU in
        # bf16: 0.19). A fixed 6e-2 is below the oracle's own bf16 noise; ours may be at most 1.5x
        # as far from the float32 reference as the oracle's bf16 run is, and at least `tol`.
        own = reference_logits(copy.deepcopy(hf).to(dtype), seqs)
        tol = max(
            tol,
            1.5 * max((o - r).abs().max().item() / r.abs().max().item() for o, r in zip(own, ref)),
        )
    for b in range(3):
        assert_close(ours[b], ref[b], tol, f"row {b}")


def test_logit_index_and_kv_len(checkpoint):
    """logit_index gathers columns; kv_len bounds attention reads without changing results."""
    _, hf, model, _ = checkpoint
    seqs = sequences([9, 6], seed=2)
    tokens = torch.tensor([seqs[0], seqs[1] + [0, 0, 0]])
    positions = torch.arange(9)[None].expand(2, -1)
    state = model.new_state(2, 32, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        last = model(tokens, positions, state, torch.tensor([0, 1]), kv_len=10,
                     logit_index=torch.tensor([[8], [5]]), num_tokens=torch.tensor([9, 6]))
    ref = reference_logits(hf, seqs)
    assert last.shape == (2, 1, VOCAB)
    assert_close(last[0, 0], ref[0][8], 2e-5, "row 0")
    assert_close(last[1, 0], ref[1][5], 2e-5, "row 1")


def test_lane_reuse_starts_fresh(setup):
    """A lane reused by a new request (first position 0) keeps nothing of its previous occupant:
    its recurrent state, conv window and (masked) KV give the logits of a fresh state, with and
    without the two-slot verification layout."""
    _, model, device, dtype, _ = setup
    first, second = sequences([30, 11], seed=3)
    for width in (0, 4):
        state = model.new_state(2, 48, dtype=dtype, device=device, verify_width=width)
        run_schedule(model, state, [1], [first], ((20,), (10,)), device=device)
        reused = run_schedule(model, state, [1], [second], ((8,), (1,), (1,), (1,)), device=device)[
            0
        ]
        fresh_state = model.new_state(2, 48, dtype=dtype, device=device, verify_width=width)
        fresh = run_schedule(
            model, fresh_state, [0], [second], ((8,), (1,), (1,), (1,)), device=device
        )[0]
        if device == "cpu":
            assert torch.equal(reused, fresh), f"verify_width={width}"
        else:  # GPU kernels may pick other reduction orders for another lane's data
            assert_close(
                reused, fresh, 1e-6 if dtype == torch.float32 else 1e-2, f"verify_width={width}"
            )


def test_verify_commit_equals_recomputation(setup):
    """State rollback (issue 16, section 2): after a verification forward of K+1 tokens,
    commit(lanes, accepted) must leave each lane exactly as if only its first accepted tokens had
    been fed, for every accepted count 1..K+1, with no recomputation of the prompt. Checked by the
    logits of the following tokens against a state that never saw the rejected ones."""
    _, model, device, dtype, tol = setup
    K1 = 5  # K + 1 tokens per verification
    prompt_len, after = 13, 3
    rows = K1  # one row per accepted count, all in one verification batch
    seqs = sequences([prompt_len + K1 + after] * rows, seed=4)
    drafts = sequences([K1] * rows, seed=5)  # what the verification feeds after the prompt
    lanes = torch.tensor([4, 0, 3, 1, 2], device=device)
    state = model.new_state(6, 40, dtype=dtype, device=device, verify_width=K1 + 1)

    def arange(a, b):
        return torch.arange(a, b, device=device)[None]

    with torch.no_grad():
        model(
            torch.tensor([s[:prompt_len] for s in seqs], device=device),
            arange(0, prompt_len).expand(rows, -1),
            state,
            lanes,
        )
        state.commit(lanes, torch.full((rows,), prompt_len, device=device))
        # the verification: the accepted prefix of row b agrees with seqs[b], the rest is a wrong
        # draft
        accepted = torch.arange(1, rows + 1)
        verify = torch.tensor(
            [
                seqs[b][prompt_len : prompt_len + int(accepted[b])] + drafts[b][int(accepted[b]) :]
                for b in range(rows)
            ],
            device=device,
        )
        model(verify, prompt_len + arange(0, K1).expand(rows, -1), state, lanes)
        state.commit(lanes, accepted.to(device))
        outs, refs = [], []
        for b in range(rows):
            n = prompt_len + int(accepted[b])
            follow = seqs[b][n:n + after]
            outs.append(
                model(
                    torch.tensor([follow], device=device),
                    arange(n, n + after),
                    state,
                    lanes[b : b + 1],
                )[0]
            )
            fresh = model.new_state(1, 40, dtype=dtype, device=device)
            refs.append(
                model(
                    torch.tensor([seqs[b][: n + after]], device=device),
                    arange(0, n + after),
                    fresh,
                    torch.tensor([0], device=device),
                )[0, n:]
            )
            state.commit(lanes[b:b + 1], torch.tensor([after], device=device))
    for b in range(rows):
        # the same model on both sides: float32 agrees to rounding, bf16 to its own noise
        assert_close(
            outs[b].float().cpu(), refs[b].float().cpu(), tol / 2, f"accepted={int(accepted[b])}"
        )


def test_uncommitted_step_leaves_no_trace(setup):
    """models/state.py: "A step whose commit is never called (a cancelled row, an aborted round)
    must leave the committed state as it was": a forward never committed, then the real next
    tokens, give the logits of a lane that never saw the aborted step (with and without the
    verification buffers, after prefill and after decode)."""
    _, model, device, dtype, tol = setup
    seq, junk = sequences([14, 6], seed=8)
    lane = torch.tensor([1], device=device)
    for width in (0, 6):
        clean = model.new_state(2, 32, dtype=dtype, device=device, verify_width=width)
        ref = run_schedule(model, clean, [1], [seq], ((9,), (1,), (4,)), device=device)[0]
        state = model.new_state(2, 32, dtype=dtype, device=device, verify_width=width)
        first = run_schedule(model, state, [1], [seq[:9]], ((9,),), device=device)[0]
        with torch.no_grad():  # aborted: junk at the next positions, never committed
            model(
                torch.tensor([junk], device=device),
                torch.arange(9, 15, device=device)[None],
                state,
                lane,
            )
        decode = _continue(model, state, lane, seq, 9, (1,), device)
        with torch.no_grad():  # aborted again, after a decode step
            model(
                torch.tensor([junk[:1]], device=device),
                torch.tensor([[10]], device=device),
                state,
                lane,
            )
        rest = _continue(model, state, lane, seq, 10, (4,), device)
        ours = torch.cat([first, decode, rest])
        assert_close(
            ours, ref, 1e-6 if dtype == torch.float32 else tol / 2, f"verify_width={width}"
        )


def _continue(model, state, lane, seq, start, chunks, device) -> torch.Tensor:
    out = []
    for n in chunks:
        with torch.no_grad():
            logits = model(torch.tensor([seq[start:start + n]], device=device),
                           torch.arange(start, start + n, device=device)[None], state, lane)
            state.commit(lane, torch.tensor([n], device=device))
        out.append(logits[0].float().cpu())
        start += n
    return torch.cat(out)


def test_commit_rejects_impossible_counts(checkpoint):
    """commit raises for a kept count outside 1..the last forward's tokens, and for a partial
    commit of a forward wider than verify_width (CPU checks)."""
    _, _, model, _ = checkpoint
    state = model.new_state(1, 16, dtype=torch.float32, device="cpu", verify_width=3)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7]]), torch.arange(3)[None], state, torch.tensor([0]))
    with pytest.raises(ValueError, match="kept"):
        state.commit([0], [4])
    with pytest.raises(ValueError, match="kept"):
        state.commit([0], [0])
    state.commit([0], [3])
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8]]), torch.arange(3, 7)[None], state, torch.tensor([0]))
    with pytest.raises(ValueError, match="verify_width"):
        state.commit([0], [2])
    state.commit([0], [4])


def test_conditional_generation_checkpoint(tmp_path):
    """A top-level Qwen3_5ForConditionalGeneration checkpoint (text_config + vision tower) loads
    by its `model.language_model.*` names, never reads `model.visual.*`, and gives the text
    model's logits."""
    import transformers

    vision = transformers.Qwen3_5VisionConfig(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        out_hidden_size=64,
        patch_size=2,
        temporal_patch_size=1,
        num_position_embeddings=16,
    )
    cfg = transformers.Qwen3_5Config(text_config=text_config(tie_word_embeddings=True).to_dict(),
                                     vision_config=vision.to_dict(), tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForConditionalGeneration(cfg).eval()
    from tests.support.qwen35_support import randomize_

    randomize_(hf, 6)
    hf.save_pretrained(str(tmp_path))
    model, config = load_qwen35_model(str(tmp_path))
    assert config.tie_word_embeddings and model.lm_head is None and model.mtp is None
    assert not any("visual" in name for name in model.state_dict())
    seq = sequences([7], seed=7)[0]
    state = model.new_state(1, 16, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        ours = model(torch.tensor([seq]), torch.arange(7)[None], state, torch.tensor([0]))[0]
        ref = hf(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
    assert_close(ours, ref, 2e-5, "conditional generation")


def test_config_rejections():
    """Bad input gets a typed error naming the field: MoE variants, unknown layer types, a
    non-Qwen3.5 config."""
    from transformers import Qwen3_5MoeTextConfig

    with pytest.raises(ModelConfigError) as e:
        Qwen35Config.from_hf(Qwen3_5MoeTextConfig(num_hidden_layers=4).to_dict())
    assert e.value.field == "model_type" and "mixture-of-experts" in str(e.value)
    with pytest.raises(ModelConfigError) as e:
        Qwen35Config.from_hf(
            {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_moe_text"}}
        )
    assert e.value.field == "text_config.model_type"
    bad = text_config().to_dict()
    bad["layer_types"] = ["linear_attention", "sliding_attention"] + bad["layer_types"][2:]
    with pytest.raises(ModelConfigError) as e:
        Qwen35Config.from_hf(bad)
    assert e.value.field == "layer_types"
    with pytest.raises(ModelConfigError) as e:
        Qwen35Config.from_hf({"model_type": "llama"})
    assert e.value.field == "model_type"


def test_state_sizes_and_budget(checkpoint):
    """The state's bytes are what the sizing functions promise (per token x positions + per lane),
    and from_budget picks the longest lanes that fit."""
    _, _, model, config = checkpoint
    for width in (0, 6):
        state = model.new_state(3, 20, dtype=torch.float32, device="cpu", verify_width=width)
        per_token = state.bytes_per_token(config, torch.float32)
        per_lane = state.bytes_per_lane(config, torch.float32, verify_width=width)
        # paged KV (models/kv_cache.py): 2 blocks of 16 per lane, the trash block, the tables
        kv_bytes = (1 + 3 * 2) * 16 * per_token + 3 * 2 * 4
        assert state.nbytes == kv_bytes + 3 * per_lane
        assert (state.lanes, state.max_len) == (3, 20)
    assert model.state_sizes(torch.float32, verify_width=6) == (per_token, per_lane)
    # room for 3 blocks (48 positions) per lane, one byte short of 4
    budget = 3 * per_lane + (1 + 3 * 4) * 16 * per_token + 3 * 4 * 4 - 1
    n = model.max_len_for_budget(3, budget, torch.float32, verify_width=6)
    state = model.new_state(3, n, dtype=torch.float32, device="cpu", verify_width=6)
    assert n == 48 and state.nbytes <= budget
    with pytest.raises(ValueError):
        model.max_len_for_budget(3, 3 * per_lane, torch.float32, verify_width=6)
