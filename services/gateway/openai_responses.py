"""OpenAI Responses: `POST /v1/responses` <-> the worker contract (stateless: no stored
responses, so `previous_response_id` and `background` are refused)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any

from services.gateway import fields as f
from services.gateway import known
from services.gateway.choices import Results
from services.gateway.errors import ErrorPaths
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits
from services.gateway.sse import SSE
from services.gateway.translate import (
    Translated,
    allowed_names,
    effort_thinking,
    json_schema_constraint,
    merge_content_constraint,
    merge_thinking,
    structured_outputs,
    structured_outputs_key,
    thinking_budget,
    tool_definition,
    tool_policy,
)
from shared.contract import OutputConstraint, ToolChoice, ToolMode, parse_json_text
from shared.errors import InternalError, InvalidRequest, Unsupported
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
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
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
        aliases={"max_tokens": "max_output_tokens", "prompt": "input", "constraint": constraint})


def translate(body: dict, request_id: str, limits: GatewayLimits,
              policy: FieldPolicy = FieldPolicy()) -> Translated:
    """Responses body -> GenerateRequest. Raises typed RequestErrors naming the original field."""
    policy.check(body, "", known.RESPONSES)
    model = f.get_str(body, "model", "", required=True)
    _include(body)
    truncation = f.get_str(body, "truncation", "", default="disabled")
    f.reject_unless(truncation == "disabled", "truncation",
                    f"truncation {truncation!r} is not supported: a prompt longer than the "
                    "context is an error here (truncation 'disabled')")
    messages = _input(body, limits, policy)
    tools = _tools(body, limits, policy)
    choice = tool_policy(tools, _tool_choice(body, policy))
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
                             thinking_budget=thinking.budget)
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
    }
    return Translated((request,), error_paths(body),
                      stream=f.get_bool(body, "stream", "", default=False), echo=echo)


def _include(body: dict) -> None:
    """`include` values that concern features this server lacks are harmless; log-probabilities
    would change the output and are refused."""
    values = f.get_list(body, "include", "") or []
    for i, value in enumerate(values):
        path = f"include[{i}]"
        if not isinstance(value, str):
            raise f.wrong_type(path, "a string", value)
        if value == "message.output_text.logprobs":
            raise Unsupported(f"{path} {value!r} is not supported: log-probabilities are not "
                              "reported yet", field=path)
        if value not in known.RESPONSES_INCLUDE_INERT:
            raise InvalidRequest(f"{path} {value!r} is not a value this server knows", field=path)


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
    raw = f.get_list(body, "tools", "") or []
    limits.check_tools(len(raw), "tools")
    tools = []
    for i, tool in enumerate(raw):
        path = f"tools[{i}]"
        tool = f.as_dict(tool, path)
        kind = f.get_str(tool, "type", path, required=True)
        f.reject_unless(kind == "function", f"{path}.type",
                        f"{path}.type {kind!r} is not supported; only function tools")
        policy.check(tool, path, known.RESPONSES_TOOL)
        tools.append(tool_definition(
            i, f.get_str(tool, "name", path, required=True), f.get_dict(tool, "parameters", path),
            description=f.get_str(tool, "description", path),
            # The Responses API documents strict as defaulting to true.
            strict=f.get_bool(tool, "strict", path, default=True),
            schema_path=f"{path}.parameters", limits=limits))
    return tuple(tools)


def _tool_choice(body: dict, policy: FieldPolicy) -> ToolChoice:
    parallel = f.get_bool(body, "parallel_tool_calls", "", default=True)
    value = f.get(body, "tool_choice", "")
    if value is f.MISSING:
        return ToolChoice(parallel=parallel)
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise InvalidRequest(f"tool_choice {value!r} must be auto, none, required or a named "
                                 "function", field="tool_choice")
        return ToolChoice(ToolMode(value), parallel=parallel)
    value = f.as_dict(value, "tool_choice")
    policy.check(value, "tool_choice", known.RESPONSES_TOOL_CHOICE)
    kind = f.get_str(value, "type", "tool_choice", required=True)
    if kind == "function":
        return ToolChoice.named(f.get_str(value, "name", "tool_choice", required=True))
    if kind == "allowed_tools":
        mode = f.get_str(value, "mode", "tool_choice", required=True)
        if mode not in ("auto", "required"):
            raise InvalidRequest(f"tool_choice.mode {mode!r} must be auto or required",
                                 field="tool_choice.mode")
        names = allowed_names(value.get("tools"), "tool_choice.tools", nested_function=False)
        return ToolChoice(ToolMode(mode), names, parallel)
    raise Unsupported(f"tool_choice.type {kind!r} is not supported (function, allowed_tools)",
                      field="tool_choice.type")


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


# ---- replies ----

def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """A reasoning output item: the reasoning text itself as its content (no summary)."""
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_object(tr: Translated, created: float, status: str, output: list[dict],
                    results: Results | None = None, error: dict | None = None) -> dict:
    """The `response` object in the given status."""
    obj: dict[str, Any] = {
        "id": tr.request.request_id, "object": "response", "created_at": created,
        "status": status, "error": error, "incomplete_details": None, "model": tr.request.model,
        "output": output, **tr.echo,
        "usage": None,
    }
    if results is not None:
        finished = results.first
        obj["usage"] = {"input_tokens": results.prompt_tokens,
                        "output_tokens": results.completion_tokens,
                        "total_tokens": results.prompt_tokens + results.completion_tokens,
                        "input_tokens_details": {"cached_tokens": results.cached_tokens},
                        "output_tokens_details": {"reasoning_tokens": results.reasoning_tokens}}
        if finished.finish_reason is FinishReason.LENGTH:
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        obj["infernix"] = {"constraint": finished.constraint}
    return obj


def _status(finished: Finished) -> str:
    return "incomplete" if finished.finish_reason is FinishReason.LENGTH else "completed"


def aggregate(tr: Translated, results: Results, created: int) -> dict[str, Any]:
    """The response object of a finished generation."""
    finished = results.first
    status = _status(finished)
    output = []
    if finished.reasoning:  # incomplete when the output was cut while still reasoning
        cut = status == "incomplete" and not finished.content and not finished.tool_calls
        output.append(_reasoning_item(_item_id("rs"), finished.reasoning,
                                      "incomplete" if cut else "completed"))
    if finished.content or not finished.tool_calls:
        output.append(_message_item(_item_id("msg"), finished.content, status))
    output += [_call_item(_item_id("fc"), c.id, c.name, c.arguments_json, "completed")
               for c in finished.tool_calls]
    return response_object(tr, created, status, output, results)


class Streamer:
    """The Responses event sequence, each event with its sequence_number."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict] = []  # finished items, in output order
        self.open: dict | None = None  # the item being streamed
        self.text = ""  # accumulated text or arguments of the open item

    def _ev(self, kind: str, **data: Any) -> SSE:
        ev = SSE({"type": kind, "sequence_number": self.seq, **data}, event=kind)
        self.seq += 1
        return ev

    def begin(self, counts: Any = None) -> list[SSE]:
        obj = response_object(self.tr, self.created, "in_progress", [])
        return [self._ev("response.created", response=obj),
                self._ev("response.in_progress", response=obj)]

    def _close(self, status: str = "completed") -> list[SSE]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output)
        if item["type"] == "reasoning":
            done = _reasoning_item(item["id"], self.text, status)
            events = [
                self._ev("response.reasoning_text.done", item_id=item["id"], output_index=index,
                         content_index=0, text=self.text),
                self._ev("response.content_part.done", item_id=item["id"], output_index=index,
                         content_index=0, part=done["content"][0])]
        elif item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            done = _message_item(item["id"], self.text, status)
            events = [
                self._ev("response.output_text.done", item_id=item["id"], output_index=index,
                         content_index=0, text=self.text, logprobs=[]),
                self._ev("response.content_part.done", item_id=item["id"], output_index=index,
                         content_index=0, part=part)]
        else:
            done = _call_item(item["id"], item["call_id"], item["name"], self.text, status)
            events = [self._ev("response.function_call_arguments.done", item_id=item["id"],
                               output_index=index, name=item["name"], arguments=self.text)]
        self.output.append(done)
        return events + [self._ev("response.output_item.done", output_index=index, item=done)]

    def event(self, event: Any, choice: int = 0) -> list[SSE]:
        index = len(self.output)
        out: list[SSE] = []
        if isinstance(event, ReasoningDelta):
            if not event.text:
                return []
            if self.open is None or self.open["type"] != "reasoning":
                out += self._close()
                index = len(self.output)
                self.open, self.text = _reasoning_item(_item_id("rs"), "", "in_progress"), ""
                self.open["content"] = []
                out += [self._ev("response.output_item.added", output_index=index, item=self.open),
                        self._ev("response.content_part.added", item_id=self.open["id"],
                                 output_index=index, content_index=0,
                                 part={"type": "reasoning_text", "text": ""})]
            self.text += event.text
            out.append(self._ev("response.reasoning_text.delta", item_id=self.open["id"],
                                output_index=index, content_index=0, delta=event.text))
        elif isinstance(event, TextDelta):
            if not event.text:
                return []
            if self.open is None or self.open["type"] != "message":
                out += self._close()
                index = len(self.output)
                self.open, self.text = _message_item(_item_id("msg"), "", "in_progress"), ""
                self.open["content"] = []
                out += [self._ev("response.output_item.added", output_index=index, item=self.open),
                        self._ev("response.content_part.added", item_id=self.open["id"],
                                 output_index=index, content_index=0,
                                 part={"type": "output_text", "text": "", "annotations": [],
                                       "logprobs": []})]
            self.text += event.text
            out.append(self._ev("response.output_text.delta", item_id=self.open["id"],
                                output_index=index, content_index=0, delta=event.text, logprobs=[]))
        elif isinstance(event, ToolCallStart):
            out += self._close()
            index = len(self.output)
            self.open = _call_item(_item_id("fc"), event.id, event.name, "", "in_progress")
            self.open["call_index"] = event.index
            self.text = ""
            item = {k: v for k, v in self.open.items() if k != "call_index"}
            out.append(self._ev("response.output_item.added", output_index=index, item=item))
        elif isinstance(event, ToolCallArgumentsDelta):
            if self.open is None or self.open.get("call_index") != event.index:
                raise InternalError(f"arguments for call {event.index} arrived while it "
                                            "was not the open call")
            self.text += event.fragment
            out.append(self._ev("response.function_call_arguments.delta", item_id=self.open["id"],
                                output_index=index, delta=event.fragment))
        return out

    def choice_done(self, finished: Finished, choice: int = 0) -> list[SSE]:
        return []

    def finish(self, results: Results) -> list[SSE]:
        status = _status(results.first)
        out = self._close(status if self.open and self.open["type"] in ("message", "reasoning")
                          else "completed")
        obj = response_object(self.tr, self.created, status, self.output, results)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + [self._ev(kind, response=obj)]

    def fail(self, error: dict) -> list[SSE]:
        obj = response_object(self.tr, self.created, "failed", self.output,
                              error={"code": error["error"].get("code") or "server_error",
                                     "message": error["error"]["message"]})
        return [self._ev("response.failed", response=obj)]

