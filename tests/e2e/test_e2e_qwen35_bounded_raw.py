"""Length-bounded raw XML strings through the real stack: a tiny random-weight Qwen3.5 checkpoint
with the real vocabulary and chat template, behind a real gateway and the official `openai` SDK.
A strict tool whose string parameters carry the bounds real schemas use (minLength 20 /
maxLength 60, maxLength 255) compiles, and the calls the model writes through the masks (its
logits steered to open the call at once and to favour line breaks and pieces of the delimiter)
keep them exactly: every value's length (characters) lies within its bounds and holds no
`\\n</parameter>`, in the aggregate as in the stream.

Design document: "A raw string argument ends at \\n</parameter>, which must not occur in the
value ... A string's pattern/length and the delimiter exclusion hold together."
"""

from __future__ import annotations

import json

import openai
import pytest
import pytest_asyncio

from tests.support.fake_worker import running_gateway
from tests.support.qwen35_support import hf_causal_lm
from tests.support.worker_support import hooked

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
NOTE = {"type": "function", "function": {"name": "note", "strict": True, "parameters": {
    "type": "object", "properties": {
        "title": {"type": "string", "minLength": 20, "maxLength": 60},
        "body": {"type": "string", "maxLength": 255}},
    "required": ["title", "body"], "additionalProperties": False}}}
BOUNDS = {"title": (20, 60), "body": (0, 255)}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tmp_path_factory):
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    path = tmp_path_factory.mktemp("qwen35-bounded-raw")
    hf_causal_lm(seed=11, max_position_embeddings=2048).save_pretrained(str(path))
    runtime, model = hooked(load_runtime(str(path)))
    domain = runtime.domain
    opener = domain.special_id("<tool_call>")
    favoured = [i for i, b in enumerate(domain.token_bytes)
                if domain.is_ordinary(i) and b in (b"\n", b"\n\n", b"</", b"<", b"parameter",
                                                   b">", b" ")]

    def after(logits, positions, lanes):
        logits[..., opener] += 100.0  # the mask decides where a call may open
        logits[..., favoured] += 8.0  # partial delimiters inside the values, often

    model.after = after
    worker = open_in_process(runtime, EngineConfig(max_batch=1, max_len=2048))
    try:
        async with running_gateway(worker) as url:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0,
                                          timeout=300) as oa:
                yield runtime.name, oa
    finally:
        await worker.aclose()


def _check(arguments: dict) -> None:
    assert set(arguments) == set(BOUNDS), arguments
    for name, (lo, hi) in BOUNDS.items():
        value = arguments[name]
        assert isinstance(value, str) and lo <= len(value) <= hi, (name, len(value), value)
        assert "\n</parameter>" not in value


async def test_bounded_raw_strings_keep_their_bounds_through_the_stack(served):
    """A forced call's raw values lie within their length bounds and hold no delimiter; the
    stream's argument fragments read to the same arguments."""
    model, oa = served
    ask = dict(model=model, messages=[{"role": "user", "content": "Take a note."}],
               tools=[NOTE], tool_choice="required", parallel_tool_calls=False,
               max_tokens=600, temperature=0)
    whole = await oa.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "note"
    arguments = json.loads(call.function.arguments)
    _check(arguments)
    streamed = ""
    async for chunk in await oa.chat.completions.create(stream=True, **ask):
        for delta in (c.delta for c in chunk.choices):
            for t in delta.tool_calls or ():
                streamed += t.function.arguments or ""
    assert json.loads(streamed) == arguments
