"""Engine: request lifecycle (cancellation, deadlines, limits, stops, per-row failures,
rejections)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode
from shared.errors import (
    ConflictingConstraint,
    ConstraintDeadEnd,
    InvalidRequest,
    InvalidSchema,
    Unsupported,
)
from shared.generation import ChatMessage, GenerateRequest, PromptInput
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


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime(no_z_domain())


def expect(runtime, prompt: str, n: int) -> list[int]:
    return oracle_greedy(runtime, runtime.tokenizer.encode(prompt), n)


async def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------- per-row failures


@pytest.mark.asyncio
async def test_dead_end_fails_only_its_row(runtime):
    """Design: "When the CPU knows an ordinary next position is a DeadEnd it may end the request
    ... The failed row commits zero tokens this round ... the Engine completes the request with an
    error ... The other rows complete the batch commit." choice ["az"] with 'z' never generable:
    after 'a' nothing is legal."""
    client = open_client(runtime, max_batch=3, max_len=96)
    try:
        results = await asyncio.gather(
            collect(client, text_request("free1", "left", greedy(12), runtime.name)),
            collect(
                client,
                text_request(
                    "dead",
                    "pick",
                    greedy(12, constraint=OutputConstraint.choice(["az"])),
                    runtime.name,
                ),
            ),
            collect(client, text_request("free2", "right side", greedy(12), runtime.name)),
        )
    finally:
        await client.aclose()
    (_, free1), (deltas, dead), (_, free2) = results
    assert dead.finish_reason.value == "error"
    assert dead.error["type"] == "ConstraintDeadEnd" and dead.error["position"] == 1
    assert dead.content == "a" == "".join(deltas) and dead.usage.completion_tokens == 1
    assert dead.constraint["complete"] is False and dead.constraint["terminated"] is False
    assert free1.content == text_of(runtime.domain, expect(runtime, "left", 12))
    assert free2.content == text_of(runtime.domain, expect(runtime, "right side", 12))


@pytest.mark.asyncio
async def test_no_legal_first_token_is_a_request_error(runtime):
    """Design: "A generation request with no legal token at its initial position returns a
    request error." It raises before any event."""
    client = open_client(runtime, max_batch=1, max_len=64)
    try:
        with pytest.raises(ConstraintDeadEnd) as err:
            await collect(
                client,
                text_request(
                    "d0", "p", greedy(5, constraint=OutputConstraint.choice(["z"])), runtime.name
                ),
            )
        assert err.value.position == 0
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_nonfinite_logits_fail_only_their_row():
    """Design: "A row whose logits leave no finite selection carries NonFiniteLogits ... it
    commits nothing and its request fails with an internal error while the other rows commit."
    NaN logits are injected once into the victim's lane during a 3-row decode step."""
    rt, model = hooked(tiny_runtime(no_z_domain()))
    client = open_client(rt, max_batch=3, max_len=96)
    poisoned = []

    def poison(logits, positions, lanes):
        if not poisoned and positions.shape == (3, 1):  # a decode step holding all three rows
            row = int(torch.nonzero(lanes == 0)[0, 0])
            logits[row] = float("nan")
            poisoned.append(row)

    try:
        victim = asyncio.create_task(
            collect(client, text_request("victim", "first", greedy(40), rt.name))
        )
        await wait_for(lambda: model.calls > 0)  # the victim owns lane 0
        others = [
            asyncio.create_task(collect(client, text_request(f"o{i}", p, greedy(10), rt.name)))
            for i, p in enumerate(["second", "third one"])
        ]
        model.after = poison
        (deltas, bad), *good = await asyncio.gather(victim, *others)
    finally:
        await client.aclose()
    assert poisoned
    assert bad.finish_reason.value == "error" and bad.error["type"] == "InternalError"
    assert "non-finite" in bad.error["message"]
    k = bad.usage.completion_tokens
    assert 1 <= k < 40
    assert bad.content == text_of(rt.domain, expect(rt, "first", 40)[:k]) == "".join(deltas)
    for (_, fin), prompt in zip(good, ["second", "third one"]):
        assert fin.content == text_of(rt.domain, expect(rt, prompt, 10))


# ---------------------------------------------------------------- cancellation and deadlines


@pytest.mark.asyncio
async def test_cancel_during_a_round_commits_nothing_and_frees_the_lane():
    """Design: "a cancelled row accepts zero tokens"; "A cancelled row also commits nothing but is
    classified as cancelled." The cancel arrives inside the 5th forward (prefill + 4 decodes): the
    4 tokens committed before stay, the 5th round's token is not committed, and the freed lane
    serves the next request exactly (stale KV never read)."""
    rt, model = hooked(tiny_runtime(no_z_domain()))
    client = open_client(rt, max_batch=1, max_len=96)
    model.before = lambda *a: model.calls == 5 and client.engine.cancel("a")
    try:
        deltas, fin = await collect(client, text_request("a", "cancel me", greedy(50), rt.name))
        model.before = None
        assert client.engine.program.free_lanes == 1
        _, after = await collect(client, text_request("b", "next", greedy(12), rt.name))
    finally:
        await client.aclose()
    assert fin.finish_reason.value == "cancelled"
    assert fin.usage.completion_tokens == 4
    assert fin.content == "".join(deltas) == text_of(rt.domain, expect(rt, "cancel me", 4))
    assert after.content == text_of(rt.domain, expect(rt, "next", 12))


@pytest.mark.asyncio
async def test_cancel_waiting_request_and_closed_stream(runtime):
    """A queued request cancelled before it got a lane finishes as cancelled with no output; a
    consumer that closes its stream cancels its request (the lane frees); the running request is
    unaffected."""
    held, release = threading.Event(), threading.Event()

    def hold_first_forward(tokens, positions, lanes):  # keeps the lane busy until the cancel is in
        if not release.is_set():
            held.set()
            release.wait(20)

    hooked_runtime, model = hooked(runtime)
    model.before = hold_first_forward
    client = open_client(hooked_runtime, max_batch=1, max_len=96)
    try:
        running = asyncio.create_task(
            collect(client, text_request("run", "busy", greedy(30), runtime.name))
        )
        await wait_for(held.is_set)
        queued = asyncio.create_task(
            collect(client, text_request("queued", "wait", greedy(5), runtime.name))
        )
        await wait_for(lambda: "queued" in client.engine._live)
        await client.cancel("queued")
        release.set()
        deltas, fin = await queued
        assert (
            fin.finish_reason.value == "cancelled"
            and deltas == []
            and fin.usage.completion_tokens == 0
        )
        _, done = await running
        assert done.content == text_of(runtime.domain, expect(runtime, "busy", 30))
        stream = client.generate(text_request("closed", "bye", greedy(60), runtime.name))
        await stream.__anext__()
        await stream.aclose()
        await wait_for(lambda: client.engine.health()["resident"] == 0 and not client.engine._live)
        assert client.engine.program.free_lanes == 1
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_deadlines_in_the_queue_and_while_running():
    """timeout_s is a deadline from submission: a request that waits past it and one that runs past
    it both finish with a DeadlineExceeded error; what was published stays published."""
    rt, model = hooked(tiny_runtime(no_z_domain()))
    model.before = lambda *a: __import__("time").sleep(0.02)
    client = open_client(rt, max_batch=1, max_len=200)
    try:
        running = asyncio.create_task(collect(client, text_request(
            "slow", "slow", greedy(150, timeout_s=0.5), rt.name)))
        await wait_for(lambda: client.engine.health()["resident"] == 1)
        deltas_q, queued = await collect(
            client, text_request("late", "late", greedy(5, timeout_s=0.1), rt.name)
        )
        deltas_r, slow = await running
    finally:
        await client.aclose()
    assert queued.finish_reason.value == "error" and queued.error["type"] == "DeadlineExceeded"
    assert deltas_q == [] and queued.usage.completion_tokens == 0
    assert slow.finish_reason.value == "error" and slow.error["type"] == "DeadlineExceeded"
    assert 0 < slow.usage.completion_tokens < 150
    assert (
        slow.content
        == "".join(deltas_r)
        == text_of(rt.domain, expect(rt, "slow", slow.usage.completion_tokens))
    )


# ---------------------------------------------------------------- limits and stops


@pytest.mark.asyncio
async def test_length_limit_reports_incomplete_and_complete_content(runtime):
    """Design: "A complete JSON stopping exactly at the length limit may record complete content
    while the finish reason stays the length limit"; content cut earlier is incomplete. The schema
    needs at least 9 tokens, so 4 cannot complete it; "xyq" takes exactly 3 single-byte tokens."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    client = open_client(runtime, max_batch=2, max_len=96)
    try:
        _, cut = await collect(
            client,
            text_request(
                "cut",
                "json",
                greedy(4, constraint=OutputConstraint.json_schema(schema)),
                runtime.name,
            ),
        )
        _, exact = await collect(client, text_request(
            "exact", "c", greedy(3, constraint=OutputConstraint.choice(["xyq"])), runtime.name))
        _, ended = await collect(client, text_request(
            "ended", "c", greedy(10, constraint=OutputConstraint.choice(["xyq"])), runtime.name))
    finally:
        await client.aclose()
    assert cut.finish_reason.value == "length" and cut.usage.completion_tokens == 4
    assert cut.constraint["complete"] is False and cut.constraint["terminated"] is False
    with pytest.raises(ValueError):
        json.loads(cut.content)
    assert exact.finish_reason.value == "length" and exact.content == "xyq"
    assert exact.constraint["complete"] is True and exact.constraint["terminated"] is False
    assert ended.finish_reason.value == "stop" and ended.content == "xyq"
    assert ended.constraint["terminated"] is True and ended.usage.completion_tokens == 4


@pytest.mark.asyncio
async def test_stop_strings_and_stop_token_ids_for_unconstrained_requests(runtime):
    """Stop strings cut the published text before their first occurrence (never published, also
    not partially while streaming); a stop token id ends the output without publishing it."""
    prompt, n = "stop strings", 40
    tokens = expect(runtime, prompt, n)
    text = text_of(runtime.domain, tokens)
    i = next(i for i in range(3, len(text) - 1) if "\ufffd" not in text[i:i + 2])
    stop = text[i:i + 2]
    j = (
        6
        if tokens[6] not in tokens[:6]
        else next(k for k in range(1, n) if tokens[k] not in tokens[:k])
    )
    client = open_client(runtime, max_batch=2, max_len=96)
    try:
        deltas, by_string = await collect(
            client, text_request("s", prompt, greedy(n, stop=(stop, "\x00never")), runtime.name)
        )
        _, by_id = await collect(
            client, text_request("t", prompt, greedy(n, stop_token_ids=(tokens[j],)), runtime.name)
        )
    finally:
        await client.aclose()
    assert by_string.finish_reason.value == "stop"
    assert by_string.content == text[:text.index(stop)] == "".join(deltas)
    assert all(stop not in d for d in deltas)
    assert by_id.finish_reason.value == "stop"
    assert by_id.content == text_of(runtime.domain, tokens[:j])
    assert by_id.usage.completion_tokens == j + 1


# ---------------------------------------------------------------- rejections before any event


@pytest.mark.asyncio
async def test_request_errors_raise_before_any_event(runtime):
    """Design: "extra stop strings, custom stop token ids and options that publish EOS text are
    rejected" for constrained requests; invalid grammars "return request errors before the
    execution queue"; tools with a raw text prompt have no framing (Unsupported), tool_choice
    none renders the tools and generates content."""
    choice = OutputConstraint.choice(["a", "b"])
    tool = ToolDefinition.create("get_time")
    client = open_client(runtime, max_batch=2, max_len=1024)

    async def first_event(request):
        async for event in client.generate(request):
            return event

    try:
        with pytest.raises(ConflictingConstraint) as err:
            await first_event(
                text_request("x1", "p", greedy(5, constraint=choice, stop=("b",)), runtime.name)
            )
        assert err.value.field == "stop"
        with pytest.raises(ConflictingConstraint) as err:
            await first_event(
                text_request(
                    "x2", "p", greedy(5, constraint=choice, stop_token_ids=(3,)), runtime.name
                )
            )
        assert err.value.field == "stop_token_ids"
        with pytest.raises(InvalidSchema):
            await first_event(
                text_request(
                    "x3",
                    "p",
                    greedy(
                        5,
                        constraint=OutputConstraint.json_schema(
                            {"type": "object", "properties": {"a": {"type": "nonsense"}}}
                        ),
                    ),
                    runtime.name,
                )
            )
        with pytest.raises(InvalidRequest) as err:
            await first_event(
                GenerateRequest("x4", PromptInput(text="p"), greedy(5), model="other")
            )
        assert err.value.field == "model"
        messages = (ChatMessage("user", "hi"),)
        with pytest.raises(Unsupported) as err:
            await first_event(GenerateRequest("x5", PromptInput(text="p", tools=(tool,)),
                                              greedy(5), model=runtime.name))
        assert err.value.field == "tools"
        none = greedy(5, tool_choice=ToolChoice(mode=ToolMode.NONE))
        _, fin = await collect(
            client,
            GenerateRequest(
                "x6", PromptInput(messages=messages, tools=(tool,)), none, model=runtime.name
            ),
        )
        assert fin.finish_reason.value in ("stop", "length") and fin.usage.completion_tokens >= 1
        assert fin.usage.prompt_tokens == await client.count_tokens(
            PromptInput(messages=messages, tools=(tool,)), runtime.name)
        long = asyncio.create_task(
            collect(client, text_request("dup", "p", greedy(90), runtime.name))
        )
        await wait_for(lambda: "dup" in client.engine._live)
        with pytest.raises(InvalidRequest) as err:
            await first_event(text_request("dup", "p", greedy(5), runtime.name))
        assert err.value.field == "request_id"
        await long
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_required_strict_tool_call_streams_and_validates(runtime):
    """Design: "Required / named allow only the tool sequence this turn"; "Every strict tool's final
    arguments_json satisfies its argument schema"; argument fragments "concatenate to the call's
    final arguments_json"; the report's branch is "tools"."""
    import json

    import jsonschema

    from shared.generation import ToolCallArgumentsDelta, ToolCallStart

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tools = (ToolDefinition.create("pick", schema, strict=True), ToolDefinition.create("other"))
    client = open_client(runtime, max_batch=2, max_len=2048)
    request = GenerateRequest(
        "t1",
        PromptInput(messages=(ChatMessage("user", "pick"),), tools=tools),
        greedy(196, tool_choice=ToolChoice.named("pick")),
        model=runtime.name,
    )
    try:
        events = [e async for e in client.generate(request)]
    finally:
        await client.aclose()
    fin = events[-1]
    assert fin.finish_reason.value == "tool_calls", fin
    assert [c.name for c in fin.tool_calls] == ["pick"] and fin.content == ""
    jsonschema.validate(json.loads(fin.tool_calls[0].arguments_json), schema)
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["pick"]
    fragments = "".join(e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert fragments == fin.tool_calls[0].arguments_json
    assert fin.constraint["branch"] == "tools" and fin.constraint["terminated"] is True
