"""XML tool calls through the whole worker: random walks sampled by the Engine through the masks
of every Qwen3.5 output framing (thinking on and off; tool grammars strict and non-strict; every
tool_choice; JSON content or calls), judged by an independent reader of the format.

Issue 9 §3: "the streamed argument fragments (ConstrainedToolStream) concatenate to the final
`arguments` and are produced by the same reader as the terminal calls"; "Non-strict: any order,
any representable name, each name at most once through the ParameterNameConstraint companion (it
clears, in every mask, tokens that would complete a name already used in the call)"; §5: "random
walks through the masks of every framing accepted by an independent parser of the format".

The model is a small random-weight one over a byte-level domain with the Qwen3.5 control tokens
(tests/support/qwen_support.py), rendered with the real Qwen3.5 template, with a logit bias towards
the framing's tokens so that walks finish; the sampler, the masks (batched fills included), the
companion, the phase decoder and the tool stream are the production ones. The output ids are read
from what the model is fed (by position), and `tests/xml_walks.parse` reads them independently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import jsonschema
import pytest
import torch

from bench.random_weights import ByteTokenizer, random_runtime
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode
from shared.frontends.formats import QWEN_XML
from shared.frontends.frontend import Frontend
from shared.frontends.qwen35 import qwen35_template
from shared.frontends.template import ChatTemplate
from shared.frontends.thinking import QWEN_THINK, ThinkingFraming
from shared.generation import (
    ChatMessage,
    Finished,
    GenerateRequest,
    PromptInput,
    ReasoningDelta,
    RequestOptions,
    SamplingParams,
    Started,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from tests.support.qwen_support import xml_domain
from tests.support.worker_support import hooked, open_client
from tests.support.xml_walks import decode_arguments, parse

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 3}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = (ToolDefinition.create("weather", WEATHER, strict=True),
         ToolDefinition.create("note", {"type": "object", "properties": {
             "text": {"type": "string"}, "n": {"type": "integer"}}}))
JSON_CONTENT = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": False}


@pytest.fixture(scope="module")
def served():
    domain = xml_domain()
    tokenizer = ByteTokenizer(domain)
    frontend = Frontend("xml-qwen", domain, tokenizer, render=ChatTemplate(qwen35_template()),
                        tool_format=QWEN_XML,
                        thinking=ThinkingFraming.build(QWEN_THINK, domain, tokenizer.encode))
    base = random_runtime(domain, name="xml-qwen", seed=3, max_position_embeddings=4096)
    runtime, model = hooked(dataclasses.replace(base, frontend=frontend))
    favoured = [i for i, b in enumerate(domain.token_bytes)
                if i in domain.control_ids or i in domain.eos_ids or len(b) > 1
                or b in (b">", b"\n", b"1", b"2")]
    fed: dict[int, dict[int, int]] = {}  # lane -> position -> token

    def before(tokens, positions, lanes):
        for row, lane in enumerate(lanes.tolist()):
            for t, p in zip(tokens[row].tolist(), positions[row].tolist()):
                fed.setdefault(lane, {})[p] = t

    ids = {b: domain.token_bytes.index(b) for b in (b"<parameter=", b"</function>", b"\n</param",
                                                     b"eter>", b">\n", b"\n", b"a")}
    opener, closer = domain.special_id("<tool_call>"), domain.special_id("</tool_call>")

    def steer(lane: int) -> bytes | None:
        """Inside an open call, the framing token that moves the walk on (a parameter or two,
        short values), so that non-strict calls finish; the mask decides what is legal."""
        seq = [t for _, t in sorted(fed.get(lane, {}).items())]
        marks = [i for i, t in enumerate(seq) if t in (opener, closer)]
        if not marks or seq[marks[-1]] != opener:
            return None
        text = b"".join(domain.token_bytes[t] for t in seq[marks[-1] + 1:])
        head = text.find(b">\n")
        if head < 0:
            return None
        body = text[head + 2:]
        if body == b"" or body.endswith(b"</parameter>\n"):
            return b"<parameter=" if body.count(b"<parameter=") < 2 else b"</function>"
        last = body.rfind(b"<parameter=")
        name_end = body.find(b">\n", last)
        if name_end < 0:  # in a name: "a" every time (a repeat only the companion prevents)
            return b">\n" if len(body) > last + len(b"<parameter=") else b"a"
        value = body[name_end + 2:]
        if value.endswith(b"\n</param"):
            return b"eter>"
        if value.endswith(b"</parameter>"):
            return b"\n"
        return b"\n</param" if len(value) >= 2 else None

    def after(logits, positions, lanes):
        logits[..., favoured] += 6.0
        for row, lane in enumerate(lanes.tolist()):
            want = steer(lane)
            if want is not None:
                logits[row, ..., ids[want]] += 60.0

    model.before, model.after = before, after
    return runtime, fed


CASES = [  # (tool_choice, content constraint, thinking)
    (ToolChoice(ToolMode.REQUIRED), None, None),
    (ToolChoice(ToolMode.REQUIRED, parallel=False), None, False),
    (ToolChoice.named("weather"), None, None),
    (ToolChoice.named("note"), None, False),
    (ToolChoice(ToolMode.AUTO), None, None),
    (ToolChoice(ToolMode.AUTO), OutputConstraint.json_schema(JSON_CONTENT), False),
    (ToolChoice(ToolMode.NONE), None, None),
    (ToolChoice(ToolMode.REQUIRED, ("note",)), None, None),
]


async def _run(client, request):
    events = []
    async for event in client.generate(request):
        events.append(event)
    return events


def _output_ids(fed_lane: dict[int, int], prompt_len: int, fin: Finished, eos: int) -> list[int]:
    out = [fed_lane[p] for p in sorted(fed_lane) if p >= prompt_len]
    return out + [eos]  # the EOS that ended the output is sampled, never fed


@pytest.mark.asyncio
async def test_sampled_walks_through_every_xml_framing_are_read_exactly(served):
    runtime, fed = served
    domain = runtime.domain
    eos = min(domain.eos_ids)
    judged = {"calls": 0, "nonstrict_params": 0, "content": 0}
    client = open_client(runtime, max_batch=1, max_len=4096)
    try:
        for round_ in range(3):
            for k, (choice, content, thinking) in enumerate(CASES):
                fed.clear()
                prompt = PromptInput(messages=(ChatMessage("user", "go"),), tools=TOOLS,
                                     enable_thinking=thinking)
                options = RequestOptions(max_tokens=160, constraint=content, tool_choice=choice,
                                         sampling=SamplingParams(temperature=1.0,
                                                                 seed=100 * round_ + k),
                                         thinking_budget=12)
                events = await _run(client, GenerateRequest(f"w{round_}-{k}", prompt, options,
                                                            runtime.name))
                fin = events[-1]
                assert isinstance(fin, Finished) and fin.error is None, fin
                _check_stream(events, fin)
                if fin.finish_reason.value not in ("stop", "tool_calls"):
                    continue  # cut by the budget: judged only where the output completed
                prompt_len = fin.usage.prompt_tokens
                ids = _output_ids(fed[0], prompt_len, fin, eos)
                assert len(ids) == fin.usage.completion_tokens
                on = thinking is not False
                parsed = parse(ids[:-1], domain, thinking=on)
                if on:
                    want = parsed.reasoning[:-1] if parsed.reasoning.endswith(b"\n") \
                        else parsed.reasoning
                    assert fin.reasoning == want.decode("utf-8", "replace")
                else:
                    assert fin.reasoning == ""
                if not parsed.calls:  # content only: auto, none, or JSON content
                    assert choice.mode is not ToolMode.REQUIRED
                    assert fin.finish_reason.value == "stop" and not fin.tool_calls
                    assert fin.content == parsed.content
                    if content is not None:
                        jsonschema.validate(json.loads(fin.content), JSON_CONTENT)
                    judged["content"] += 1
                    continue
                assert choice.mode is not ToolMode.NONE
                _check_calls(parsed, fin, choice, judged)
    finally:
        await client.aclose()
    assert judged["calls"] >= 6 and judged["nonstrict_params"] >= 1 and judged["content"] >= 2, \
        judged


def _check_stream(events, fin: Finished) -> None:
    """Streamed reasoning, content and argument fragments concatenate to the Finished values."""
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert (reasoning, text) == (fin.reasoning, fin.content)
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    fragments: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallArgumentsDelta):
            fragments[e.index] = fragments.get(e.index, "") + e.fragment
    complete = [s for s in starts if s.index < len(fin.tool_calls)]
    assert [(s.id, s.name, fragments.get(s.index, "")) for s in complete] == \
        [(c.id, c.name, c.arguments_json) for c in fin.tool_calls]


def _check_calls(parsed, fin: Finished, choice: ToolChoice, judged: dict) -> None:
    assert fin.finish_reason.value == "tool_calls"
    assert [name for name, _ in parsed.calls] == [c.name for c in fin.tool_calls]
    assert fin.content == parsed.content.removesuffix("\n").removesuffix("\n")
    if choice.mode is ToolMode.REQUIRED:
        assert parsed.calls and parsed.content == ""
    if not choice.parallel:
        assert len(parsed.calls) == 1
    allowed = choice.allowed_names or ("weather", "note")
    for (name, params), call in zip(parsed.calls, fin.tool_calls):
        assert name in allowed
        names = [p for p, _ in params]
        assert len(names) == len(set(names)), names  # the companion: each name once
        pairs = json.loads(call.arguments_json, object_pairs_hook=lambda kv: kv)
        assert [k for k, _ in pairs] == names
        args = json.loads(call.arguments_json)
        if name == "weather":
            jsonschema.validate(args, WEATHER)
            assert args == decode_arguments(params, WEATHER)
        else:
            judged["nonstrict_params"] += len(names)
        judged["calls"] += 1


def test_the_companion_clears_a_repeated_name_in_the_session_masks(served):
    """OutputSession with the companion: after `<parameter=n>...</parameter>\\n<parameter=n`, the
    tokens that would complete `n` again are illegal in the lookahead mask and in the batched
    ordinary fill, while the same grammar without the companion allows them."""
    from services.grammar.client import NameIndex, ParameterNameConstraint, in_process_client
    from services.grammar.tools.hermes import ToolSpec
    from services.worker.output.session import OutputSession

    runtime, _ = served
    domain = runtime.domain
    # auto: a forced call would follow note's schema, whose declared order forbids repeats itself
    spec = ToolSpec(TOOLS, ToolChoice(ToolMode.AUTO, ("note",)))
    grammar = in_process_client({"x": domain})
    compiled = asyncio.run(grammar.compile(spec, model="x", framing=QWEN_XML.framing)).grammar
    names = ParameterNameConstraint(NameIndex.of(domain), domain.special_id("<tool_call>"),
                                    domain.special_id("</tool_call>"))
    sessions = [OutputSession(domain, compiled, names=names), OutputSession(domain, compiled)]
    text = b"\n<function=note>\n<parameter=n>\n1\n</parameter>\n<parameter=n"
    ids = [domain.special_id("<tool_call>")] + list(text)  # byte tokens 0..255 are the bytes
    for s in sessions:
        s.preview(ids)
        s.confirm()
    repeat = [i for i, b in enumerate(domain.token_bytes) if b.startswith(b">")
              and domain.is_ordinary(i)]
    assert repeat
    rows = torch.zeros(4, domain.mask_words, dtype=torch.int32)
    sessions[0].lookahead((), rows[0:1])
    sessions[1].lookahead((), rows[1:2])
    from services.worker.program.masks import MaskBuffers

    masks = MaskBuffers(domain, 2, 0, torch.device("cpu"))  # the batched fill of two rows
    masks.fill_ordinary(sessions, [len(ids)] * 2)
    rows[2:4] = masks.host[:, 0]

    def legal(row, t):
        return bool((int(row[t >> 5]) >> (t & 31)) & 1)

    for with_names, without in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert any(legal(without, t) for t in repeat)
        assert not any(legal(with_names, t) for t in repeat)
        assert legal(with_names, ord("x"))  # a longer name stays legal


@pytest.mark.asyncio
async def test_continued_assistant_message_completes_its_unfinished_call(served):
    """ContinueFinalAssistant with a tool grammar: the matcher takes the prefix as tokens (the
    spelled `<tool_call>` as its token), the decoder reads the unfinished call from it, and only
    the suffix is new: no content is published again, the call's start and its fragments so far
    go out first, and the fragments concatenate to arguments that validate with the prefix's
    "Pa" kept. A prefix holding a completed call is refused (history calls are never published
    again)."""
    from shared.errors import InvalidRequest

    runtime, _ = served
    prefix = "Sure.\n\n<tool_call>\n<function=weather>\n<parameter=city>\nPa"
    seen = 0
    client = open_client(runtime, max_batch=1, max_len=4096)
    try:
        for seed in range(4):
            prompt = PromptInput(messages=(ChatMessage("user", "go"),
                                           ChatMessage("assistant", prefix)),
                                 tools=TOOLS, continue_final_assistant=True)
            options = RequestOptions(max_tokens=60, sampling=SamplingParams(seed=seed))
            events = await _run(client, GenerateRequest(f"c{seed}", prompt, options,
                                                        runtime.name))
            fin = events[-1]
            assert fin.error is None and fin.reasoning == "" and fin.content == ""
            if fin.finish_reason.value != "tool_calls":
                continue
            _check_stream(events, fin)
            first = next(e for e in events if not isinstance(e, Started))  # after the Started ones
            assert isinstance(first, ToolCallStart) and first.name == "weather"
            args = json.loads(fin.tool_calls[0].arguments_json)
            jsonschema.validate(args, WEATHER)
            assert args["city"].startswith("Pa")
            seen += 1
        done = prefix + "\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n" \
            "</tool_call>"
        with pytest.raises(InvalidRequest):
            await _run(client, GenerateRequest("done", PromptInput(
                messages=(ChatMessage("user", "go"), ChatMessage("assistant", done)),
                tools=TOOLS, continue_final_assistant=True), RequestOptions(max_tokens=4),
                runtime.name))
    finally:
        await client.aclose()
    assert seen >= 1
