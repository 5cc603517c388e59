"""Known acceptance (bench/acceptance.py, `infernix bench spec --acceptance`) on tiny random
models on the CPU, float64 (verify and decode are one numerical route there):

- "at p = 1 every draft is accepted and the output equals plain greedy; at p = 0 none";
- "the measured acceptance rate over many rounds is within a tolerance of p";
- the bench's JSON has speed-up against p, K / block, B, both modes, the exposed draft wait,
  the mean accepted per round, the cost of a round in plain steps and greedy equality.
No timing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math

import pytest
import torch

import shared.logging
from bench import acceptance_bench
from bench.acceptance import KnownAcceptance, Replay
from bench.acceptance_bench import bench_acceptance
from bench.cli import add_spec_parser
from bench.random_weights import ByteTokenizer, random_qwen35
from bench.spec import SpecBenchOptions
from services.worker.runtime import ModelRuntime
from shared.frontends.frontend import Frontend
from tests.support.common import byte_domain
from tests.support.worker_support import tiny_runtime

Q35_SHAPE = {"hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "num_kv_heads": 1,
             "head_dim": 16, "rotary_dim": 4, "linear_num_key_heads": 1,
             "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
             "max_position_embeddings": 2048, "layer_types": ("linear_attention", "full_attention")}


def _q35_runtime() -> ModelRuntime:
    d = byte_domain()
    model = random_qwen35(dtype=torch.float64, device="cpu", vocab_size=d.size, mtp=True, seed=3,
                          **Q35_SHAPE)
    return ModelRuntime("q35-tiny", model, model.config, Frontend("q35-tiny", d, ByteTokenizer(d)))


def _matrix(runtime, backends, ps, *, k=3, blocks=(4,), batch_sizes=(2,), max_tokens=24,
            modes=("unconstrained", "constrained"), tasks=("rewrite",)):
    opts = SpecBenchOptions(tasks=tasks, backends=backends, draft_tokens=(k,),
                            batch_size=batch_sizes[0], max_tokens=max_tokens)
    return asyncio.run(bench_acceptance(runtime, opts, ps=ps, batch_sizes=batch_sizes,
                                        blocks=blocks, modes=modes))


def _runs(rows):
    return [(row, run) for row in rows for run in row["runs"]]


@pytest.mark.slow
def test_p1_accepts_every_draft_and_p0_none_on_each_backend():
    # "at p = 1 every draft is accepted and output equals plain greedy; at p = 0 none"
    rows = _matrix(tiny_runtime(max_position_embeddings=2048), ("oracle", "dflash"), (1.0, 0.0))
    rows += _matrix(_q35_runtime(), ("mtp",), (1.0, 0.0), modes=("unconstrained",))
    seen = set()
    for row, run in _runs(rows):
        seen.add((run["backend"], run["known_acceptance"]["p"], row["mode"]))
        assert run["verify_rounds"] > 0 and run["drafts"] > 0, (row["mode"], run["backend"])
        assert run["outputs_equal"] and all(run["equal_requests"]), (row["mode"], run["backend"])
        assert run["known_acceptance"]["plan_agreement"] == 1.0
        if run["known_acceptance"]["p"] == 1.0:
            # every draft of a round is accepted except where the request ends inside it
            # (an accepted EOS makes the later positions unreachable)
            assert run["known_acceptance"]["measured_p"] == 1.0
            assert run["accepted"] >= 0.9 * run["drafts"]
            assert run["tokens_per_round"] > 2.0
        else:
            assert run["accepted"] == 0 and run["tokens_per_round"] == 1.0
            assert run["known_acceptance"]["measured_p"] == 0.0
    assert {("dflash", 1.0, "constrained"), ("oracle", 0.0, "constrained"),
            ("mtp", 1.0, "unconstrained"), ("mtp", 0.0, "unconstrained")} <= seen


@pytest.mark.slow
def test_measured_acceptance_rate_is_within_tolerance_of_p():
    # "the measured acceptance rate over many rounds is within a tolerance of p": the estimate
    # (accepted over judged drafts) of Bernoulli(p) trials, within 4 standard deviations.
    p = 0.6
    rows = _matrix(tiny_runtime(max_position_embeddings=2048), ("oracle", "dflash"), (p,),
                   batch_sizes=(4,), max_tokens=64, modes=("unconstrained",))
    for _, run in _runs(rows):
        ka = run["known_acceptance"]
        judged = round(ka["accepted"] / ka["measured_p"])
        assert judged >= 100, judged
        tolerance = 4 * math.sqrt(p * (1 - p) / judged)
        assert abs(ka["measured_p"] - p) <= tolerance, (run["backend"], ka, tolerance)
        assert run["accepted"] == ka["accepted"] == ka["planned_accepted"]
        assert run["outputs_equal"]


class _Job:
    def __init__(self, request_id, prompt, output, lane=0):
        self.request_id, self.prompt_ids, self.output_ids, self.lane = \
            request_id, tuple(prompt), list(output), lane


def test_replay_follows_the_recording_and_stops_at_divergence():
    replay = Replay()
    replay.record([1, 2, 3, 4, 5, 6])
    assert replay.continuation(_Job("a", [1, 2], [3]), 2) == [4, 5]
    assert replay.continuation(_Job("a", [1, 2], [3, 4, 5]), 9) == [6]
    assert replay.continuation(_Job("b", [1, 2], [7]), 2) == [] and replay.diverged("b")
    assert replay.continuation(_Job("b", [1, 2], [7, 5]), 1) == []  # diverged stays diverged
    assert replay.continuation(_Job("c", [9], []), 3) == []


def test_corruption_rate_follows_p_and_never_keeps_a_corrupted_token():
    replay = Replay()
    sequence = list(range(1, 4001))
    replay.record(sequence)
    p = 0.7
    w = KnownAcceptance(None, replay, p, k=4000, vocab_size=5000, lanes=1,
                        device=torch.device("cpu"), seed=5)
    drafts = w._drafts(_Job("a", [1], []), 3999)
    kept = [d == s for d, s in zip(drafts, sequence[1:])]
    assert len(drafts) == 3999 and all(0 <= d < 5000 for d in drafts)
    assert abs(sum(kept) / len(kept) - p) <= 4 * math.sqrt(p * (1 - p) / len(kept))
    with pytest.raises(ValueError):
        KnownAcceptance(None, replay, 1.5, k=1, vocab_size=5, lanes=1, device=torch.device("cpu"))


@pytest.mark.slow
def test_cli_json_has_the_known_acceptance_fields(tmp_path, monkeypatch):
    # The lead's H200 command shape, end to end through the argument parser, on a tiny model.
    monkeypatch.setattr(acceptance_bench, "_runtime", lambda model, device: _q35_runtime())
    # The command configures structlog for its process; in the suite's process that would cache
    # WARNING-filtered loggers for every later test that reads the logs.
    monkeypatch.setattr(shared.logging, "configure_logging", lambda level="INFO": None)
    parser = argparse.ArgumentParser()
    add_spec_parser(parser.add_subparsers())
    out = tmp_path / "spec.json"
    args = parser.parse_args(["spec", "--model", "qwen35-9b-random", "--backends", "mtp",
                              "oracle", "--num-draft-tokens", "1", "--acceptance", "0", "0.8",
                              "--batch-sizes", "1", "2", "--tasks", "extract", "--max-tokens",
                              "12", "--out", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    rows = report["results"]
    assert {(r["batch_size"], r["mode"]) for r in rows} == {
        (b, m) for b in (1, 2) for m in ("unconstrained", "constrained")}
    for row in rows:
        assert row["baseline"]["output_tokens"] > 0
        assert {(r["backend"], r["known_acceptance"]["p"]) for r in row["runs"]} == {
            (b, p) for b in ("mtp", "oracle") for p in (0.0, 0.8)}
        for run in row["runs"]:
            for field in (
                "speedup",
                "k",
                "mean_accepted",
                "round_cost_plain_steps",
                "draft_wait_fraction",
                "draft_wait_exposed_s",
                "backend_draft_wait_fraction",
                "outputs_equal",
                "equal_requests",
                "equal_fraction",
                "tokens_per_round",
            ):
                assert field in run, field
            assert {"p", "measured_p", "expected_mean_accepted", "plan_agreement",
                    "replay_seconds"} <= set(
                run["known_acceptance"])
            assert run["compiles"] == []  # the CPU compiles no Triton kernel (CUDA: the log)
            assert run["graphs_captured"] == {  # nor captures a graph, per set
                "decode": 0, "verify": 0, "prefill": 0, "dflash": 0, "mtp": 0}
    targets = report["targets"]
    assert any(name.startswith("round_cost_le_1.15/") for name in targets)
    assert any(name.startswith("constrained_keep_ge_0.95/") for name in targets)
    assert all(set(t) == {"value", "met"} for t in targets.values())
