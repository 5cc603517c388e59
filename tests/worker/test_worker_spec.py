"""Speculative decoding through the Engine: n-gram and oracle drafts, K+1 masks, acceptance, and
the one commit path (services/worker/spec, services/worker/program/verify.py).

Design document, section 8: "Drafts are never constrained; the target is." and "The greedy
target picks the argmax over legal candidates; the unconstrained argmax the target forward
already produced is never reused as a constrained row's answer." Section 7: "The failed row
commits zero tokens this round ... Even when the failed row verified several drafts internally,
none of that uncommitted result is published; earlier committed output is kept."

Independent bases: greedy decoding without the engine (`oracle_greedy`), the same engine without
speculation, and the constraint's own language (regex full match, jsonschema).
"""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest
import torch

from bench.oracle import OracleProposer
from services.worker.engine import Engine, EngineConfig
from services.worker.spec import ContextProposer, NgramProposer, check_backend
from shared.contract import OutputConstraint
from shared.errors import Unsupported
from shared.generation import RequestOptions, SamplingParams
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    no_z_domain,
    open_client,
    oracle_greedy,
    text_of,
    text_request,
    tiny_runtime,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 6},
                                           "b": {"type": "integer"}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime(no_z_domain())


class Scripted:
    """A proposer from a function of the committed output tokens (tests only)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def propose(self, context, k):
        return list(self.fn(list(context), k))[:k]


def with_proposer(client, proposer, k: int) -> None:
    client.engine.proposer = ContextProposer(proposer, k)


async def run_all(client, runtime, cases):
    return await asyncio.gather(*(collect(client, text_request(rid, prompt, opts, runtime.name))
                                  for rid, prompt, opts in cases))


def cases_for(max_tokens: int):
    return [
        ("free", "abcabcab", greedy(max_tokens)),
        (
            "pen",
            "xyxyxyx",
            RequestOptions(
                max_tokens=max_tokens,
                sampling=SamplingParams(temperature=0.0, presence_penalty=0.7),
            ),
        ),
        (
            "regex",
            "say",
            greedy(max_tokens, constraint=OutputConstraint.regex("(ab|cd|e)+[0-9]{2}")),
        ),
        ("schema", "json", greedy(max_tokens, constraint=OutputConstraint.json_schema(SCHEMA))),
    ]


async def _outputs(runtime, proposer_factory, k: int, max_tokens: int = 24):
    client = open_client(runtime, max_batch=4, max_len=160,
                         **({} if proposer_factory is None else
                            {"speculative": "ngram", "num_draft_tokens": k}))
    try:
        if proposer_factory is not None:
            with_proposer(client, proposer_factory(), k)
        sequences = {}
        client.engine.finish_listeners.append(
            lambda job: sequences.__setitem__(
                job.request_id, job.prompt_ids + tuple(job.output_ids)
            )
        )
        results = await run_all(client, runtime, cases_for(max_tokens))
        return [fin for _, fin in results], client.engine.speculation, sequences
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def baseline(runtime):
    fins, _, sequences = asyncio.run(_outputs(runtime, None, 0))
    return fins, sequences


def _recorded(baseline) -> OracleProposer:
    oracle = OracleProposer()
    for sequence in baseline[1].values():
        oracle.record(sequence)
    return oracle


def test_baseline_is_the_independent_greedy_oracle(runtime, baseline):
    free, pen, regex, schema = baseline[0]
    assert free.content == text_of(runtime.domain, oracle_greedy(
        runtime, runtime.tokenizer.encode("abcabcab"), 24))
    assert pen.content == text_of(runtime.domain, oracle_greedy(
        runtime, runtime.tokenizer.encode("xyxyxyx"), 24, presence=0.7))
    assert regex.finish_reason.value == "stop" and re.fullmatch("(ab|cd|e)+[0-9]{2}", regex.content)
    if schema.finish_reason.value == "stop":
        jsonschema.validate(json.loads(schema.content), SCHEMA)
    assert len({len(s) for s in baseline[1].values()}) > 1  # outputs of several lengths


@pytest.mark.parametrize("backend,k", [("ngram", 3), ("oracle", 4), ("oracle", 1),
                                       ("corrupt", 5)])
def test_greedy_with_speculation_equals_greedy_without(runtime, baseline, backend, k):
    """Token for token, constrained and unconstrained rows in one batch, with drafts that are
    mostly rejected (n-gram on a random model), all accepted (the recorded continuation) or
    rejected at every position in turn (the recorded continuation with one wrong token)."""
    if backend == "ngram":
        factory = lambda: NgramProposer(min_n=1, max_n=3)  # noqa: E731
    elif backend == "oracle":
        factory = lambda: _recorded(baseline)  # noqa: E731
    else:
        oracle = _recorded(baseline)
        calls = {"n": 0}

        def corrupt(context, k):
            drafts = oracle.propose(context, k)
            calls["n"] += 1
            if drafts:
                drafts[calls["n"] % len(drafts)] = ord("q")  # wrong somewhere, legal or not
            return drafts

        factory = lambda: Scripted(corrupt)  # noqa: E731
    fins, spec, _ = asyncio.run(_outputs(runtime, factory, k))
    for got, want in zip(fins, baseline[0]):
        assert (got.content, got.finish_reason, got.usage.completion_tokens) == \
            (want.content, want.finish_reason, want.usage.completion_tokens)
    assert spec.rounds > 0 and spec.drafts > 0
    if backend == "oracle":
        assert spec.accepted > 0 and spec.tokens > spec.rounds  # rounds commit several tokens
        report = fins[2].constraint
        assert report["verify_rounds"] > 0 and report["accepted_drafts"] > 0
        assert report["draft_tokens"] >= report["accepted_drafts"]


def test_sampled_speculation_keeps_the_language(runtime):
    """Positive temperature: acceptance with p(d), residual on rejection; every output is in
    the constraint's language, and the same seed gives the same output."""
    async def main():
        client = open_client(runtime, max_batch=3, max_len=160, speculative="ngram",
                             num_draft_tokens=4)
        with_proposer(client, NgramProposer(min_n=1, max_n=2), 4)
        opts = RequestOptions(max_tokens=30, constraint=OutputConstraint.regex("(ab|abc|c)+d"),
                              sampling=SamplingParams(temperature=1.0, seed=7))
        try:
            results = await run_all(client, runtime, [(f"s{i}", "abcabc", opts) for i in range(3)])
            return [fin for _, fin in results], client.engine.speculation
        finally:
            await client.aclose()

    fins, spec = asyncio.run(main())
    assert spec.rounds > 0
    for fin in fins:
        assert fin.finish_reason.value in ("stop", "length")
        if fin.finish_reason.value == "stop":
            assert re.fullmatch("(ab|abc|c)+d", fin.content)
    assert len({fin.content for fin in fins}) == 1  # same seed, same stream


def _dead_end_round(runtime, boost: str):
    """choice ["abz", "ac"] ('z' never generable: after "ab" nothing is legal). The first token
    'a' comes from prefill; the verify round drafts 'b', whose next position is a DeadEnd. The
    target prefers `boost` at every position. A free row shares the batch."""
    rt, model = hooked(runtime)
    boost_id = ord(boost)

    def after(logits, positions, lanes):
        logits[..., boost_id] += 1e3

    async def main():
        client = open_client(rt, max_batch=2, max_len=96, speculative="ngram",
                             num_draft_tokens=2)
        with_proposer(client, Scripted(lambda ctx, k: [ord("b"), ord("z")]), 2)
        model.after = after
        choice = greedy(8, constraint=OutputConstraint.choice(["abz", "ac"]))
        try:
            results = await run_all(client, rt, [("choice", "pick", choice)])
            return results[0][1], client.engine.speculation
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_dead_end_reached_fails_the_row_committing_nothing_of_the_round(runtime):
    fin, _ = _dead_end_round(runtime, "b")
    assert fin.finish_reason.value == "error" and fin.error["type"] == "ConstraintDeadEnd"
    assert fin.error["position"] == 2  # after "ab": the draft was accepted, then nothing legal
    assert fin.content == "a" and fin.usage.completion_tokens == 1  # the round's 'b' unpublished


def test_dead_end_the_target_never_reaches_is_harmless(runtime):
    fin, spec = _dead_end_round(runtime, "c")
    assert fin.finish_reason.value == "stop" and fin.content == "ac"
    assert fin.constraint["terminated"] and spec.rounds >= 1 and spec.accepted == 0


def test_illegal_and_eos_drafts(runtime):
    """Illegal drafts (letters for digits) are rejected as ordinary proposals; a draft chain
    through EOS ends the round at EOS (later drafts Unreachable, never committed)."""
    async def main(proposer, constraint, prompt):
        client = open_client(runtime, max_batch=1, max_len=96, speculative="ngram",
                             num_draft_tokens=5)
        if proposer is not None:
            with_proposer(client, proposer, 5)
        else:
            client.engine.proposer = None
        try:
            _, fin = await collect(
                client, text_request("r", prompt, greedy(12, constraint=constraint), runtime.name)
            )
            return fin, client.engine.speculation
        finally:
            await client.aclose()

    digits = OutputConstraint.regex("[0-9]{6}")
    plain, _ = asyncio.run(main(None, digits, "n"))
    illegal, spec = asyncio.run(main(Scripted(lambda c, k: [ord("x")] * k), digits, "n"))
    assert illegal.content == plain.content and re.fullmatch("[0-9]{6}", illegal.content)
    assert spec.rounds > 0 and spec.accepted == 0
    eos = next(iter(runtime.domain.eos_ids))
    word = OutputConstraint.choice(["abcd"])
    domain = runtime.domain

    def rest_of_word(context, k):  # the rest of "abcd" byte by byte, EOS, then junk
        done = b"".join(domain.token_bytes[t] for t in context[2:])
        return [ord(ch) for ch in "abcd"[len(done):]] + [eos, ord("a"), ord("b")]

    fin, spec = asyncio.run(main(Scripted(rest_of_word), word, "wx"))  # prefill: the first token
    assert fin.finish_reason.value == "stop" and fin.content == "abcd"
    assert fin.constraint["terminated"]
    drafted = fin.usage.completion_tokens - 1  # the rest of the word and EOS: one round
    assert spec.rounds == 1 and spec.accepted == drafted == spec.tokens
    assert fin.constraint["accepted_drafts"] == drafted and fin.constraint["draft_tokens"] == 5


def test_nonfinite_verify_row_commits_zero_tokens_while_others_commit(runtime):
    """NaN logits injected once into lane 0's row of a verification forward (every row drafts
    each round): that request fails with the internal error, keeping exactly the output
    committed before the round; the other request's output is its solo greedy output."""
    rt, model = hooked(runtime)
    poisoned = []

    def after(logits, positions, lanes):
        if not poisoned and logits.shape[1] > 1 and (lanes == 0).any():
            row = int(torch.nonzero(lanes == 0)[0, 0])
            if int(positions[row, 0]) >= 8:
                logits[row] = float("nan")
                poisoned.append(int(positions[row, 0]))

    async def main():
        client = open_client(rt, max_batch=2, max_len=128, speculative="ngram",
                             num_draft_tokens=3)
        with_proposer(client, Scripted(lambda c, k: c[-k:]), 3)  # always some drafts
        model.after = after
        try:
            results = await run_all(client, rt, [("x", "abab", greedy(20)),
                                                 ("y", "cdcd", greedy(20))])
            return [fin for _, fin in results]
        finally:
            await client.aclose()

    fins = asyncio.run(main())
    assert len(poisoned) == 1
    failed = [
        (fin, p) for fin, p in zip(fins, ("abab", "cdcd")) if fin.finish_reason.value == "error"
    ]
    kept = [
        (fin, p) for fin, p in zip(fins, ("abab", "cdcd")) if fin.finish_reason.value != "error"
    ]
    assert len(failed) == 1 and len(kept) == 1
    (victim, vprompt), (other, oprompt) = failed[0], kept[0]
    assert victim.error["type"] == "InternalError" and "non-finite" in victim.error["message"]
    committed = victim.usage.completion_tokens
    assert committed == poisoned[0] - len(vprompt) + 1  # everything before the poisoned round
    assert victim.content == text_of(runtime.domain, oracle_greedy(
        runtime, runtime.tokenizer.encode(vprompt), committed))
    assert other.content == text_of(runtime.domain, oracle_greedy(
        runtime, runtime.tokenizer.encode(oprompt), 20))


def test_backends_this_model_cannot_run_are_refused_typed(runtime):
    for backend, field in (("mtp", "speculative"), ("medusa", "speculative"),
                           ("dflash", "draft_model"), ("dflash2", "draft_model")):
        with pytest.raises(Unsupported) as exc:  # no MTP module; unknown; no draft model given
            Engine(runtime, grammar=None, config=EngineConfig(speculative=backend))
        assert exc.value.field == field
    with pytest.raises(Unsupported) as exc:
        check_backend("ngram", "/some/dir")
    assert exc.value.field == "draft_model"


def test_ngram_proposer_longest_suffix_most_recent():
    p = NgramProposer(min_n=1, max_n=3)
    assert p.propose([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]
    assert p.propose([7, 9, 1, 2, 8, 1, 2], 2) == [8, 1]  # "1 2" most recently before the suffix
    assert p.propose([1, 2, 3, 9, 2, 3, 5, 3], 2) == [5, 3]  # n=1 only: the latest "3"
    assert p.propose([1, 2, 3], 4) == []
    assert p.propose([1, 2, 1, 2], 0) == []
    assert NgramProposer(min_n=2, max_n=2).propose([4, 1, 2, 6, 3, 1, 2], 5) == [6, 3, 1, 2]
    with pytest.raises(ValueError):
        NgramProposer(min_n=3, max_n=2)


def _generate(runtime, argv):
    import argparse
    import io

    from services.worker.cli import add_generate_parser, run_generate

    parser = argparse.ArgumentParser()
    add_generate_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", *argv])
    out, err = io.StringIO(), io.StringIO()
    return run_generate(args, out, err, runtime=runtime), out.getvalue(), err.getvalue()


def test_cli_generate_with_speculation(runtime):
    """`infernix generate --speculative ngram --num-draft-tokens K` gives the greedy output of
    ordinary decoding (constrained), and the report counts the verification rounds."""
    base = ["--prompt", "abab", "--raw", "--temperature", "0", "--max-tokens", "20",
            "--max-len", "96", "--regex", "(ab|cd)+", "--json"]
    rc, plain, err = _generate(runtime, base)
    assert rc == 0, err
    rc, spec, err = _generate(runtime, base + ["--speculative", "ngram", "--num-draft-tokens", "3"])
    assert rc == 0, err
    plain, spec = json.loads(plain), json.loads(spec)
    assert spec["content"] == plain["content"] and re.fullmatch("(ab|cd)+", spec["content"])
    assert spec["constraint"]["verify_rounds"] > 0 and plain["constraint"]["verify_rounds"] == 0


def test_cli_refuses_what_it_cannot_run(runtime):
    rc, out, err = _generate(runtime, ["--prompt", "x", "--raw", "--speculative", "dflash"])
    assert rc == 2 and json.loads(err)["error"]["type"] == "Unsupported"
    assert json.loads(err)["error"]["field"] == "draft_model"  # dflash needs --draft-model
    from services.cli import main

    assert main(["serve", "--speculative", "dflash2", "--port", "1"]) == 2  # before any load
    assert main(["serve", "--draft-model", "/nowhere"]) == 2


def test_serve_flags_reach_the_worker_settings(monkeypatch):
    """`infernix serve --speculative ngram --num-draft-tokens 3` (and the environment variables
    of the same names) become the worker's settings, checked before any model loads."""
    from services.cli import _worker_settings, build_parser
    from services.embedded import WorkerSettings

    args = build_parser().parse_args(["serve", "--speculative", "ngram", "--num-draft-tokens", "3"])
    settings = _worker_settings(WorkerSettings, args)
    assert (settings.speculative, settings.num_draft_tokens, settings.draft_model) == (
        "ngram",
        3,
        None,
    )
    monkeypatch.setenv("INFERNIX_SPECULATIVE", "mtp")
    monkeypatch.setenv("INFERNIX_NUM_DRAFT_TOKENS", "2")
    args = build_parser().parse_args(["serve"])
    assert (args.speculative, args.num_draft_tokens) == ("mtp", 2)
    import argparse

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative", "eagle"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--num-draft-tokens", "0"])
    assert isinstance(args, argparse.Namespace)


def test_stop_strings_end_the_ledger_where_ordinary_decoding_does(runtime):
    """A round whose accepted drafts run past a stop string commits only up to the token that
    completes it: content, usage and the matched stop equal ordinary decoding's."""
    record: dict = {}

    async def run(stop, proposer=None):
        client = open_client(
            runtime,
            max_batch=1,
            max_len=128,
            **({"speculative": "ngram", "num_draft_tokens": 6} if proposer else {}),
        )
        if proposer is not None:
            with_proposer(client, proposer, 6)
        client.engine.finish_listeners.append(
            lambda job: record.__setitem__(job.request_id, job.prompt_ids + tuple(job.output_ids)))
        try:
            opts = RequestOptions(
                max_tokens=30, stop=stop, sampling=SamplingParams(temperature=0.0)
            )
            _, fin = await collect(client, text_request(f"r{bool(stop)}{bool(proposer)}",
                                                        "abcabc", opts, runtime.name))
            return fin
        finally:
            await client.aclose()

    free = asyncio.run(run(()))
    assert len(free.content) > 8
    stop = free.content[5:7]  # a stop string the free output reaches mid-round
    plain = asyncio.run(run((stop,)))
    oracle = OracleProposer()
    oracle.record(record["rFalseFalse"])  # the continuation past the stop string
    spec = asyncio.run(run((stop,), oracle))
    assert plain.finish_reason.value == "stop" and plain.stop_sequence == stop
    assert (spec.content, spec.usage.completion_tokens, spec.stop_sequence) == \
        (plain.content, plain.usage.completion_tokens, plain.stop_sequence)


def test_speculation_metrics(runtime):
    """Prometheus counters of the verify rounds, their drafts (proposed / accepted) and the
    host's draft wait, fixed labels only."""
    from prometheus_client import generate_latest

    async def main():
        client = open_client(runtime, max_batch=1, max_len=96, speculative="ngram",
                             num_draft_tokens=3)
        with_proposer(client, Scripted(lambda c, k: c[-k:]), 3)
        try:
            await collect(client, text_request("m", "abab", greedy(10), runtime.name))
            return client.engine
        finally:
            await client.aclose()

    engine = asyncio.run(main())
    text = generate_latest(engine.metrics.registry).decode()
    spec = engine.speculation
    assert f"infernix_worker_spec_rounds_total {float(spec.rounds)}" in text and spec.rounds > 0
    assert (
        f'infernix_worker_spec_draft_tokens_total{{result="proposed"}} {float(spec.drafts)}' in text
    )
    assert (
        f'infernix_worker_spec_draft_tokens_total{{result="accepted"}} {float(spec.accepted)}'
        in text
    )
    assert "infernix_worker_spec_draft_wait_seconds_total" in text
