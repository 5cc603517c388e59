"""Chat rendering through a Jinja chat template, the way transformers renders it, and the layout
check of a continued final assistant message.

The environment is transformers' (sandboxed, `trim_blocks`, `lstrip_blocks`, the loop-controls and
`{% generation %}` extensions, `raise_exception`, `strftime_now`, a `tojson` that does not
HTML-escape); messages are OpenAI-shaped dictionaries (tool-call arguments parsed, an assistant
turn's reasoning as `reasoning_content`) and tools OpenAI function declarations.

ContinueFinalAssistant (design document: "The prefix comes from the Frontend's source regions and
message layout of the rendered template ... When the template changes the content or inserts
unexplained content framing, request preparation fails"): the template renders the conversation
once with a sentinel in place of the continued content, which locates the content region, and once
with the real content; the prompt is the text before the region followed by the content, and the
request fails unless the real rendering is exactly that region filled with the content as given
(a template that trims, splits or rewrites the content cannot be continued exactly).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from shared.errors import InvalidRequest
from shared.frontends.chatml import RenderedPrompt, check_messages
from shared.generation import ChatMessage, PromptInput

# Stands in for the final assistant content of a continued message while the template renders.
_SENTINEL = "\x00infernix-continue\x00"


class TemplateError(ValueError):
    """A chat template that does not compile: the operator's fault, never a request's."""


def _raise_exception(message: str) -> None:
    raise InvalidRequest(
        f"the model's chat template rejects the messages: {message}", field="messages"
    )


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Plain JSON: Jinja's own `tojson` HTML-escapes <, >, & and ', which chat templates never want.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _generation_extension():
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask markers) rendered as
    their body."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = frozenset({"generation"})

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return Generation


@lru_cache(maxsize=16)
def compile_template(source: str):
    """The compiled template of `source` (cached). Raises TemplateError when it does not compile."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_extension(), loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except Exception as e:  # jinja2.TemplateSyntaxError
        raise TemplateError(f"does not compile: {e}") from e


def message_dict(m: ChatMessage) -> dict[str, Any]:
    """One message in the OpenAI shape templates expect; content is always a string, tool-call
    arguments are a parsed object (templates apply `tojson` to them, as transformers documents)
    and an assistant turn's reasoning is `reasoning_content`."""
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name,
                          "arguments": json.loads(c.arguments_json) if c.arguments_json else {}}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    if m.reasoning is not None:
        out["reasoning_content"] = m.reasoning
    return out


def tool_dicts(prompt: PromptInput) -> list[dict[str, Any]]:
    """Declared tools as OpenAI function declarations."""
    out = []
    for tool in prompt.tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.parameters
        out.append({"type": "function", "function": function})
    return out


@dataclass(frozen=True, eq=False)
class ChatTemplate:
    """A chat template as a Frontend's `render`: PromptInput -> RenderedPrompt.

    `source`: the Jinja text; `tool_source`: a named "tool_use" template used when tools are
    declared (None: `source` for everything); `special_tokens`: ("eos_token", "<|im_end|>"), ...
    passed to the template as variables. Raw text prompts are returned as they are."""

    source: str
    tool_source: str | None = None
    special_tokens: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for text in (self.source, self.tool_source):
            if text is not None:
                compile_template(text)  # a broken template fails at load, not at the first request

    def __call__(self, prompt: PromptInput) -> RenderedPrompt:
        """Render `prompt` (`add_generation_prompt=True`; a continued final assistant message ends
        the text with its content instead). Raises InvalidRequest for bad messages, a template's
        raise_exception, or a continued content the template does not render as given."""
        if prompt.messages is None:
            return RenderedPrompt(prompt.text or "")
        source = self.tool_source if prompt.tools and self.tool_source else self.source
        messages = check_messages(prompt.messages)
        dicts = [message_dict(m) for m in messages]
        tools = tool_dicts(prompt)
        if not prompt.continue_final_assistant:
            return RenderedPrompt(self.render(source, dicts, tools, add_generation_prompt=True,
                                              enable_thinking=prompt.enable_thinking))
        last = messages[-1]
        if last.role != "assistant":
            raise InvalidRequest("continue_final_assistant needs an assistant message last",
                                 field="messages")
        if last.tool_calls:
            raise InvalidRequest("a continued assistant message must not hold tool calls",
                                 field="messages")
        content = last.content or ""
        marked = dicts[:-1] + [dict(dicts[-1], content=_SENTINEL)]
        probe = self.render(source, marked, tools, add_generation_prompt=False,
                            enable_thinking=prompt.enable_thinking)
        if probe.count(_SENTINEL) != 1:
            raise InvalidRequest("the model's chat template does not render the final assistant "
                                 "message's content once, so it cannot be continued",
                                 field="messages")
        before, after = probe.split(_SENTINEL)
        real = self.render(source, dicts, tools, add_generation_prompt=False,
                           enable_thinking=prompt.enable_thinking)
        if real != before + content + after:
            raise InvalidRequest("the model's chat template changes the continued assistant "
                                 "content (it trims, splits or rewrites it), so it cannot be "
                                 "continued exactly", field="messages")
        return RenderedPrompt(before + content, content)

    def render(self, source: str, messages: list[dict], tools: list[dict], *,
               add_generation_prompt: bool, enable_thinking: bool | None = None) -> str:
        """The template's text for plain message/tool dictionaries."""
        kwargs: dict[str, Any] = dict(self.special_tokens)
        if tools:
            kwargs["tools"] = tools
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        return compile_template(source).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)
