"""The Qwen3.5 Frontend's chat rendering, against transformers' `apply_chat_template` running the
real template text (shared/frontends/templates/qwen35.jinja, provenance in SOURCE.md).

Issue 9: "The Qwen3.5 chat template exactly: tools block in the system turn, tool results grouped
into one user turn, history turns without reasoning, assistant tool calls rendered as
`<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>`, the
generation prompt `<|im_start|>assistant\\n<think>\\n` (thinking on) or with an empty closed think
block (`enable_thinking: false`)."
Design document: "When the template changes the content or inserts unexplained content framing,
request preparation fails, rather than guessing from the user string or token length."
"""

from __future__ import annotations

import json

import pytest

from shared.contract import ToolDefinition
from shared.errors import InvalidRequest
from shared.frontends import get_frontend
from shared.frontends.formats.qwen_xml import render_call
from shared.frontends.qwen35 import qwen35_template
from shared.frontends.template import message_dict, tool_dicts
from shared.frontends.thinking import CONTENT, REASONING
from shared.generation import ChatMessage, PromptInput, ToolCall

LOOKUP = ToolDefinition.create("lookup", {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}, description="Weather by city")
PING = ToolDefinition.create("ping", None)
ARGS = {"city": "Paris <> & \"x\"\n  two lines ", "days": 3, "flag": True, "none": None,
        "ratio": 1.5, "nested": {"a": [1, "b"]}, "list": ["x", 2]}
CALL = ToolCall("c1", "lookup", json.dumps(ARGS))

U, A, S, T = "user", "assistant", "system", "tool"
CORPUS = {
    "plain": (ChatMessage(U, "Hi there"),),
    "system": (ChatMessage(S, "  Be brief.  "), ChatMessage(U, "Hi")),
    "multi-turn": (ChatMessage(S, "Be brief."), ChatMessage(U, "One"), ChatMessage(A, "1"),
                   ChatMessage(U, "Two"), ChatMessage(A, "2"), ChatMessage(U, "Three")),
    "reasoning-in-history": (
        ChatMessage(U, "One"), ChatMessage(A, "1", reasoning="thought one"),
        ChatMessage(U, "Two"), ChatMessage(A, "<think>\nthought two\n</think>\n\n2"),
        ChatMessage(U, "Three")),
    "tool-loop": (
        ChatMessage(U, "Weather in Paris?"),
        ChatMessage(A, "Let me look.", (CALL, ToolCall("c2", "ping", "{}")),
                    reasoning="I should call lookup"),
        ChatMessage(T, "sunny", tool_call_id="c1"), ChatMessage(T, "pong", tool_call_id="c2"),
        ChatMessage(A, "", (ToolCall("c3", "lookup", '{"city": "Rome"}'),), reasoning="again"),
        ChatMessage(T, "rainy", tool_call_id="c3")),
    "tool-answer": (
        ChatMessage(S, "Use tools."), ChatMessage(U, "Weather?"),
        ChatMessage(A, None, (ToolCall("c1", "lookup", '{"city": "Oslo"}'),)),
        ChatMessage(T, "cold", tool_call_id="c1"), ChatMessage(A, "It is cold.", reasoning="ok"),
        ChatMessage(U, "Thanks")),
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    tok.chat_template = qwen35_template()
    return tok


@pytest.fixture(scope="module")
def frontend():
    return get_frontend("qwen3.5")


def _oracle(tok, prompt: PromptInput, **kwargs) -> str:
    extra = {} if prompt.enable_thinking is None else {"enable_thinking": prompt.enable_thinking}
    tools = tool_dicts(prompt) or None
    return tok.apply_chat_template([message_dict(m) for m in prompt.messages], tools=tools,
                                   tokenize=False, **extra, **kwargs)


@pytest.mark.parametrize("thinking", [None, True, False], ids=["default", "on", "off"])
@pytest.mark.parametrize("name", list(CORPUS))
@pytest.mark.parametrize("with_tools", [False, True], ids=["no-tools", "tools"])
def test_rendering_equals_apply_chat_template(name, with_tools, thinking, frontend, hf_tokenizer):
    """Our rendering is transformers' rendering of the real template, for every conversation of
    the corpus, with and without tools, thinking default / on / off."""
    prompt = PromptInput(messages=CORPUS[name], tools=(LOOKUP, PING) if with_tools else (),
                         enable_thinking=thinking)
    ours = frontend.render(prompt).text
    assert ours == _oracle(hf_tokenizer, prompt, add_generation_prompt=True)
    expected_tail = "<think>\n\n</think>\n\n" if thinking is False else "<think>\n"
    assert ours.endswith("<|im_start|>assistant\n" + expected_tail)
    if with_tools:
        assert ours.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following "
                               "functions:\n\n<tools>\n")


def test_tool_calls_render_as_the_format_writes_them(frontend) -> None:
    """The format's `render_call` is the template's exact text of a call (the first of a turn
    without content), and the prompt phase follows the generation prompt."""
    prompt = PromptInput(messages=(ChatMessage(U, "q"), ChatMessage(A, None, (CALL,)),
                                   ChatMessage(T, "r", tool_call_id="c1"), ChatMessage(U, "more")),
                         tools=(LOOKUP,))
    text = frontend.render(prompt).text
    assert "<|im_start|>assistant\n" + render_call("lookup", CALL.arguments_json) + "<|im_end|>" \
        in text
    assert "<parameter=flag>\nTrue\n</parameter>" in text  # Python's str, as the template writes
    assert text.count("<|im_start|>user") == 3  # the tool result in a user turn of its own
    assert frontend.prepare(prompt).phase == REASONING
    assert frontend.prepare(PromptInput(messages=prompt.messages, tools=(LOOKUP,),
                                        enable_thinking=False)).phase == CONTENT


@pytest.mark.parametrize("content", ['{"name":', "1, 2,", "",
                                     "<tool_call>\n<function=lookup>\n<parameter=city>\nPar"])
def test_continuation_equals_continue_final_message(content, frontend, hf_tokenizer) -> None:
    """A continued final assistant message: the prompt is transformers' continue_final_message
    rendering, the continued content is the prefix and the output starts in content."""
    prompt = PromptInput(messages=(ChatMessage(U, "Go"), ChatMessage(A, content)),
                         continue_final_assistant=True)
    rendered = frontend.render(prompt)
    assert rendered.continuation == content
    if content:  # transformers refuses to continue an empty message
        assert rendered.text == _oracle(hf_tokenizer, prompt, continue_final_message=True)
    assert rendered.text.endswith("<think>\n\n</think>\n\n" + content)
    assert frontend.prepare(prompt).phase == CONTENT


@pytest.mark.parametrize("content", ["trailing space ", "\nleading newline",
                                     "<think>\nhidden\n</think>\n\nshown"])
def test_continuation_the_template_changes_is_refused(content, frontend) -> None:
    """The template trims content and splits reasoning out of it: such a continued content would
    not be the text the model continues, so preparation fails."""
    prompt = PromptInput(messages=(ChatMessage(U, "Go"), ChatMessage(A, content)),
                         continue_final_assistant=True)
    with pytest.raises(InvalidRequest) as err:
        frontend.prepare(prompt)
    assert err.value.field == "messages"


def test_template_errors_are_request_errors(frontend) -> None:
    """The template's raise_exception (no user query, system message not first) is a request
    error naming the messages."""
    for messages in ((ChatMessage(S, "only system"),),
                     (ChatMessage(U, "q"), ChatMessage(S, "late system"))):
        with pytest.raises(InvalidRequest) as err:
            frontend.prepare(PromptInput(messages=messages))
        assert err.value.field == "messages"
