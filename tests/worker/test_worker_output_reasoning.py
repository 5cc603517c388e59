"""Reasoning through the whole worker: a tiny random-weight Qwen3.5 checkpoint with the real
vocabulary and chat template, served by the Engine (issue 9, section 2).

Design document ("Qwen output phases"): "The reasoning ends at the model's </think> token,
recognized by its id ... The close token and the separator are model framing, not user content
... the content bytes after the separator publish as generated"; "Unconstrained requests use the
same phase decoder"; the thinking budget: "the control string is injected after a committed round
... Control strings call no sampler and consume no sampling RNG; they count toward the output
budget"; "A forced close and a natural close reach the same content state."

Independent basis: transformers' Qwen3_5ForCausalLM greedy on the same weights (whole sequence,
no cache) with the close sequence appended by the test itself where the budget runs out, split
into reasoning and content by the framing rule written out here (not the worker's decoder); the
jsonschema library for constrained content.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch

from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    ReasoningDelta,
    TextDelta,
)
from tests.support.qwen35_support import hf_causal_lm
from tests.support.worker_support import greedy, hooked, open_client

QUESTION = (ChatMessage("user", "Is the sky blue?"),)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35-think")
    hf = hf_causal_lm(seed=5)
    hf.save_pretrained(str(path))
    return hf, load_runtime(str(path))


async def run(client, request: GenerateRequest):
    """(reasoning deltas, text deltas, Finished) of one request."""
    reasoning, text = [], []
    async for event in client.generate(request):
        if isinstance(event, ReasoningDelta):
            assert not text, "reasoning after content"
            reasoning.append(event.text)
        elif isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            return reasoning, text, event
    raise AssertionError("no Finished")


def oracle(hf, runtime, n: int, *, budget: int | None) -> list[int]:
    """Greedy output ids of transformers; at `budget` reasoning tokens the close the budget
    forces (`\\n</think>\\n\\n`, or `</think>\\n\\n` after a line break) is appended."""
    frontend = runtime.frontend
    domain, thinking = frontend.domain, frontend.thinking
    ids = list(runtime.prepare(PromptInput(messages=QUESTION)).token_ids)
    out: list[int] = []
    with torch.no_grad():
        while len(out) < n:
            if budget is not None and len(out) == budget and thinking.close_id not in out:
                tail = b"".join(domain.token_bytes[t] for t in out)
                close = thinking.close_tokens_after_newline if tail.endswith(b"\n") \
                    else thinking.close_tokens
                out += close
                ids += close
                continue
            z = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()
            z[len(domain.token_bytes):] = float("-inf")
            for t in domain.never_ids:
                z[t] = float("-inf")
            t = int(torch.argmax(z))
            out.append(t)
            ids.append(t)
            if t in domain.eos_ids:
                break
    return out[:n]


def split(runtime, out: list[int]) -> tuple[str, str]:
    """Reasoning and content of output ids by the framing rule: reasoning up to the close token
    without the one line break before it; content after it without the separator's bytes."""
    domain, close = runtime.domain, runtime.frontend.thinking.close_id
    data = [t for t in out if t not in domain.eos_ids]
    if close not in data:
        return b"".join(domain.token_bytes[t] for t in data).decode("utf-8", "replace"), ""
    at = data.index(close)
    reasoning = b"".join(domain.token_bytes[t] for t in data[:at])
    reasoning = reasoning[:-1] if reasoning.endswith(b"\n") else reasoning
    content = b"".join(domain.token_bytes[t] for t in data[at + 1:])
    for _ in range(2):
        content = content[1:] if content[:1] == b"\n" else content
    return reasoning.decode("utf-8", "replace"), content.decode("utf-8", "replace")


@pytest.mark.asyncio
async def test_unconstrained_reasoning_and_budget_forced_close_equal_transformers(served):
    """Thinking on (the template's generation prompt leaves `<think>` open): without a budget the
    whole output is reasoning; with `thinking_budget` N the close is forced after N reasoning
    tokens, content follows, and both streams equal transformers' greedy output split by the
    framing rule. Deltas concatenate to Finished's reasoning and content; the forced tokens count
    toward completion_tokens. One lane and preemption at every chance: the two requests pause
    each other, so the forced close is also replayed (prefilled again) after a pause."""
    hf, runtime = served
    client = open_client(runtime, max_batch=1, max_len=256, preempt_after_s=0.0)
    try:
        free, forced = await asyncio.gather(
            run(client, GenerateRequest("free", PromptInput(messages=QUESTION), greedy(10),
                                        runtime.name)),
            run(client, GenerateRequest("forced", PromptInput(messages=QUESTION),
                                        greedy(14, thinking_budget=5), runtime.name)))
    finally:
        await client.aclose()
    close = runtime.frontend.thinking.close_id
    for (reasoning, text, fin), budget, n in ((free, None, 10), (forced, 5, 14)):
        want = oracle(hf, runtime, n, budget=budget)
        want_reasoning, want_content = split(runtime, want)
        assert "".join(reasoning) == fin.reasoning == want_reasoning
        assert "".join(text) == fin.content == want_content
        assert fin.usage.completion_tokens == n
        # Reasoning tokens: up to and including the close token.
        assert fin.usage.reasoning_tokens == (want.index(close) + 1 if close in want else n)
    assert free[2].content == "" and free[2].reasoning
    assert forced[2].content and forced[2].reasoning
    assert client.engine.metrics.forced_closes._value.get() == 1
    assert client.engine.metrics.preemptions._value.get() >= 2


@pytest.mark.asyncio
async def test_thinking_budget_zero_closes_before_any_sample(served):
    """`thinking_budget: 0`: the close is forced at admission, before the first sample; the output
    has no reasoning and its first sampled token is content (transformers with the close appended
    to the prompt)."""
    hf, runtime = served
    client = open_client(runtime, max_batch=1, max_len=256)
    try:
        reasoning, text, fin = await run(client, GenerateRequest(
            "zero", PromptInput(messages=QUESTION), greedy(8, thinking_budget=0), runtime.name))
    finally:
        await client.aclose()
    want_reasoning, want_content = split(runtime, oracle(hf, runtime, 8, budget=0))
    assert reasoning == [] and fin.reasoning == want_reasoning == ""
    assert "".join(text) == fin.content == want_content


@pytest.mark.asyncio
async def test_a_forced_close_is_confirmed_and_published_once_the_lane_holds_it(served):
    """Design document: "the control string and closing boundary are checked first, and matcher
    and decoder state are confirmed only after the Program's append succeeds"; "Forced control |
    no sampling; matcher preview as in section 5, committed with the physical append". While the
    forwards that feed the forced close to the lane run, its matcher preview is held and the
    decoder is still in the reasoning phase (nothing of the close confirmed or published); the
    commit of the step that fed it publishes it, and the output equals transformers' with the
    close appended. A cancel arriving before that commit ends the output without the close: the
    reasoning only, the close neither published nor counted."""
    hf, base = served
    runtime, model = hooked(base)
    close = runtime.frontend.thinking.close_id
    client = open_client(runtime, max_batch=1, max_len=256)
    seen: list[tuple[bool, bool]] = []
    cancel = {"now": False}

    def before(tokens, positions, lanes):
        if close in tokens.flatten().tolist():
            [job] = client.engine.scheduler.resident
            seen.append((job.session.holding, job.output.in_reasoning))
            job.cancel_requested = cancel["now"]

    model.before = before
    want = oracle(hf, runtime, 10, budget=4)
    want_reasoning, want_content = split(runtime, want)
    try:
        reasoning, text, fin = await run(client, GenerateRequest(
            "order", PromptInput(messages=QUESTION), greedy(10, thinking_budget=4), runtime.name))
        assert seen and all(s == (True, True) for s in seen), seen
        assert "".join(reasoning) == fin.reasoning == want_reasoning
        assert "".join(text) == fin.content == want_content and fin.usage.completion_tokens == 10
        assert client.engine.metrics.forced_closes._value.get() == 1
        seen.clear()
        cancel["now"] = True
        reasoning, text, fin = await run(client, GenerateRequest(
            "cancelled", PromptInput(messages=QUESTION), greedy(10, thinking_budget=4),
            runtime.name))
    finally:
        await client.aclose()
    assert seen and all(s == (True, True) for s in seen), seen
    assert fin.finish_reason is FinishReason.CANCELLED
    assert text == [] and fin.content == "" and "".join(reasoning) == fin.reasoning
    assert want_reasoning.startswith(fin.reasoning)
    assert fin.usage.completion_tokens == 4  # the reasoning the budget allowed, no close
    assert client.engine.metrics.forced_closes._value.get() == 1


@pytest.mark.asyncio
async def test_enable_thinking_false_starts_in_content(served):
    """`enable_thinking: false` renders the closed empty think block: nothing is reasoning, and a
    thinking budget has nothing to close."""
    _, runtime = served
    client = open_client(runtime, max_batch=1, max_len=256)
    try:
        reasoning, text, fin = await run(client, GenerateRequest(
            "off", PromptInput(messages=QUESTION, enable_thinking=False),
            greedy(6, thinking_budget=1), runtime.name))
    finally:
        await client.aclose()
    assert reasoning == [] and fin.reasoning == ""
    assert "".join(text) == fin.content and fin.usage.completion_tokens == 6
    assert client.engine.metrics.forced_closes._value.get() == 0


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.mark.asyncio
async def test_json_schema_with_thinking_budget_forced_and_natural_close(served):
    """JSON Schema with thinking on: the grammar's reasoning branch (framing
    qwen-think-v1+raw) lets reasoning run until the budget forces the close through the matcher's
    forced-control preview, then the content is schema-valid JSON, published without the
    separator. A second request whose model emits `</think>` by itself (a logit hook) reaches
    the same content language: a natural close and a forced close end the same way."""
    _, runtime = served
    close_id = runtime.frontend.thinking.close_id
    runtime_hooked, model = hooked(runtime)
    seen = {"n": 0}

    def after(logits, positions, lanes):  # the third sampled token of a decode step: </think>
        if logits.shape[0] == 1 and positions.numel() == 1:
            seen["n"] += 1
            if seen["n"] == 3:
                logits[..., close_id] = 1e4

    model.after = after
    constraint = OutputConstraint.json_schema(SCHEMA)
    results = []
    for rt, rid, budget in ((runtime, "forced", 4), (runtime_hooked, "natural", None)):
        client = open_client(rt, max_batch=1, max_len=256)
        try:
            results.append(await run(client, GenerateRequest(
                rid, PromptInput(messages=QUESTION),
                greedy(48, constraint=constraint, thinking_budget=budget), rt.name)))
            forced = client.engine.metrics.forced_closes._value.get()
        finally:
            await client.aclose()
        assert forced == (1 if budget is not None else 0)
    for reasoning, text, fin in results:
        assert "".join(reasoning) == fin.reasoning and fin.reasoning
        assert "".join(text) == fin.content and fin.content.startswith("{")
        assert "</think>" not in fin.content
        assert fin.constraint["branch"] == "content"
        if fin.finish_reason.value == "stop":
            jsonschema.validate(json.loads(fin.content), SCHEMA)
            assert fin.constraint["complete"] and fin.constraint["terminated"]
        else:
            assert fin.finish_reason.value == "length" and not fin.constraint["terminated"]


def test_cli_thinking_budget_and_no_thinking(served, tmp_path):
    """`infernix generate --model DIR --thinking-budget N`: the JSON result carries the
    reasoning and the content apart, and the budget's forced close shows in reasoning_tokens;
    `--no-thinking` gives no reasoning. Plain output: content on stdout, reasoning on stderr."""
    import argparse
    import io

    from services.worker.cli import add_generate_parser, run_generate

    _, runtime = served

    def generate(*flags: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        add_generate_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["generate", "--model", runtime.name, "--prompt",
                                  "Is the sky blue?", "--temperature", "0", "--max-tokens", "9",
                                  "--max-len", "256", *flags])
        out, err = io.StringIO(), io.StringIO()
        status = run_generate(args, out, err, runtime=runtime)
        return status, out.getvalue(), err.getvalue()

    status, out, _ = generate("--thinking-budget", "3", "--json")
    result = json.loads(out)
    assert status == 0 and result["reasoning"] and result["content"]
    assert result["usage"]["reasoning_tokens"] in (4, 5)  # 3, a "\n"?, </think>
    status, out, _ = generate("--no-thinking", "--json")
    assert status == 0 and json.loads(out)["reasoning"] == ""
    status, out, err = generate("--thinking-budget", "3")
    assert status == 0 and out == result["content"] + "\n" and err == result["reasoning"] + "\n"
    status, _, err = generate("--thinking-budget", "-1")
    assert status == 2 and json.loads(err)["error"]["field"] == "thinking_budget"


@pytest.mark.asyncio
async def test_speculative_rounds_stop_at_the_thinking_budget(served):
    """Design: the thinking budget's close "is injected after a committed round"; a verification
    round emits drafts + 1 tokens, so its drafts stop where the budget ends and the output equals
    one-token decoding's. The proposer drafts transformers' greedy continuation *without* a budget,
    so uncapped drafts would all be accepted past the budget."""
    from bench.oracle import OracleProposer
    from services.worker.spec import ContextProposer

    hf, runtime = served
    prompt = list(runtime.prepare(PromptInput(messages=QUESTION)).token_ids)
    proposer = OracleProposer()
    proposer.record(prompt + oracle(hf, runtime, 14, budget=None))
    client = open_client(runtime, max_batch=1, max_len=256, speculative="ngram", num_draft_tokens=4)
    client.engine.proposer = ContextProposer(proposer, 4)
    try:
        reasoning, text, fin = await run(client, GenerateRequest(
            "spec", PromptInput(messages=QUESTION), greedy(14, thinking_budget=5), runtime.name))
    finally:
        await client.aclose()
    want = oracle(hf, runtime, 14, budget=5)
    want_reasoning, want_content = split(runtime, want)
    assert client.engine.speculation.accepted > 0  # the rounds did verify drafts
    assert "".join(reasoning) == fin.reasoning == want_reasoning
    assert "".join(text) == fin.content == want_content
    assert client.engine.metrics.forced_closes._value.get() == 1
