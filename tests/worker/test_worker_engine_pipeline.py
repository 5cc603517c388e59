"""The Engine's pipeline (EngineConfig.pipeline; on by default on CUDA): decode step n+1 is
launched before step n is committed, and samples only the rows that step n's commit left where the
launch assumed; a prefill step of rows joining the batch is launched before the held step n
commits. Design rule it must keep (DESIGN.md, section 5): "Nothing of a step is committed
until the commit path has previewed every row" and a row left out "leaves no trace": so every
request's events, text, finish reason and usage are exactly those of the unpipelined engine, for
greedy, seeded sampling, penalties, JSON Schema, stop strings and stop ids, lane ends,
cancellation, and requests joining and leaving the batch. The CPU runs the same code with
pipeline=True (its forward is synchronous, so only the ordering is exercised, not the overlap).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from shared.contract import OutputConstraint
from shared.generation import Finished, GenerationEvent, RequestOptions, SamplingParams
from tests.support.worker_support import greedy, open_client, text_request, tiny_runtime

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a", "b"]}


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


def _requests(runtime) -> list:
    name = runtime.name
    sampled = RequestOptions(
        max_tokens=14, sampling=SamplingParams(temperature=0.9, top_p=0.9, seed=7)
    )
    penalized = RequestOptions(max_tokens=12, sampling=SamplingParams(
        temperature=0.0, presence_penalty=0.8, frequency_penalty=0.3))
    return [
        text_request("greedy", "Once upon a time", greedy(20), name),
        text_request("short", "x", greedy(3), name),
        text_request("sampled", "The quick brown fox", sampled, name),
        text_request("penalized", "0123456789", penalized, name),
        text_request(
            "schema",
            "json please",
            greedy(40, constraint=OutputConstraint.json_schema(SCHEMA)),
            name,
        ),
        text_request("stop", "abc abc abc", greedy(30, stop=("b", "zz")), name),
        text_request("stop_id", "tiny", greedy(25, stop_token_ids=(ord("e"), ord("a"))), name),
        text_request(
            "late", "Another prompt that needs several prefill chunks to fit in.", greedy(16), name
        ),
        # no max_tokens: until the lane is full, so the last steps sit at the lane's end
        text_request(
            "to_end",
            "fill the lane",
            RequestOptions(sampling=SamplingParams(temperature=0.0)),
            name,
        ),
    ]


async def _events(client, request) -> list[GenerationEvent]:
    out = []
    async for event in client.generate(request):
        out.append(event)
        if isinstance(event, Finished):
            return out
    raise AssertionError("no Finished")


def _comparable(events: list[GenerationEvent]) -> list:
    # every event as published; of Finished all but the wall-clock figures (its timings and the
    # constraint report's seconds / milliseconds)
    out = []
    for e in events:
        fields = {k: v for k, v in vars(e).items() if k != "timings"}
        if isinstance(fields.get("constraint"), dict):
            fields["constraint"] = {k: v for k, v in fields["constraint"].items()
                                    if not k.endswith(("_seconds", "_ms"))}
        out.append((type(e).__name__, fields))
    return out


async def _run(runtime, pipeline: bool, **config) -> tuple[dict, object]:
    client = open_client(runtime, pipeline=pipeline, **config)
    program = client.engine.program
    launch = program.launch

    outside = []  # rows fed past their lane's end (on CUDA: a stray write into another lane)

    def checked_launch(batch):
        outside.extend(r.request.request_id for r in batch.rows if r.end > program.max_len)
        return launch(batch)

    program.launch = checked_launch
    try:
        requests = _requests(runtime)
        tasks = {}
        for i, r in enumerate(requests):  # staggered arrivals: rows join a running batch
            tasks[r.request_id] = asyncio.create_task(_events(client, r))
            await asyncio.sleep(0.002 * (i % 3))
        results = {k: _comparable(await t) for k, t in tasks.items()}
        engine = client.engine
    finally:
        await client.aclose()
    assert not outside, outside
    return results, engine


@pytest.mark.asyncio
@pytest.mark.parametrize("config", [dict(max_batch=4, max_len=96, prefill_chunk=8),
                                    dict(max_batch=8, max_len=80, prefill_chunk=64)],
                         ids=["4-lanes-chunked", "8-lanes-short-lanes"])
async def test_pipelined_engine_publishes_exactly_what_the_unpipelined_one_does(runtime, config):
    """Same requests, same arrival pattern, pipeline off and on: identical event streams per
    request (texts, usage, finish reasons, constraint reports). A request without max_tokens runs
    to the end of its lane, where the pipeline must not chain a step past it."""
    plain, engine_plain = await _run(runtime, False, **config)
    piped, engine_piped = await _run(runtime, True, **config)
    assert engine_plain.pipeline.chained_steps == 0 and not engine_plain.pipeline.enabled
    assert engine_piped.pipeline.enabled
    assert engine_piped.pipeline.chained_steps > 0  # the pipeline really ran
    # and rows joining the batch prefilled while the held decode step committed
    assert engine_plain.pipeline.overlapped_prefills == 0
    assert engine_piped.pipeline.overlapped_prefills > 0
    assert plain.keys() == piped.keys()
    for rid in plain:
        assert piped[rid] == plain[rid], rid
    finished = {rid: events[-1][1] for rid, events in piped.items()}
    assert (
        finished["schema"]["constraint"]["complete"]
        or finished["schema"]["finish_reason"].value == "length"
    )
    assert finished["to_end"]["finish_reason"].value == "length"
    # the lane holds every position; the last output token is sampled, never fed
    assert (
        finished["to_end"]["usage"].prompt_tokens + finished["to_end"]["usage"].completion_tokens
        == config["max_len"] + 1
    )


@pytest.mark.asyncio
async def test_cancelled_request_leaves_the_others_exact(runtime):
    """A request cancelled while its next step is already launched (the consumer goes away
    mid-stream) finishes as cancelled; the rows beside it publish what they publish alone."""
    async def scenario(pipeline: bool):
        client = open_client(runtime, pipeline=pipeline, max_batch=3, max_len=96)
        try:
            keep = [text_request(f"k{i}", p, greedy(18), runtime.name)
                    for i, p in enumerate(["Once upon a time", "0123456789"])]
            tasks = [asyncio.create_task(_events(client, r)) for r in keep]
            victim = text_request("victim", "The quick brown fox", greedy(40), runtime.name)
            seen = 0
            async for event in client.generate(victim):
                seen += 1
                if seen == 5:
                    break  # the consumer leaves: the engine cancels the request
            results = [_comparable(await t) for t in tasks]
            engine = client.engine
        finally:
            await client.aclose()
        return results, engine

    plain, _ = await scenario(False)
    piped, engine = await scenario(True)
    assert engine.pipeline.chained_steps > 0
    assert piped == plain


# ---------------------------------------------------------------- a hybrid model (Qwen3.5)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    from services.worker.runtime import load_runtime
    from tests.support.qwen35_support import hf_causal_lm

    path = tmp_path_factory.mktemp("qwen35-pipeline")
    hf_causal_lm(seed=7).save_pretrained(str(path))
    # float64: batched and isolated arithmetic agree far below any sampling boundary, so the two
    # engines' different batch compositions cannot flip a token (float32 did, once in a while)
    return load_runtime(str(path), dtype=torch.float64)


def _qwen35_requests(rt) -> list:
    from shared.generation import ChatMessage, GenerateRequest, PromptInput

    question = PromptInput(messages=(ChatMessage("user", "Is the sky blue?"),))
    name = rt.name
    return [
        text_request("greedy", "Once upon a time", greedy(12), name),
        text_request(
            "sampled",
            "The quick brown fox",
            RequestOptions(max_tokens=10, sampling=SamplingParams(temperature=0.9, seed=3)),
            name,
        ),
        text_request(
            "schema",
            "json please",
            greedy(24, constraint=OutputConstraint.json_schema(SCHEMA)),
            name,
        ),
        # thinking on, its budget forces the close after a committed step (tokens then prefilled)
        GenerateRequest("budget", question, greedy(14, thinking_budget=4), model=name),
        text_request("short", "x", greedy(3), name),
    ]


async def _run_qwen35(rt, pipeline: bool, requests) -> tuple[dict, object]:
    client = open_client(rt, pipeline=pipeline, max_batch=4, max_len=96, prefill_chunk=16)
    try:
        tasks = {r.request_id: asyncio.create_task(_events(client, r)) for r in requests}
        results = {k: _comparable(await t) for k, t in tasks.items()}
        engine = client.engine
    finally:
        await client.aclose()
    return results, engine


@pytest.mark.asyncio
async def test_pipelined_hybrid_model_publishes_what_the_unpipelined_one_does(qwen35):
    """A hybrid model chains too: step n's recurrent state is committed ahead of its preview (the
    slot flip), so step n+1 reads it; rows left out of step n+1 (finished, or a thinking budget's
    forced close, whose tokens are then prefilled) keep the state step n left. Event for event
    equal to the unpipelined engine, on a tiny random Qwen3.5 (3 GDN + 2 attention layers)."""
    plain, engine_plain = await _run_qwen35(qwen35, False, _qwen35_requests(qwen35))
    piped, engine = await _run_qwen35(qwen35, True, _qwen35_requests(qwen35))
    assert engine.program.recurrent and engine.pipeline.enabled
    assert engine.pipeline.chained_steps > 0
    assert engine_plain.pipeline.chained_steps == 0
    assert engine.pipeline.overlapped_prefills > 0  # rows prefilling while others decode
    for rid in plain:
        assert piped[rid] == plain[rid], rid
    assert engine.metrics.forced_closes._value.get() == 1


@pytest.mark.asyncio
async def test_hybrid_row_of_an_aborted_chained_round_resumes_by_replay(qwen35, monkeypatch):
    """Design rule: when a preview fails "every preview of the batch is restored and the round
    aborts: nothing commits, the failing row finishes with the internal error, the others run the
    same step again". With the pipeline the aborted step's recurrent state was already committed
    ahead (and the next step launched), so the survivor resumes by Replay from its committed
    tokens: its output equals its output alone."""
    from services.worker.output.preview import PreviewResult
    from services.worker.output.session import OutputSession
    from shared.errors import InternalError

    original = OutputSession.preview
    calls = {"n": 0}

    def failing(self, tokens, **kwargs):
        if self.constrained:
            calls["n"] += 1
            if calls["n"] == 4:
                return PreviewResult(0, failure=InternalError("injected preview failure"))
        return original(self, tokens, **kwargs)

    from services.worker.engine.scheduler import Scheduler

    survivor = text_request("survivor", "Once upon a time", greedy(30), qwen35.name)
    alone, _ = await _run_qwen35(qwen35, False, [survivor])
    monkeypatch.setattr(OutputSession, "preview", failing)
    paused = []
    pause = Scheduler.pause
    monkeypatch.setattr(Scheduler, "pause", lambda self, job, program: (
        paused.append(job.request_id), pause(self, job, program)))
    regex = OutputConstraint.regex("[0-9]{10}")
    piped, engine = await _run_qwen35(qwen35, True, [
        survivor, text_request("failing", "pick", greedy(10, constraint=regex), qwen35.name)])
    assert calls["n"] >= 4 and engine.pipeline.chained_steps > 0
    failed = piped["failing"][-1][1]
    assert failed["finish_reason"].value == "error" and "injected" in failed["error"]["message"]
    assert piped["survivor"] == alone["survivor"]
    assert paused == ["survivor"]  # the Replay really ran


def test_no_pipeline_flag_reaches_the_engine(monkeypatch):
    """`--no-pipeline` (and INFERNIX_NO_PIPELINE) turn the pipeline off in the worker's settings
    of `serve` and `worker serve` (open_worker passes EngineConfig(pipeline=False) then; by
    default None: the Engine pipelines on CUDA)."""
    from services.cli import _worker_settings, build_parser
    from services.embedded import WorkerSettings

    for command in (["serve"], ["worker", "serve"]):
        on = _worker_settings(WorkerSettings, build_parser().parse_args(command))
        off = _worker_settings(
            WorkerSettings, build_parser().parse_args(command + ["--no-pipeline"])
        )
        assert on.pipeline and not off.pipeline
    monkeypatch.setenv("INFERNIX_NO_PIPELINE", "1")
    assert not _worker_settings(WorkerSettings, build_parser().parse_args(["serve"])).pipeline


@pytest.mark.asyncio
async def test_a_failed_chained_launch_commits_the_held_step_then_fails_its_rows(runtime):
    """Design rule (section 5): a step that fails as a whole fails its rows and commits nothing of
    itself; the step before it is unaffected. When the launch of chained step n+1 raises, step n
    (already sampled) still commits and publishes, then the rows finish with the internal error:
    each published text is exactly the greedy output up to its committed tokens."""
    from tests.support.worker_support import oracle_greedy, text_of

    client = open_client(runtime, pipeline=True, max_batch=2, max_len=96)
    program = client.engine.program
    launch, before = program.launch, {}

    def failing(batch):
        if client.engine.pipeline.chained_steps == 3:  # output committed before the held step's
            before.update({r.request.request_id: r.request.num_output_tokens for r in batch.rows})
            raise RuntimeError("injected launch failure")
        return launch(batch)

    program.launch = failing
    prompts = ["Once upon a time", "0123456789"]
    try:
        results = await asyncio.gather(
            *(
                _events(client, text_request(f"r{i}", p, greedy(20), runtime.name))
                for i, p in enumerate(prompts)
            )
        )
    finally:
        await client.aclose()
    assert len(before) == 2
    for i, (events, prompt) in enumerate(zip(results, prompts)):
        fin = events[-1]
        assert (
            fin.finish_reason.value == "error" and "injected launch failure" in fin.error["message"]
        )
        n = fin.usage.completion_tokens
        assert n == before[f"r{i}"] + 1  # the held step's token committed, then failed
        expected = text_of(
            runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(prompt), n)
        )
        assert (
            fin.content
            == expected
            == "".join(e.text for e in events if type(e).__name__ == "TextDelta")
        )
