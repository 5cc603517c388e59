"""OpenAI Responses: `POST /v1/responses` <-> the worker contract (stateless: no stored
responses, so `previous_response_id` and `background` are refused). The replies (items, the
response object, the event stream) are responses_replies.py's."""

from __future__ import annotations

import dataclasses
from typing import Any

from services.gateway import fields as f
from services.gateway import known
from services.gateway.errors import ErrorPaths
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits
from services.gateway.logprobs import responses_logprobs
from services.gateway.responses_replies import Streamer, aggregate  # noqa: F401 - the entry's
from services.gateway.translate import (
    Translated,
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
)
from shared.contract import OutputConstraint, parse_json_text
from shared.errors import InvalidRequest, Unsupported
from shared.generation import (
    ChatMessage,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    ToolCall,
)

_PARTS = ("input_text", "output_text")
_ITEMS = {"message": known.RESPONSES_MESSAGE, "function_call": known.RESPONSES_CALL,
          "function_call_output": known.RESPONSES_CALL_OUTPUT,
          "reasoning": known.RESPONSES_REASONING_ITEM}


def error_paths(body: dict) -> ErrorPaths:
    key = structured_outputs_key(body)
    constraint = f"structured_outputs.{key}" if key else "text.format"
    return ErrorPaths(
        content_schema="text.format.schema", constraint=constraint, tool_base="tools[{i}]",
        aliases={"max_tokens": "max_output_tokens", "prompt": "input", "constraint": constraint,
                 "thinking_budget": thinking_field(body, "reasoning.effort"),
                 "enable_thinking": "reasoning.effort"})


def translate(body: dict, request_id: str, limits: GatewayLimits,
              policy: FieldPolicy = FieldPolicy()) -> Translated:
    """Responses body -> GenerateRequest. Raises typed RequestErrors naming the original field."""
    policy.check(body, "", known.RESPONSES)
    model = f.get_str(body, "model", "", required=True)
    logprobs = responses_logprobs(body, _include(body))
    truncation = f.get_str(body, "truncation", "", default="disabled")
    f.reject_unless(truncation == "disabled", "truncation",
                    f"truncation {truncation!r} is not supported: a prompt longer than the "
                    "context is an error here (truncation 'disabled')")
    messages = _input(body, limits, policy)
    tools = _tools(body, limits, policy)
    if logprobs is not None and tools:
        # A reply's message and its calls come from one token stream; the message item's
        # logprobs could not be told apart from the calls' tokens in the stream and the reply
        # alike, so the combination is refused rather than reported differently.
        raise Unsupported("top_logprobs / include message.output_text.logprobs with tools is not "
                          "supported on Responses (chat reports log-probabilities with tools)",
                          field="top_logprobs" if body.get("top_logprobs") else "include")
    choice = tool_policy(tools, openai_tool_choice(body, policy, known.RESPONSES_TOOL_CHOICE,
                                                     nested=False))
    text = f.get_dict(body, "text", "") or {}
    policy.check(text, "text", known.RESPONSES_TEXT)
    constraint = merge_content_constraint(_format(text, limits, policy),
                                          structured_outputs(body, limits), "text.format")
    sampling = SamplingParams(
        temperature=f.get_ranged(body, "temperature", "", 0.0, 2.0, default=1.0),
        top_p=f.get_ranged(body, "top_p", "", 0.0, 1.0, default=1.0))
    reasoning = f.get_dict(body, "reasoning", "") or {}
    policy.check(reasoning, "reasoning", known.RESPONSES_REASONING)
    thinking = merge_thinking(effort_thinking(reasoning.get("effort"), "reasoning.effort"),
                              thinking_budget(body), "reasoning.effort")
    options = RequestOptions(max_tokens=f.get_int(body, "max_output_tokens", ""),
                             sampling=sampling, constraint=constraint, tool_choice=choice,
                             thinking_budget=thinking.budget, logprobs=logprobs)
    request = GenerateRequest(request_id, PromptInput(messages=messages, tools=tools,
                                                      enable_thinking=thinking.enable),
                              options, model)
    echo = {
        "instructions": f.get_str(body, "instructions", ""),
        "max_output_tokens": options.max_tokens,
        "parallel_tool_calls": choice.parallel,
        "temperature": sampling.temperature, "top_p": sampling.top_p,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "text": {"format": text.get("format") or {"type": "text"}},
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "reasoning": {"effort": reasoning.get("effort"), "summary": None},
        "top_logprobs": logprobs or 0,
    }
    return Translated((request,), error_paths(body),
                      stream=f.get_bool(body, "stream", "", default=False), echo=echo)


def _include(body: dict) -> bool:
    """Whether `include` asks for the output text's log-probabilities; values that concern
    features this server lacks are harmless, unknown ones refused."""
    values = f.get_list(body, "include", "") or []
    logprobs = False
    for i, value in enumerate(values):
        path = f"include[{i}]"
        if not isinstance(value, str):
            raise f.wrong_type(path, "a string", value)
        if value == "message.output_text.logprobs":
            logprobs = True
        elif value not in known.RESPONSES_INCLUDE_INERT:
            raise InvalidRequest(f"{path} {value!r} is not a value this server knows", field=path)
    return logprobs


def _input(body: dict, limits: GatewayLimits, policy: FieldPolicy) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    instructions = f.get_str(body, "instructions", "")
    if instructions:
        out.append(ChatMessage("system", instructions))
    raw = f.get(body, "input", "", required=True)
    if isinstance(raw, str):
        return tuple(out + [ChatMessage("user", raw)])
    if not isinstance(raw, list) or not raw:
        raise f.wrong_type("input", "a string or a non-empty array of input items", raw)
    limits.check_messages(len(raw), "input")
    for i, item in enumerate(raw):
        path = f"input[{i}]"
        item = f.as_dict(item, path)
        kind = f.get_str(item, "type", path, default="message")
        if kind in _ITEMS:
            policy.check(item, path, _ITEMS[kind])
        if kind == "message":
            role = f.get_str(item, "role", path, required=True)
            text = _text(f.get(item, "content", path, required=True), f"{path}.content", policy)
            if role not in ("user", "system", "developer", "assistant"):
                raise Unsupported(f"{path}.role {role!r} is not supported", field=f"{path}.role")
            if role == "assistant" and out and out[-1].role == "assistant" \
                    and out[-1].content is None and not out[-1].tool_calls:
                out[-1] = dataclasses.replace(out[-1], content=text)  # its reasoning's turn
                continue
            out.append(ChatMessage("system" if role == "developer" else role, text))
        elif kind == "function_call":
            arguments = f.get_str(item, "arguments", path, required=True)
            parse_json_text(arguments, field=f"{path}.arguments")
            call = ToolCall(f.get_str(item, "call_id", path, required=True),
                            f.get_str(item, "name", path, required=True), arguments)
            if out and out[-1].role == "assistant":
                out[-1] = dataclasses.replace(out[-1], tool_calls=out[-1].tool_calls + (call,))
            else:
                out.append(ChatMessage("assistant", None, (call,)))
        elif kind == "function_call_output":
            output = _text(f.get(item, "output", path, required=True), f"{path}.output", policy)
            out.append(ChatMessage("tool", output,
                                   tool_call_id=f.get_str(item, "call_id", path, required=True)))
        elif kind == "reasoning":
            text = _reasoning_text(item, path, policy)
            if text is not None:  # the assistant turn its message or calls complete
                out.append(ChatMessage("assistant", None, reasoning=text))
        else:
            raise Unsupported(f"{path}.type {kind!r} is not supported (message, function_call, "
                              "function_call_output, reasoning)", field=f"{path}.type")
    return tuple(out)


def _reasoning_text(item: dict, path: str, policy: FieldPolicy) -> str | None:
    """The text of a reasoning input item (its reasoning_text parts; an item with only
    encrypted content or a summary has none this server can read)."""
    parts = f.get_list(item, "content", path) or []
    texts = []
    for j, part in enumerate(parts):
        ppath = f"{path}.content[{j}]"
        part = f.as_dict(part, ppath)
        policy.check(part, ppath, known.RESPONSES_REASONING_PART)
        kind = f.get_str(part, "type", ppath, required=True)
        f.reject_unless(kind == "reasoning_text", f"{ppath}.type",
                        f"{ppath}.type {kind!r} is not supported (reasoning_text)")
        texts.append(f.get_str(part, "text", ppath, required=True))
    return "".join(texts) if texts else None


def _text(content: Any, path: str, policy: FieldPolicy) -> str:
    if isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in _PARTS:
                policy.check(part, f.join(path, j), known.RESPONSES_TEXT_PART)
    return f.text_parts(content, path, part_types=_PARTS)


def _tools(body: dict, limits: GatewayLimits, policy: FieldPolicy) -> tuple:
    tools = []
    for i, path, tool in declared_tools(body, limits, policy, known.RESPONSES_TOOL,
                                        kind="function", what="function tools"):
        tools.append(tool_definition(
            i, f.get_str(tool, "name", path, required=True), f.get_dict(tool, "parameters", path),
            description=f.get_str(tool, "description", path),
            # The Responses API documents strict as defaulting to true.
            strict=f.get_bool(tool, "strict", path, default=True),
            schema_path=f"{path}.parameters", limits=limits))
    return tuple(tools)


def _format(text: dict, limits: GatewayLimits, policy: FieldPolicy) -> OutputConstraint | None:
    fmt = f.get_dict(text, "format", "text")
    if fmt is None:
        return None
    policy.check(fmt, "text.format", known.RESPONSES_FORMAT)
    kind = f.get_str(fmt, "type", "text.format", required=True)
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint.json_object()
    if kind == "json_schema":
        f.get_str(fmt, "name", "text.format")
        f.get_bool(fmt, "strict", "text.format")  # type-checked; the schema is always enforced
        return json_schema_constraint(f.get(fmt, "schema", "text.format"), "text.format.schema",
                                      limits)
    raise Unsupported(f"text.format.type {kind!r} is not supported (text, json_object, "
                      "json_schema)", field="text.format.type")
