"""Qwen3.5 on CUDA: the hybrid decode step captured in a CUDA graph gives the eager step's logits
(issue 16: "CUDA graphs per batch size cover the hybrid decode step"), and the bare-model bench
runs end to end and writes its JSON (no timed assertion)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.random_weights import random_qwen35

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SMALL = dict(
    vocab_size=248_320,
    hidden_size=256,
    intermediate_size=512,
    layer_types=("linear_attention",) * 3 + ("full_attention",),
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    rotary_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
)


@torch.inference_mode()
def test_decode_graph_matches_eager():
    model = random_qwen35(dtype=torch.bfloat16, device="cuda", seed=1, **SMALL)
    B, prompt, steps = 3, 40, 6
    g = torch.Generator(device="cuda").manual_seed(2)
    seq = torch.randint(0, 248_000, (B, prompt + steps), device="cuda", generator=g)
    lanes = torch.tensor([2, 0, 1], device="cuda")
    states = [
        model.new_state(4, 64, dtype=torch.bfloat16, device="cuda", verify_width=4)
        for _ in range(2)
    ]
    ones = torch.ones(B, dtype=torch.long, device="cuda")
    for state in states:
        model(
            seq[:, :prompt], torch.arange(prompt, device="cuda")[None].expand(B, -1), state, lanes
        )
        state.commit(lanes, ones * prompt)
    tok = torch.zeros(B, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(B, 1, dtype=torch.long, device="cuda")
    graph_state, eager_state = states
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    scratch = model.new_state(4, 64, dtype=torch.bfloat16, device="cuda", verify_width=4)
    with torch.cuda.stream(side):  # warm-up on a throwaway state
        for _ in range(2):
            model(tok, pos, scratch, lanes)
            scratch.commit(lanes, ones)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the step and its commit
        out = model(tok, pos, graph_state, lanes)[:, -1]  # [B, V]
        graph_state.commit(lanes, ones)
    for t in range(steps):
        tok.copy_(seq[:, prompt + t:prompt + t + 1])
        pos.fill_(prompt + t)
        graph.replay()
        eager = model(
            seq[:, prompt + t : prompt + t + 1],
            torch.full((B, 1), prompt + t, device="cuda"),
            eager_state,
            lanes,
        )[:, -1]
        eager_state.commit(lanes, ones)
        err = (out.float() - eager.float()).abs().max().item()
        assert err <= 1e-2 * eager.float().abs().max().item(), (t, err)


def test_bench_smoke(tmp_path):
    from bench import qwen35_model as qwen35_bench

    out = tmp_path / "bench.json"
    assert (
        qwen35_bench.main(
            [
                "--out",
                str(out),
                "--layers",
                "4",
                "--batches",
                "1,2",
                "--prompt",
                "64",
                "--steps",
                "8",
                "--verify",
                "4",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert [r["batch"] for r in report["rows"]] == [1, 2]
    assert all(r["decode_ms_graph"] > 0 and r["floor_ms"] > 0 for r in report["rows"])


@torch.inference_mode()
def test_fused_layers_match_the_op_by_op_path():
    """Issue 14: the Triton norms / RoPE / SwiGLU path (model.fused) against the op-by-op path
    on the same weights: logits within bf16 rounding at every decode step."""
    model = random_qwen35(dtype=torch.bfloat16, device="cuda", seed=3, **SMALL)
    B, prompt = 2, 24
    seq = torch.randint(0, 248_000, (B, prompt + 4), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(5))
    lanes = torch.tensor([0, 1], device="cuda")
    ones = torch.ones(B, dtype=torch.long, device="cuda")
    outs = {}
    for fused in (False, True):
        model.fused = fused
        state = model.new_state(2, 64, dtype=torch.bfloat16, device="cuda")
        logits = [
            model(
                seq[:, :prompt],
                torch.arange(prompt, device="cuda")[None].expand(B, -1),
                state,
                lanes,
            )[:, -1]
        ]
        state.commit(lanes, ones * prompt)
        for t in range(4):
            logits.append(
                model(
                    seq[:, prompt + t : prompt + t + 1],
                    torch.full((B, 1), prompt + t, device="cuda"),
                    state,
                    lanes,
                )[:, -1]
            )
            state.commit(lanes, ones)
        outs[fused] = torch.stack(logits).float()
    assert model.fused
    err = (outs[True] - outs[False]).abs().max().item()
    assert err <= 2e-2 * outs[False].abs().max().item(), err
