"""Anthropic Messages: `POST /v1/messages` (and `/v1/messages/count_tokens`) <-> the worker
contract. A final assistant message is continued, as Anthropic's prefill is."""

from __future__ import annotations

import json
from typing import Any

from services.gateway import fields as f
from services.gateway.errors import ErrorPaths
from services.gateway.limits import GatewayLimits
from services.gateway.sse import SSE
from services.gateway.translate import Translated, json_schema_constraint, tool_definition, \
    tool_policy
from shared.contract import OutputConstraint, ToolChoice, ToolMode, canonical_json
from shared.errors import InternalError, InvalidRequest, Unsupported
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

_DROPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier turns' reasoning: not re-rendered


def error_paths(body: dict) -> ErrorPaths:
    return ErrorPaths(
        content_schema="output_config.format.schema", constraint="output_config.format",
        tool_base="tools[{i}]", tool_fields={"parameters": "input_schema"},
        aliases={"stop": "stop_sequences", "prompt": "messages",
                 "constraint": "output_config.format"})


def prompt_input(body: dict, limits: GatewayLimits) -> tuple[PromptInput, ToolChoice]:
    """The prompt (system, messages, tools) and the call policy of a Messages body."""
    messages = _messages(body, limits)
    tools = _tools(body, limits)
    choice = tool_policy(tools, _tool_choice(body))
    last = messages[-1]
    prefill = last.role == "assistant" and not last.tool_calls
    return PromptInput(messages=messages, tools=tools, continue_final_assistant=prefill), choice


def translate(body: dict, request_id: str, limits: GatewayLimits) -> Translated:
    """Messages body -> GenerateRequest. Raises typed RequestErrors naming the original field."""
    model = f.get_str(body, "model", "", required=True)
    max_tokens = f.get_int(body, "max_tokens", "", required=True)
    thinking = f.get_dict(body, "thinking", "")
    f.reject_unless(thinking is None or thinking.get("type") == "disabled", "thinking",
                    "extended thinking is not supported by this server")
    prompt, choice = prompt_input(body, limits)
    sampling = SamplingParams(temperature=f.get_number(body, "temperature", "", default=1.0),
                              top_p=f.get_number(body, "top_p", "", default=1.0),
                              top_k=f.get_int(body, "top_k", "", default=0))
    stops = f.get_list(body, "stop_sequences", "") or []
    for i, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise f.wrong_type(f"stop_sequences[{i}]", "a non-empty string", stop)
    options = RequestOptions(max_tokens=max_tokens, sampling=sampling,
                             constraint=_output_format(body, limits), tool_choice=choice,
                             stop=tuple(stops))
    return Translated(GenerateRequest(request_id, prompt, options, model), error_paths(body),
                      stream=f.get_bool(body, "stream", "", default=False))


def _system(body: dict) -> str | None:
    value = f.get(body, "system", "")
    if value is f.MISSING:
        return None
    return f.text_parts(value, "system", part_types=("text",))


def _messages(body: dict, limits: GatewayLimits) -> tuple[ChatMessage, ...]:
    raw = f.get_list(body, "messages", "", required=True)
    if not raw:
        raise InvalidRequest("messages must hold at least one message", field="messages")
    limits.check_messages(len(raw), "messages")
    system = _system(body)
    out = [ChatMessage("system", system)] if system else []
    for i, message in enumerate(raw):
        path = f"messages[{i}]"
        message = f.as_dict(message, path)
        role = f.get_str(message, "role", path, required=True)
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"{path}.role must be user or assistant, got {role!r}",
                                 field=f"{path}.role")
        content = f.get(message, "content", path, required=True)
        if isinstance(content, str):
            out.append(ChatMessage(role, content))
            continue
        if not isinstance(content, list):
            raise f.wrong_type(f"{path}.content", "a string or an array of content blocks", content)
        out += _assistant(content, path) if role == "assistant" else _user(content, path)
    return tuple(out)


def _block(block: Any, path: str, allowed: tuple[str, ...]) -> tuple[dict, str]:
    block = f.as_dict(block, path)
    kind = f.get_str(block, "type", path, required=True)
    if kind not in allowed and kind not in _DROPPED_BLOCKS:
        raise Unsupported(f"{path}.type {kind!r} is not supported here ({', '.join(allowed)})",
                          field=f"{path}.type")
    return block, kind


def _user(blocks: list, path: str) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        block, kind = _block(block, bpath, ("text", "tool_result"))
        if kind == "text":
            texts.append(f.get_str(block, "text", bpath, required=True))
        elif kind == "tool_result":
            if texts:
                out.append(ChatMessage("user", "".join(texts)))
                texts = []
            content = f.get(block, "content", bpath)
            text = "" if content is f.MISSING else f.text_parts(content, f"{bpath}.content",
                                                                part_types=("text",))
            out.append(ChatMessage("tool", text,
                                   tool_call_id=f.get_str(block, "tool_use_id", bpath, required=True)))
    if texts or not out:
        out.append(ChatMessage("user", "".join(texts)))
    return out


def _assistant(blocks: list, path: str) -> list[ChatMessage]:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        block, kind = _block(block, bpath, ("text", "tool_use"))
        if kind == "text":
            texts.append(f.get_str(block, "text", bpath, required=True))
        elif kind == "tool_use":
            arguments = f.get_dict(block, "input", bpath, required=True)
            calls.append(ToolCall(f.get_str(block, "id", bpath, required=True),
                                  f.get_str(block, "name", bpath, required=True),
                                  canonical_json(arguments)))
    return [ChatMessage("assistant", "".join(texts) if texts or not calls else None, tuple(calls))]


def _tools(body: dict, limits: GatewayLimits) -> tuple:
    raw = f.get_list(body, "tools", "") or []
    limits.check_tools(len(raw), "tools")
    tools = []
    for i, tool in enumerate(raw):
        path = f"tools[{i}]"
        tool = f.as_dict(tool, path)
        kind = f.get_str(tool, "type", path, default="custom")
        f.reject_unless(kind == "custom", f"{path}.type",
                        f"{path}.type {kind!r} is not supported; only custom (client) tools")
        tools.append(tool_definition(
            i, f.get_str(tool, "name", path, required=True),
            f.get_dict(tool, "input_schema", path, required=True),
            description=f.get_str(tool, "description", path),
            strict=f.get_bool(tool, "strict", path, default=False),
            schema_path=f"{path}.input_schema", limits=limits))
    return tuple(tools)


def _tool_choice(body: dict) -> ToolChoice:
    value = f.get_dict(body, "tool_choice", "")
    if value is None:
        return ToolChoice()
    kind = f.get_str(value, "type", "tool_choice", required=True)
    parallel = not f.get_bool(value, "disable_parallel_tool_use", "tool_choice", default=False)
    if kind == "auto":
        return ToolChoice(ToolMode.AUTO, parallel=parallel)
    if kind == "any":
        return ToolChoice(ToolMode.REQUIRED, parallel=parallel)
    if kind == "none":
        return ToolChoice(ToolMode.NONE, parallel=parallel)
    if kind == "tool":
        return ToolChoice.named(f.get_str(value, "name", "tool_choice", required=True),
                                parallel=parallel)
    raise InvalidRequest(f"tool_choice.type {kind!r} must be auto, any, tool or none",
                         field="tool_choice.type")


def _output_format(body: dict, limits: GatewayLimits) -> OutputConstraint | None:
    config = f.get_dict(body, "output_config", "")
    fmt = None if config is None else f.get_dict(config, "format", "output_config")
    if fmt is None:
        return None
    kind = f.get_str(fmt, "type", "output_config.format", required=True)
    f.reject_unless(kind == "json_schema", "output_config.format.type",
                    f"output_config.format.type {kind!r} is not supported (json_schema)")
    return json_schema_constraint(f.get(fmt, "schema", "output_config.format"),
                                  "output_config.format.schema", limits)


# ---- replies ----

def stop_reason(finished: Finished) -> str:
    if finished.finish_reason is FinishReason.TOOL_CALLS:
        return "tool_use"
    if finished.finish_reason is FinishReason.LENGTH:
        return "max_tokens"
    return "stop_sequence" if finished.stop_sequence else "end_turn"


def aggregate(tr: Translated, finished: Finished, created: int) -> dict[str, Any]:
    """The message object of a finished generation."""
    content: list[dict] = []
    if finished.content:
        content.append({"type": "text", "text": finished.content})
    content += [{"type": "tool_use", "id": c.id, "name": c.name,
                 "input": _arguments(c.arguments_json)} for c in finished.tool_calls]
    return {"id": tr.request.request_id, "type": "message", "role": "assistant",
            "model": tr.request.model, "content": content, "stop_reason": stop_reason(finished),
            "stop_sequence": finished.stop_sequence,
            "usage": {"input_tokens": finished.usage.prompt_tokens,
                      "output_tokens": finished.usage.completion_tokens},
            "infernix": {"constraint": finished.constraint}}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise InternalError("the worker published tool arguments that are not JSON") from None


class Streamer:
    """message_start, content blocks (text_delta / input_json_delta), message_delta with the
    stop reason, usage and constraint report, message_stop; failures as `event: error`."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.blocks = 0  # content blocks opened so far
        self.open: str | None = None  # "text" or "tool_use"
        self.open_call: int | None = None  # the worker's call index of an open tool_use block

    @staticmethod
    def _ev(kind: str, **data: Any) -> SSE:
        return SSE({"type": kind, **data}, event=kind)

    def begin(self) -> list[SSE]:
        message = {"id": self.tr.request.request_id, "type": "message", "role": "assistant",
                   "model": self.tr.request.model, "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [self._ev("message_start", message=message), self._ev("ping")]

    def _close(self) -> list[SSE]:
        if self.open is None:
            return []
        self.open, self.open_call = None, None
        return [self._ev("content_block_stop", index=self.blocks - 1)]

    def _start(self, kind: str, block: dict) -> list[SSE]:
        out = self._close()
        self.open = kind
        self.blocks += 1
        return out + [self._ev("content_block_start", index=self.blocks - 1, content_block=block)]

    def event(self, event: Any) -> list[SSE]:
        out: list[SSE] = []
        if isinstance(event, TextDelta) and event.text:
            if self.open != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(self._ev("content_block_delta", index=self.blocks - 1,
                                delta={"type": "text_delta", "text": event.text}))
        elif isinstance(event, ToolCallStart):
            out += self._start("tool_use", {"type": "tool_use", "id": event.id, "name": event.name,
                                            "input": {}})
            self.open_call = event.index
        elif isinstance(event, ToolCallArgumentsDelta):
            if self.open_call != event.index:
                raise InternalError(f"arguments for call {event.index} arrived while it was not "
                                    "the open call")
            out.append(self._ev("content_block_delta", index=self.blocks - 1,
                                delta={"type": "input_json_delta", "partial_json": event.fragment}))
        return out

    def finish(self, finished: Finished) -> list[SSE]:
        usage = {"input_tokens": finished.usage.prompt_tokens,
                 "output_tokens": finished.usage.completion_tokens}
        return self._close() + [
            self._ev("message_delta", delta={"stop_reason": stop_reason(finished),
                                             "stop_sequence": finished.stop_sequence},
                     usage=usage, infernix={"constraint": finished.constraint}),
            self._ev("message_stop")]

    def fail(self, error_body: dict) -> list[SSE]:
        return [SSE(error_body, event="error")]
