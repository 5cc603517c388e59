"""Smoke test of `infernix bench decode` on a tiny random Qwen3-shaped runtime (byte domain)."""

from __future__ import annotations

import json

import jsonschema
import torch

from bench.decode import DecodeBenchOptions, bench_decode
from bench.grammar import SCHEMAS
from bench.random_weights import ByteTokenizer, random_qwen3_runtime
from bench.report import write_report
from services.cli import build_parser
from tests.support.common import byte_domain

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
        "num_kv_heads": 2, "head_dim": 16}
MODE_KEYS = {"requests", "output_tokens", "wall_s", "ttft_p50_ms", "tpot_p50_ms",
             "throughput_tok_s", "tokens_per_request", "texts"}


def _tiny_bench(**options) -> tuple:
    """`bench_decode` on a tiny random float64 Qwen3-shaped runtime with `options`, on one
    thread (tiny matrices: more threads only wait on each other); (runtime, report)."""
    domain = byte_domain()
    runtime = random_qwen3_runtime(domain, ByteTokenizer(domain), name="tiny-qwen3", shape=TINY,
                                   max_position_embeddings=256, seed=5, dtype=torch.float64,
                                   device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return runtime, bench_decode(runtime, DecodeBenchOptions(**options))
    finally:
        torch.set_num_threads(threads)


def test_bench_decode_reports_both_engines_and_modes(tmp_path, capsys):
    """Issue 3 §5: per batch size, unconstrained and JSON-Schema-constrained TTFT p50, TPOT p50,
    throughput and the constraint report's mask CPU seconds, plus the constrained/unconstrained
    TPOT ratio, for our engine and for Hugging Face `generate` over the same weights. Checked
    against independent bases: the reference's logits match ours (float64), greedy outputs agree
    token for token, constrained texts are prefixes the schema's language allows (a complete
    one validates with `jsonschema`), and throughput is tokens over wall time."""
    _, report = _tiny_bench(batch_sizes=(1, 2), max_tokens=5, prompt_tokens=8,
                            reference_batch_sizes=(1, 2), warmup_tokens=2)
    out = tmp_path / "decode.json"
    write_report(report, str(out))
    capsys.readouterr()
    data = json.loads(out.read_text())
    assert [r["batch_size"] for r in data["results"]] == [1, 2]
    assert data["reference"]["logits_check"]["rel_l2_error"] < 1e-6
    schemas = [s for s, _ in SCHEMAS]
    for row in data["results"]:
        b = row["batch_size"]
        for engine in ("engine", "reference"):
            modes = row[engine]
            for mode in ("unconstrained", "constrained"):
                m = modes[mode]
                assert MODE_KEYS <= set(m), (engine, mode, set(m))
                assert m["requests"] == b and len(m["texts"]) == b
                assert m["tpot_p50_ms"] > 0 and m["ttft_p50_ms"] > 0
                # throughput is tokens over wall time: the wall it implies lies within the
                # rounding of the reported wall (4 decimals; throughput to 2)
                tp, n = m["throughput_tok_s"], m["output_tokens"]
                assert abs(n / tp - m["wall_s"]) <= 5e-5 + n * 0.005 / tp ** 2 + 1e-9
            assert modes["tpot_ratio"] == round(
                modes["constrained"]["tpot_p50_ms"] / modes["unconstrained"]["tpot_p50_ms"], 4)
            for i, text in enumerate(modes["constrained"]["texts"]):
                assert text.startswith("{")
                try:
                    value = json.loads(text)
                except ValueError:
                    continue  # cut by max_tokens: an incomplete prefix
                jsonschema.validate(value, schemas[i % len(schemas)])
        cpu = row["engine"]["constrained"]["constraint_cpu"]
        assert cpu["mask_positions"] >= b and cpu["mask_seconds"] > 0
        assert row["outputs_equal_fraction"] == {"unconstrained": 1.0, "constrained": 1.0}
    assert set(data["targets"]) == {"constrained_tpot_within_3pct",
                                    "speedup_vs_reference_at_b1_ge_3x", "mask_hidden_at_b1"}


def test_bench_decode_command_line():
    """Issue 3 §5: `infernix bench decode [--model] [--device] [--batch-sizes] [--max-tokens]
    [--prompt-tokens] [--reference/--no-reference] [--out]`."""
    args = build_parser().parse_args(
        ["bench", "decode", "--model", "qwen3-8b-random", "--device", "cuda", "--batch-sizes",
         "1", "8", "--max-tokens", "16", "--prompt-tokens", "32", "--no-reference", "--out", "x"])
    assert (args.model, args.device, args.batch_sizes, args.max_tokens, args.prompt_tokens,
            args.reference, args.out) == ("qwen3-8b-random", "cuda", [1, 8], 16, 32, False, "x")
    assert build_parser().parse_args(["bench", "decode"]).reference is True


def test_bench_decode_compares_the_unfused_path():
    """Before and after from one run. `compare_unfused` runs the engine first on the op-by-op
    model path, `compare_float32` on the fused path with the CPU GEMV off, then the fused path:
    all produce the same greedy texts, and the report carries the per-mode speedups."""
    runtime, report = _tiny_bench(
        batch_sizes=(2,), max_tokens=4, prompt_tokens=8, reference=False, warmup_tokens=2,
        compare_unfused=True, compare_serial=True, compare_float32=True, breakdown=True)
    assert runtime.model.fused  # left on the serving path
    (row,) = report["results"]
    for mode in ("unconstrained", "constrained"):
        assert row["engine_unfused"][mode]["texts"] == row["engine"][mode]["texts"]
        assert row["engine_serial"][mode]["texts"] == row["engine"][mode]["texts"]
        assert row["speedup_fused_over_unfused"][mode] == round(
            row["engine_unfused"][mode]["tpot_p50_ms"] / row["engine"][mode]["tpot_p50_ms"], 4)
        assert row["speedup_pipeline"][mode] == round(
            row["engine_serial"][mode]["tpot_p50_ms"] / row["engine"][mode]["tpot_p50_ms"], 4)
        assert row["engine_float32"][mode]["texts"] == row["engine"][mode]["texts"]
        assert row["outputs_equal_float32"][mode] == 1.0
        assert row["speedup_over_float32"][mode] == round(
            row["engine_float32"][mode]["tpot_p50_ms"] / row["engine"][mode]["tpot_p50_ms"], 4)
    assert report["breakdown"]["copy_bandwidth_GBps"] > 0
    engines = {"fused": "engine", "unfused": "engine_unfused", "serial": "engine_serial",
               "float32": "engine_float32"}
    for path in engines:
        step = row["breakdown"][path]
        assert step["forward_ms"] > 0 and step["sample_ms"] > 0 and step["floor_ms"] > 0
        assert step["tpot_ms"] == row[engines[path]]["unconstrained"]["tpot_p50_ms"]
        assert step["host_ms"] == round(step["tpot_ms"] - step["forward_ms"] - step["sample_ms"], 4)


def test_bench_decode_staggered_rounds_arrive_apart_and_decode_the_same_texts():
    """Staggered arrivals (`stagger_ms`): the same greedy requests arriving apart join a decoding
    batch, so their texts equal the simultaneous round's, each arrives at least its offset after
    the first (its end is later than the simultaneous round's by about that), and the report
    sets their p50 TPOT against the simultaneous round's steady step."""
    _, report = _tiny_bench(batch_sizes=(3,), max_tokens=6, prompt_tokens=8, reference=False,
                            warmup_tokens=2, stagger_ms=40.0)
    (row,) = report["results"]
    engine = row["engine"]
    for mode in ("unconstrained", "constrained"):
        together, apart = engine[mode], engine["staggered_" + mode]
        assert apart["texts"] == together["texts"]
        assert apart["wall_s"] >= 2 * 0.040  # the last request arrived 80 ms after the first
        assert engine["staggered_over_steady"][mode] == (
            None if together["tpot_steady_ms"] is None
            else round(apart["tpot_p50_ms"] / together["tpot_steady_ms"], 4))
    assert set(report["targets"]["staggered_tpot_within_15pct_of_steady"][3]) == {
        "unconstrained", "constrained"}
    args = build_parser().parse_args(["bench", "decode", "--stagger-ms", "12.5"])
    assert args.stagger_ms == 12.5


def test_bench_prefix_switch_runs_the_rounds_off_then_on(monkeypatch, tmp_path):
    """`--switch NAME`: the same rounds on one runtime with the operator switch at 0, then 1
    (the JSON's `runs`), the environment left as it was."""
    import json
    import os

    import bench.prefix as prefix
    from tests.support.worker_support import tiny_runtime

    monkeypatch.setattr(prefix, "build_runtime", lambda model, device: tiny_runtime())
    monkeypatch.delenv("INFERNIX_PREFILL_GRAPHS", raising=False)
    out = tmp_path / "ab.json"
    args = build_parser().parse_args(["bench", "prefix", "--prefix-tokens", "40", "--repeats", "1",
                                      "--hits", "1", "--max-tokens", "2", "--prefill-chunk", "32",
                                      "--switch", "prefill_graphs", "--out", str(out)])
    assert prefix.run(args) == 0
    report = json.loads(out.read_text())
    assert report["switch"] == "INFERNIX_PREFILL_GRAPHS" and set(report["runs"]) == {"0", "1"}
    assert all(len(run["hits"]) == 1 and run["hits"][0]["cached_tokens"] >= 32
               for run in report["runs"].values())
    assert "INFERNIX_PREFILL_GRAPHS" not in os.environ


def test_bench_prefix_reports_cold_hit_and_cache_off():
    """`infernix bench prefix` on a tiny model: hits report the shared document's full blocks as
    cached tokens, cold and cache-off requests none, hits and cold answer alike when they ask the
    same question (greedy), and the command line parses."""
    import argparse
    import asyncio

    from bench.prefix import _rounds, documents
    from tests.support.worker_support import tiny_runtime

    runtime = tiny_runtime()
    args = argparse.Namespace(prefix_tokens=64, repeats=2, hits=2, max_tokens=3, prefill_chunk=32)
    report = asyncio.run(_rounds(runtime, args, lambda line: None))
    docs = documents(runtime, 3, 64)
    assert len({d[:1] for d in docs}) == 3  # no two documents share a block
    assert [c["cached_tokens"] for c in report["cold"]] == [0, 0]
    assert (
        all(h["cached_tokens"] >= 64 // 16 * 16 for h in report["hits"])
        and len(report["hits"]) == 4
    )
    assert [o["cached_tokens"] for o in report["cache_off"]] == [0, 0]
    assert report["prefix_cache"]["hit_tokens"] == sum(h["cached_tokens"] for h in report["hits"])
    assert report["hit_over_cold"] is not None and report["ttft_cold_p50_ms"] > 0
    parsed = build_parser().parse_args(["bench", "prefix", "--prefix-tokens", "100", "--hits", "3"])
    assert (parsed.prefix_tokens, parsed.hits, parsed.repeats) == (100, 3, 2)
    assert parsed.switch is None and report["compiles_after_warmup"] == []  # the CPU compiles none
    assert report["lane_end_rows"] == 0  # nor pads: every CPU forward runs at its own width
    parsed = build_parser().parse_args(["bench", "prefix", "--switch", "prefill_graphs"])
    assert parsed.switch == "prefill_graphs"


def test_bench_decode_runs_the_qwen35_model_with_its_state_in_the_floor(monkeypatch):
    """Issue 16: `infernix bench decode --model qwen35-9b-random` runs the hybrid model through
    the engine, constrained and not, and its memory floor counts the recurrent state each step
    reads and writes beside the weights. A tiny shape of the same builder on the CPU here; the
    HF reference is refused with a clear message (it covers the dense models only)."""
    from bench.decode import run
    from bench.qwen35_model import recurrent_state_bytes_per_step, weight_bytes_per_step
    from bench.random_weights import random_qwen35_runtime

    layers = ("linear_attention", "linear_attention", "linear_attention", "full_attention")
    runtime = random_qwen35_runtime(
        dtype=torch.float32,
        device="cpu",
        hidden_size=64,
        intermediate_size=96,
        layer_types=layers,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        rotary_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        max_position_embeddings=512,
    )
    import bench.breakdown as breakdown

    bandwidth = 1e10  # bytes/s: a fixed copy bandwidth, so the floor is exact to compare
    monkeypatch.setattr(breakdown, "cpu_copy_bandwidth", lambda: bandwidth)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = bench_decode(runtime, DecodeBenchOptions(
            batch_sizes=(2,), max_tokens=4, prompt_tokens=8, reference=False, warmup_tokens=2,
            breakdown=True))
    finally:
        torch.set_num_threads(threads)
    (row,) = report["results"]
    for mode in ("unconstrained", "constrained"):
        assert row["engine"][mode]["tokens_per_request"] == {"min": 4, "max": 4}
    state = recurrent_state_bytes_per_step(runtime.model, 2)
    assert state == 2 * 2 * 3 * 4 * 16 * 16 * 4  # read + write, 2 lanes, 3 GDN layers, f32
    weights = weight_bytes_per_step(runtime.model, 2)
    assert row["breakdown"]["fused"]["floor_ms"] == round((weights + state) / bandwidth * 1e3, 4)
    assert round(weights / bandwidth * 1e3, 4) < row["breakdown"]["fused"]["floor_ms"]
    args = build_parser().parse_args(["bench", "decode", "--model", "qwen35-9b-random"])
    assert run(args) == 2  # the reference is on by default: refused before any model is built


def test_steady_tpot_is_the_step_time_while_every_request_decodes():
    """The steady-state TPOT of a round: wall time per engine step between the last request's
    first output and the first request's end (no prefill step of the round inside); None when
    that window holds no step (a request ended before the last one started)."""
    from bench.engine_rounds import steady_step_ms

    marks = [{"first": (1.0, 3), "end": (2.0, 13)}, {"first": (1.2, 4), "end": (2.5, 20)}]
    assert steady_step_ms(marks) == round(0.8 / 9 * 1e3, 3)
    assert steady_step_ms([{"first": (1.0, 3), "end": (1.1, 4)},
                            {"first": (1.5, 6), "end": (2.0, 9)}]) is None


def test_bench_model_choices_are_listed_once():
    """Every `infernix bench` command names each model it can build exactly once (the spec bench
    once listed qwen35-9b-random twice, after the decode bench gained it)."""
    from bench.cli import MODELS

    parser = build_parser()
    for command in ("decode", "spec", "prefix"):
        (model,) = [a for a in parser._subparsers._group_actions[0].choices["bench"]
                    ._subparsers._group_actions[0].choices[command]._actions if a.dest == "model"]
        assert list(model.choices) == list(dict.fromkeys(model.choices)), command
        assert set(model.choices) <= set(MODELS)
