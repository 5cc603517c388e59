"""`infernix bench spec` (bench/spec.py) on a tiny random model: the report's
shape, greedy equality with the baseline in every run, and the oracle proposer's acceptance (the
target's own recorded continuation is always accepted). No timing is asserted."""

from __future__ import annotations

import asyncio

import pytest

from bench.oracle import OracleProposer
from bench.spec import SpecBenchOptions, _bench, _targets, task_prompts
from tests.support.worker_support import tiny_runtime


def test_oracle_proposer_follows_a_recorded_sequence():
    oracle = OracleProposer()
    oracle.record([1, 2, 3, 4, 5])
    oracle.record([1, 2, 9])
    assert oracle.propose([1, 2, 3], 5) == [4, 5]
    assert oracle.propose([1, 2], 1) == [3]  # the first recorded sequence that continues
    assert oracle.propose([7], 3) == [] and oracle.propose([1, 2, 3, 4, 5], 2) == []


def test_bench_spec_rounds_are_greedy_equal_and_the_oracle_accepts():
    runtime = tiny_runtime(max_position_embeddings=2048)
    opts = SpecBenchOptions(tasks=("rewrite",), backends=("ngram", "oracle"), draft_tokens=(3,),
                            batch_size=2, max_tokens=16)
    rows = asyncio.run(_bench(runtime, opts, lambda line: None))
    assert [(r["task"], r["mode"]) for r in rows] == [("rewrite", "unconstrained"),
                                                      ("rewrite", "constrained")]
    for row in rows:
        assert row["baseline"]["output_tokens"] > 2
        for run in row["runs"]:
            assert run["outputs_equal"], (row["mode"], run["backend"])
            assert run["k"] == 3 and run["speedup"] > 0
        oracle = next(r for r in row["runs"] if r["backend"] == "oracle")
        assert oracle["verify_rounds"] > 0 and oracle["acceptance_rate"] > 0.5
        assert oracle["tokens_per_round"] > 1.5
    targets = _targets(rows)
    assert set(targets["constrained_over_unconstrained_speedup_ge_0.95"]) == {
        "rewrite/ngram/K=3", "rewrite/oracle/K=3"}
    assert len(targets["draft_wait_fraction_lt_0.05"]) == 4


def test_bench_spec_random_draft_models_run_and_stay_greedy_equal():
    runtime = tiny_runtime(max_position_embeddings=2048)
    opts = SpecBenchOptions(tasks=("extract",), backends=("dflash", "dflash2"), draft_tokens=(3,),
                            batch_size=1, max_tokens=10)
    rows = asyncio.run(_bench(runtime, opts, lambda line: None))
    for row in rows:
        assert [r["backend"] for r in row["runs"]] == ["dflash", "dflash2"]
        for run in row["runs"]:
            assert run["outputs_equal"] and run["verify_rounds"] > 0
            assert run["draft_wait_exposed_s"] > 0  # the draft pass is host-visible here


def test_bench_spec_options_are_checked():
    with pytest.raises(ValueError):
        SpecBenchOptions(backends=("medusa",))
    with pytest.raises(ValueError):
        SpecBenchOptions(draft_tokens=(0,))
    prompts, schema = task_prompts("extract", 5)
    assert len(prompts) == 5 and schema["required"]


def test_bench_spec_mtp_rounds_on_a_tiny_qwen35():
    import torch

    from bench.random_weights import ByteTokenizer, random_qwen35
    from services.worker.runtime import ModelRuntime
    from shared.frontends.frontend import Frontend
    from tests.support.common import byte_domain
    from tests.worker.test_worker_spec_mtp import SHAPE

    d = byte_domain()
    model = random_qwen35(dtype=torch.float64, device="cpu", vocab_size=d.size, mtp=True, seed=3,
                          **{**SHAPE, "max_position_embeddings": 2048})
    runtime = ModelRuntime("q35", model, model.config, Frontend("q35", d, ByteTokenizer(d)))
    opts = SpecBenchOptions(tasks=("extract",), backends=("mtp",), draft_tokens=(2,),
                            batch_size=1, max_tokens=8)
    rows = asyncio.run(_bench(runtime, opts, lambda line: None))
    for row in rows:
        [run] = row["runs"]
        assert run["backend"] == "mtp" and run["outputs_equal"] and run["verify_rounds"] > 0


def test_bench_spec_forms_compile_and_force_text():
    """The `forms` task: ten schemas with long keys and enums, each valid for the grammar
    compiler; after `{` each forces its first long key (the grammar drafter's case), and at least
    ten requests run in a round whatever B is."""
    import json

    from bench.forms import FORMS
    from bench.spec import task_prompts
    from services.grammar.compiler import ModelCompiler
    from shared.contract import OutputConstraint
    from tests.support.common import byte_domain

    compiler = ModelCompiler(byte_domain())
    for schema, _ in FORMS:
        m = compiler.compile(OutputConstraint.json_schema(schema, whitespace="indented")).grammar \
            .matcher()
        assert m.accept_bytes(b"{")
        first = next(iter(schema["properties"]))
        assert m.forced_bytes().startswith(b'\n  "' + first.encode() + b'": ')
    prompts, schemas = task_prompts("forms", 8)
    assert len(prompts) == len(schemas) == 16 and schemas[10] == FORMS[0][0]
    assert json.dumps(FORMS[3][0]) in prompts[3]
