"""OpenAI Chat Completions: `POST /v1/chat/completions` <-> the worker contract."""

from __future__ import annotations

import time
from typing import Any

from services.gateway import fields as f
from services.gateway import known
from services.gateway.choices import Results, choice_requests
from services.gateway.errors import ErrorPaths
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits
from services.gateway.logprobs import chat_logprobs, content_entries
from services.gateway.sse import DONE, SSE
from services.gateway.translate import (
    Thinking,
    Translated,
    choice_count,
    declared_tools,
    effort_thinking,
    json_schema_constraint,
    merge_content_constraint,
    merge_thinking,
    openai_tool_choice,
    structured_outputs,
    structured_outputs_key,
    thinking_budget,
    thinking_field,
    tool_definition,
    tool_policy,
    with_json_whitespace,
)
from shared.contract import OutputConstraint, parse_json_text
from shared.errors import InvalidRequest, Unsupported
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    ReasoningDelta,
    RequestOptions,
    SamplingParams,
    TextDelta,
    TokenLogprobs,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

_TEXT_PARTS = ("text",)
FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
          FinishReason.TOOL_CALLS: "tool_calls"}


def error_paths(body: dict) -> ErrorPaths:
    key = structured_outputs_key(body)
    rf = body.get("response_format")
    standard = isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")
    constraint = f"structured_outputs.{key}" if key else ("response_format" if standard else None)
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    kwargs = body.get("chat_template_kwargs")
    enable_field = "chat_template_kwargs.enable_thinking" if isinstance(kwargs, dict) and \
        kwargs.get("enable_thinking") is not None else "reasoning_effort"
    return ErrorPaths(
        content_schema="response_format.json_schema.schema",
        constraint=constraint,
        tool_base="tools[{i}]",
        tool_fields={"parameters": "function.parameters", "name": "function.name",
                     "description": "function.description", "strict": "function.strict"},
        aliases={"max_tokens": max_field, "prompt": "messages",
                 "constraint": constraint or "response_format",
                 "thinking_budget": thinking_field(body, "reasoning_effort"),
                 "enable_thinking": enable_field},
    )


def translate(body: dict, request_id: str, limits: GatewayLimits,
              policy: FieldPolicy = FieldPolicy()) -> Translated:
    """Chat body -> one GenerateRequest per choice. Raises typed RequestErrors naming the
    original field."""
    policy.check(body, "", known.CHAT)
    model = f.get_str(body, "model", "", required=True)
    n = choice_count(body, limits)
    messages = _messages(body, limits, policy)
    tools = _tools(body, limits, policy)
    choice = tool_policy(tools, openai_tool_choice(body, policy, known.CHAT_TOOL_CHOICE,
                                                     nested=True))
    constraint = with_json_whitespace(merge_content_constraint(
        _response_format(body, limits, policy), structured_outputs(body, limits),
        "response_format"), body)
    max_tokens = f.get_int(body, "max_completion_tokens", "")
    if max_tokens is None:
        max_tokens = f.get_int(body, "max_tokens", "")
    sampling = openai_sampling(body)
    thinking = chat_thinking(body)
    options = RequestOptions(max_tokens=max_tokens, sampling=sampling, constraint=constraint,
                             tool_choice=choice, stop=f.stop_strings(body, "stop", ""),
                             thinking_budget=thinking.budget, logprobs=chat_logprobs(body))
    stream = f.get_bool(body, "stream", "", default=False)
    stream_options = f.get_dict(body, "stream_options", "") or {}
    policy.check(stream_options, "stream_options", known.CHAT_STREAM_OPTIONS)
    include_usage = f.get_bool(stream_options, "include_usage", "stream_options", default=False)
    continued = f.get_bool(body, "continue_final_message", "", default=False)
    if continued and messages[-1].role != "assistant":
        raise InvalidRequest("continue_final_message needs an assistant message last",
                             field="continue_final_message")
    prompt = PromptInput(messages=messages, tools=tools, continue_final_assistant=continued,
                         enable_thinking=thinking.enable)
    request = GenerateRequest(request_id, prompt, options, model)
    return Translated(choice_requests(request, n), error_paths(body), stream=stream,
                      include_usage=include_usage, per_prompt=n)


def openai_sampling(body: dict) -> SamplingParams:
    """OpenAI's sampling fields in their documented ranges (temperature 0..2, top_p 0..1,
    penalties -2..2)."""
    return SamplingParams(
        temperature=f.get_ranged(body, "temperature", "", 0.0, 2.0, default=1.0),
        top_p=f.get_ranged(body, "top_p", "", 0.0, 1.0, default=1.0),
        seed=f.get_int(body, "seed", ""),
        presence_penalty=f.get_ranged(body, "presence_penalty", "", -2.0, 2.0, default=0.0),
        frequency_penalty=f.get_ranged(body, "frequency_penalty", "", -2.0, 2.0, default=0.0),
    )


def chat_thinking(body: dict) -> Thinking:
    """Thinking on/off (`chat_template_kwargs.enable_thinking`, as vLLM and SGLang clients send
    it; `reasoning_effort` "none") and the budget (`thinking_budget`, the Infernix extension, or
    the budget of a `reasoning_effort`). Any other template argument is refused: the template
    would read it and the output would change."""
    kwargs = f.get_dict(body, "chat_template_kwargs", "") or {}
    for key in kwargs:
        if key not in known.CHAT_TEMPLATE_KWARGS.handled:
            raise Unsupported(f"chat_template_kwargs.{key} is not supported (enable_thinking)",
                              field=f"chat_template_kwargs.{key}")
    enable = f.get_bool(kwargs, "enable_thinking", "chat_template_kwargs")
    effort = effort_thinking(body.get("reasoning_effort"), "reasoning_effort")
    thinking = merge_thinking(effort, thinking_budget(body), "reasoning_effort")
    if enable is not None and thinking.enable is not None and enable != thinking.enable:
        raise InvalidRequest("chat_template_kwargs.enable_thinking contradicts reasoning_effort",
                             field="chat_template_kwargs.enable_thinking")
    return Thinking(enable if enable is not None else thinking.enable, thinking.budget)


def _messages(body: dict, limits: GatewayLimits, policy: FieldPolicy) -> tuple[ChatMessage, ...]:
    """Every message in order; each system or developer message, wherever it stands, becomes a
    system message (how it renders is the model template's business)."""
    raw = f.get_list(body, "messages", "", required=True)
    if not raw:
        raise InvalidRequest("messages must hold at least one message", field="messages")
    limits.check_messages(len(raw), "messages")
    out = []
    for i, message in enumerate(raw):
        path = f"messages[{i}]"
        message = f.as_dict(message, path)
        role = f.get_str(message, "role", path, required=True)
        if role not in known.CHAT_MESSAGE:
            raise Unsupported(f"{path}.role {role!r} is not supported (system, developer, user, "
                              "assistant, tool)", field=f"{path}.role")
        policy.check(message, path, known.CHAT_MESSAGE[role])
        content = f.get(message, "content", path)
        text = None if content is f.MISSING else _text(content, f"{path}.content", policy)
        name = f.get_str(message, "name", path)
        if role in ("system", "developer", "user"):
            if text is None:
                raise InvalidRequest(f"{path}.content is required", field=f"{path}.content")
            out.append(ChatMessage("user" if role == "user" else "system", text, name=name))
        elif role == "assistant":
            calls = _assistant_calls(message, path, policy)
            if text is None and not calls:
                raise InvalidRequest(f"{path} needs content or tool_calls", field=f"{path}.content")
            out.append(ChatMessage("assistant", text, calls, name=name,
                                   reasoning=_reasoning(message, path)))
        else:
            call_id = f.get_str(message, "tool_call_id", path, required=True)
            out.append(ChatMessage("tool", text or "", tool_call_id=call_id))
    return tuple(out)


def _reasoning(message: dict, path: str) -> str | None:
    """An assistant turn's reasoning: `reasoning_content` (vLLM, SGLang) or `reasoning`; the
    chat template decides whether history shows it."""
    values = {k: f.get_str(message, k, path) for k in ("reasoning_content", "reasoning")}
    given = {k: v for k, v in values.items() if v is not None}
    if len(set(given.values())) > 1:
        raise InvalidRequest(f"{path}.reasoning and {path}.reasoning_content differ; give one",
                             field=f"{path}.reasoning")
    return next(iter(given.values()), None)


def _text(content: Any, path: str, policy: FieldPolicy) -> str:
    if isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
                policy.check(part, f.join(path, j), known.CHAT_TEXT_PART)
    return f.text_parts(content, path, part_types=_TEXT_PARTS)


def _assistant_calls(message: dict, path: str, policy: FieldPolicy) -> tuple[ToolCall, ...]:
    calls = f.get_list(message, "tool_calls", path) or []
    out = []
    for j, call in enumerate(calls):
        call_path = f"{path}.tool_calls[{j}]"
        call = f.as_dict(call, call_path)
        kind = f.get_str(call, "type", call_path, default="function")
        f.reject_unless(kind == "function", f"{call_path}.type",
                        f"{call_path}.type {kind!r} is not supported; only function calls")
        policy.check(call, call_path, known.CHAT_TOOL_CALL)
        function = f.get_dict(call, "function", call_path, required=True)
        fn_path = f"{call_path}.function"
        policy.check(function, fn_path, known.CHAT_CALLED_FUNCTION)
        arguments = f.get_str(function, "arguments", fn_path, required=True)
        parse_json_text(arguments, field=f"{fn_path}.arguments")
        out.append(ToolCall(f.get_str(call, "id", call_path, required=True),
                            f.get_str(function, "name", fn_path, required=True), arguments))
    return tuple(out)


def _tools(body: dict, limits: GatewayLimits, policy: FieldPolicy) -> tuple:
    tools = []
    for i, path, tool in declared_tools(body, limits, policy, known.CHAT_TOOL, kind="function",
                                        what="function tools"):
        function = f.get_dict(tool, "function", path, required=True)
        fn_path = f"{path}.function"
        policy.check(function, fn_path, known.CHAT_FUNCTION)
        parameters = f.get_dict(function, "parameters", fn_path)
        tools.append(tool_definition(
            i, f.get_str(function, "name", fn_path, required=True), parameters,
            description=f.get_str(function, "description", fn_path),
            strict=f.get_bool(function, "strict", fn_path, default=False),
            schema_path=f"{fn_path}.parameters", limits=limits))
    return tuple(tools)


def _response_format(body: dict, limits: GatewayLimits,
                     policy: FieldPolicy) -> OutputConstraint | None:
    rf = f.get_dict(body, "response_format", "")
    if rf is None:
        return None
    policy.check(rf, "response_format", known.CHAT_RESPONSE_FORMAT)
    kind = f.get_str(rf, "type", "response_format", required=True)
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint.json_object()
    if kind == "json_schema":
        spec = f.get_dict(rf, "json_schema", "response_format", required=True)
        policy.check(spec, "response_format.json_schema", known.CHAT_JSON_SCHEMA)
        f.get_bool(spec, "strict", "response_format.json_schema")  # type-checked; always enforced
        return json_schema_constraint(f.get(spec, "schema", "response_format.json_schema"),
                                      "response_format.json_schema.schema", limits)
    raise Unsupported(f"response_format.type {kind!r} is not supported (text, json_object, "
                      "json_schema)", field="response_format.type")


# ---- replies ----

def _report(finished: Finished) -> dict[str, Any]:
    return {"constraint": finished.constraint}


def usage(results: Results) -> dict[str, Any]:
    """OpenAI usage: the prompt counted once per distinct prompt, completions summed (of them
    the reasoning tokens, in completion_tokens_details)."""
    return {"prompt_tokens": results.prompt_tokens,
            "completion_tokens": results.completion_tokens,
            "total_tokens": results.prompt_tokens + results.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": results.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": results.reasoning_tokens}}


def _call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json}}


def _choice(index: int, finished: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "refusal": None,
                               "content": finished.content or (None if finished.tool_calls else "")}
    if finished.tool_calls:
        message["tool_calls"] = [_call_json(c) for c in finished.tool_calls]
    if finished.reasoning:  # the field vLLM and SGLang clients read
        message["reasoning_content"] = finished.reasoning
    return {"index": index, "message": message, "logprobs": _logprobs(finished.logprobs),
            "finish_reason": FINISH[finished.finish_reason], "infernix": _report(finished)}


def _logprobs(tokens) -> dict[str, Any] | None:
    # the content tokens' entries (a refusal is never generated: its list stays null)
    return None if tokens is None else {"content": content_entries(tokens), "refusal": None}


def aggregate(tr: Translated, results: Results, created: int) -> dict[str, Any]:
    """The chat.completion object of finished generations (one choice each). The top-level
    `infernix` report is the first choice's; each choice carries its own."""
    return {
        "id": tr.request.request_id, "object": "chat.completion", "created": created,
        "model": tr.request.model,
        "choices": [_choice(i, fin) for i, fin in enumerate(results.finished)],
        "usage": usage(results), "infernix": _report(results.first),
    }


class Streamer:
    """chat.completion.chunk events: each choice's role chunk first, content and tool-call
    deltas (with their choice index), each choice's finish chunk (with its constraint report),
    an optional usage chunk, then [DONE]. Log-probability entries ride on the next content
    chunk of their choice (stop strings may hold text back), the rest on its finish chunk, so
    the chunks' `logprobs.content` concatenate to the aggregate reply's."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.created = int(time.time())
        self._held: dict[int, list] = {}  # choice index -> entries not yet sent

    def _chunk(self, delta: dict | None, index: int = 0, finish: str | None = None,
               **extra: Any) -> SSE:
        held = self._held.pop(index, None) if delta is not None and (
            "content" in delta and delta["content"] or finish is not None) else None
        logprobs = _logprobs(held) if held else None
        choices = [] if delta is None else [
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        return SSE({"id": self.tr.request.request_id, "object": "chat.completion.chunk",
                    "created": self.created, "model": self.tr.request.model,
                    "choices": choices, **extra})

    def begin(self, counts: Any = None) -> list[SSE]:
        return [self._chunk({"role": "assistant", "content": ""}, i)
                for i in range(len(self.tr.requests))]

    def event(self, event: Any, index: int = 0) -> list[SSE]:
        if isinstance(event, TokenLogprobs):
            self._held.setdefault(index, []).extend(event.tokens)
            return []
        if isinstance(event, TextDelta):
            return [self._chunk({"content": event.text}, index)] if event.text else []
        if isinstance(event, ReasoningDelta):
            return [self._chunk({"reasoning_content": event.text}, index)] if event.text else []
        if isinstance(event, ToolCallStart):
            return [self._chunk({"tool_calls": [{"index": event.index, "id": event.id,
                                                 "type": "function", "function": {
                                                     "name": event.name, "arguments": ""}}]},
                                index)]
        if isinstance(event, ToolCallArgumentsDelta):
            return [self._chunk({"tool_calls": [{"index": event.index,
                                                 "function": {"arguments": event.fragment}}]},
                                index)]
        return []

    def choice_done(self, finished: Finished, index: int = 0) -> list[SSE]:
        return [self._chunk({}, index, FINISH[finished.finish_reason], infernix=_report(finished))]

    def finish(self, results: Results) -> list[SSE]:
        out = [self._chunk(None, usage=usage(results))] if self.tr.include_usage else []
        return out + [DONE]

    def fail(self, error_body: dict) -> list[SSE]:
        return [SSE(error_body), DONE]
