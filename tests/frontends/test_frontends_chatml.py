"""ChatML rendering of the default model, checked against the chat template shipped in its GGUF.

DESIGN.md: "Built-in default: SmolLM2-135M-Instruct ... build the tokenizer from its metadata ...
ChatML frontend, no thinking."
"""

from __future__ import annotations

import json

import jinja2
import pytest

from shared.contract import ToolDefinition
from shared.errors import InvalidRequest
from shared.frontends.chatml import render_chatml
from shared.frontends.formats.hermes import render_call
from shared.frontends.smollm2 import gguf_path, read_gguf_vocab
from shared.generation import ChatMessage, PromptInput, ToolCall

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye\n"}],
    # Several system messages, and one later in the conversation (issue 11 §3).
    [{"role": "system", "content": "Be kind."}, {"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
     {"role": "system", "content": "Now answer in French."}, {"role": "user", "content": "Bye"}],
    [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late rules."}],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_render_matches_the_gguf_template(conversation: list[dict]) -> None:
    """Without tools our rendering is byte-identical to the model's own Jinja template."""
    template = jinja2.Environment().from_string(read_gguf_vocab(gguf_path()).chat_template)
    expected = template.render(messages=conversation, add_generation_prompt=True)
    prompt = PromptInput(messages=tuple(ChatMessage(**m) for m in conversation))
    assert render_chatml(prompt).text == expected


def test_tools_and_tool_history_render_in_hermes_form() -> None:
    """Declarations go in the system turn; calls re-render in the canonical call text."""
    tool = ToolDefinition.create(
        "lookup", {"type": "object", "properties": {"city": {"type": "string"}}}
    )
    call = ToolCall(id="c1", name="lookup", arguments_json='{"city":"Paris"}')
    prompt = PromptInput(
        messages=(ChatMessage("user", "Weather?"), ChatMessage("assistant", None, (call,)),
                  ChatMessage("tool", "sunny", tool_call_id="c1")),
        tools=(tool,),
    )
    text = render_chatml(prompt).text
    system = text.split("<|im_end|>")[0]
    declared = [json.loads(line) for line in system.splitlines() if line.startswith('{"type"')]
    assert declared == [{"type": "function", "function": {
        "name": "lookup", "description": "", "parameters": tool.parameters}}]
    assert render_call("lookup", '{"city":"Paris"}') in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_continuation_keeps_the_final_assistant_content_open() -> None:
    prompt = PromptInput(messages=(ChatMessage("user", "JSON please"),
                                   ChatMessage("assistant", '{"name":')),
                         continue_final_assistant=True)
    rendered = render_chatml(prompt)
    assert rendered.text.endswith('<|im_start|>assistant\n{"name":')
    assert rendered.continuation == '{"name":'


def test_bad_role_names_the_message() -> None:
    with pytest.raises(InvalidRequest) as err:
        render_chatml(PromptInput(messages=(ChatMessage("user", "a"), ChatMessage("robot", "b"))))
    assert err.value.field == "messages[1].role"
