"""A failure inside one request (its finishing, its matcher, its publication) stays that
request's failure.

Issue 12: "no stage's failure becomes everyone's failure". Found by the load test under faults
(tests/e2e/test_loadtest_faults.py): a tool-call decoder error at the end of one truncated request
escaped `finish`, the engine thread's own failure handler hit it again and the thread ended, so
every request resident on that worker hung and every later one got 500 "the engine is not
running".
"""

from __future__ import annotations

import asyncio
import json

import pytest

from services.grammar.engines import engine_llguidance
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition
from shared.errors import InternalError
from shared.frontends.formats import hermes
from shared.generation import ChatMessage, FinishReason, GenerateRequest, PromptInput
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    text_request,
    tiny_runtime,
)


@pytest.mark.asyncio
async def test_a_tool_decoder_bug_fails_its_request_and_the_engine_keeps_serving(monkeypatch):
    runtime = tiny_runtime()

    def broken(self, *, complete):
        raise IndexError("pop from empty list")

    monkeypatch.setattr(hermes.ToolStream, "finish", broken)
    tools = (ToolDefinition.create("ping", {"type": "object"}),)
    client = open_client(runtime, max_batch=2, max_len=1024)
    try:
        request = GenerateRequest("tools", PromptInput(messages=(ChatMessage("user", "hi"),),
                                                       tools=tools),
                                  greedy(4, tool_choice=ToolChoice()), model=runtime.name)
        _, failed = await collect(client, request)
        assert failed.finish_reason is FinishReason.ERROR
        assert failed.error["type"] == "InternalError" and "IndexError" in failed.error["message"]
        _, after = await collect(client, text_request("after", "hello", greedy(3), runtime.name))
        assert after.finish_reason is FinishReason.LENGTH and after.error is None
        assert client.engine.health()["status"] == "ok"
    finally:
        await client.aclose()


# ---------------------------------------------------------------- a matcher that raises


HEALTHY = {
    "json": OutputConstraint.json_schema({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}}, "required": ["name"]}),
    "regex": OutputConstraint.regex("[a-z]{3,20}"),
    "free": None,
}
POISONED = OutputConstraint.json_schema({"type": "string", "enum": ["poison", "pill"]})


def _poison(monkeypatch, where: str) -> None:
    """Matchers of the POISONED grammar (llguidance: its Lark text names "poison") raise from
    llguidance itself, as the row limit did: in the batched mask fill (the engine's check after
    the fill) or in accepting a produced token; every other matcher is untouched."""

    class Poisoned(engine_llguidance.LlguidanceMatcher):
        checks = accepts = 0

        def _check(self) -> None:
            self.checks += 1
            if where == "fill" and self.checks >= 3:  # the first: the initial mask at prepare
                raise InternalError("llguidance matcher failed: Parser Error: Current row has "
                                    "5001 items; max is 2000")
            super()._check()

        def accept_token(self, token: int) -> bool:
            self.accepts += 1
            if where == "accept" and self.accepts >= 2:
                raise RuntimeError("injected: the engine raised while accepting")
            return super().accept_token(token)

    original = engine_llguidance.LlguidanceConstraint.matcher
    monkeypatch.setattr(engine_llguidance.LlguidanceConstraint, "matcher",
                        lambda self: Poisoned(self) if "poison" in self.lark else original(self))


async def _run_together(client, runtime, names) -> dict:
    async def one(name):
        constraint = POISONED if name == "poisoned" else HEALTHY[name]
        return await collect(client, text_request(
            name, f"{name}:", greedy(24, constraint=constraint), runtime.name))
    results = await asyncio.gather(*(one(n) for n in names))
    return dict(zip(names, results))


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["fill", "accept"])
async def test_a_matcher_that_raises_fails_only_its_own_row(monkeypatch, where):
    """The seed's per-row dead end: "The failed row commits zero tokens this round ... the Engine
    completes the request with an error ... The other rows complete the batch commit." A matcher
    failure at decode time (the llguidance row limit, an engine bug) is that row's: the poisoned
    row fails typed, the healthy rows beside it in the same steps (llguidance, xgrammar and
    unconstrained) publish exactly what they publish without it, and the engine keeps serving."""
    runtime = tiny_runtime()
    client = open_client(runtime, max_batch=4, max_len=256)
    try:
        alone = await _run_together(client, runtime, list(HEALTHY))
        _poison(monkeypatch, where)
        steps = client.engine.steps
        together = await _run_together(client, runtime, [*HEALTHY, "poisoned"])
        assert client.engine.steps > steps
        for name in HEALTHY:
            assert together[name][1].error is None, together[name][1].error
            assert "".join(together[name][0]) == "".join(alone[name][0]), name
            assert together[name][1].finish_reason is alone[name][1].finish_reason
        _, failed = together["poisoned"]
        assert failed.finish_reason is FinishReason.ERROR
        assert failed.error["type"] == "InternalError"
        assert "the constraint engine failed at output position" in failed.error["message"]
        assert client.engine.health()["status"] == "ok"
        again = await _run_together(client, runtime, ["json"])
        assert "".join(again["json"][0]) == "".join(alone["json"][0])
    finally:
        await client.aclose()


# ---------------------------------------------------------------- publication errors

TOOLS = (ToolDefinition.create("ping", {"type": "object"}),)


def _tool_request(name: str, runtime, n: int = 12, **options) -> GenerateRequest:
    return GenerateRequest(name, PromptInput(messages=(ChatMessage("user", name),), tools=TOOLS),
                           greedy(n, **options), model=runtime.name)


@pytest.mark.asyncio
async def test_a_publication_error_fails_its_row_and_not_the_batch(monkeypatch):
    """Issue: "An error in the tool decoder while publishing is not caught per row: every
    co-resident request ends with an engine failure ... Publication errors are per-row, typed."
    One request's tool stream raises while its committed tokens publish; the free-text requests
    beside it in the same steps publish what they publish without it."""
    runtime = tiny_runtime()
    client = open_client(runtime, max_batch=4, max_len=1024)
    names = ["a", "b", "c"]
    try:
        async def batch(with_tools: bool):
            jobs = [collect(client, text_request(n, f"{n}:", greedy(16), runtime.name))
                    for n in names]
            if with_tools:
                jobs.append(collect(client, _tool_request("tools", runtime)))
            return await asyncio.gather(*jobs)

        alone = await batch(False)
        original = hermes.ToolStream.feed

        def feed(self, text):
            if self.calls or self.content:  # after the first publication: mid-stream
                raise KeyError("injected: the tool decoder failed")
            return original(self, text)

        monkeypatch.setattr(hermes.ToolStream, "feed", feed)
        results = await batch(True)
        for (deltas, done), (solo, solo_done) in zip(results[:3], alone):
            assert done.error is None and "".join(deltas) == "".join(solo)
            assert done.finish_reason is solo_done.finish_reason
        _, failed = results[3]
        assert failed.finish_reason is FinishReason.ERROR
        assert failed.error["type"] == "InternalError" and "KeyError" in failed.error["message"]
        assert client.engine.health()["status"] == "ok"
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_a_spelled_opener_inside_json_or_tools_content_is_text():
    """Issue: "The Hermes JSON-or-tools union admits {"answer": "<tool_call>"} but the Hermes
    decoder reads the spelled opener inside the JSON string as a call and raises"; "a spelled
    <tool_call> inside content is text". The model is steered into the JSON branch (its '{'
    logit raised at every position; the grammar decides what is legal)."""
    runtime, model = hooked(tiny_runtime())

    def prefer_brace(logits, positions, lanes):
        logits[..., ord("{")] += 50.0

    model.after = prefer_brace
    schema = {"type": "object", "properties": {"answer": {"const": "<tool_call>"}},
              "required": ["answer"], "additionalProperties": False}
    client = open_client(runtime, max_batch=2, max_len=1024)
    try:
        deltas, done = await collect(client, _tool_request(
            "union", runtime, 40,
            constraint=OutputConstraint.json_schema(schema, whitespace="compact"),
            tool_choice=ToolChoice()))
        assert done.error is None, done.error
        assert done.finish_reason is FinishReason.STOP and not done.tool_calls, done.content
        assert json.loads("".join(deltas)) == {"answer": "<tool_call>"}
        assert done.content == "".join(deltas)
    finally:
        await client.aclose()


def test_the_union_stream_still_reads_a_call_at_the_start():
    stream = hermes.ToolStream(constrained=True, union=True)
    text = hermes.render_call("ping", "{}")
    events = [e for ch in text for e in stream.feed(ch)] + stream.finish(complete=True)
    assert [c.name for c in stream.tool_calls()] == ["ping"] and stream.text() == ""
    assert events
    content = hermes.ToolStream(constrained=True, union=True)
    for ch in '{"answer": "<tool_call>\\n{"}':
        content.feed(ch)
    content.finish(complete=True)
    assert content.text() == '{"answer": "<tool_call>\\n{"}' and not content.tool_calls()
