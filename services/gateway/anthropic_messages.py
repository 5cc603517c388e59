"""Anthropic Messages: `POST /v1/messages` (and `/v1/messages/count_tokens`) <-> the worker
contract. A final assistant message is continued, as Anthropic's prefill is. The replies (the
message object, the event stream) are anthropic_replies.py's."""

from __future__ import annotations

from typing import Any

from services.gateway import fields as f
from services.gateway import known
from services.gateway.anthropic_replies import Streamer, aggregate, signature_matches  # noqa: F401 - the entry's
from services.gateway.errors import ErrorPaths
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits
from services.gateway.translate import (
    Translated,
    declared_tools,
    json_schema_constraint,
    merge_content_constraint,
    structured_outputs,
    structured_outputs_key,
    tool_definition,
    tool_policy,
)
from shared.contract import OutputConstraint, ToolChoice, ToolMode, canonical_json
from shared.errors import ConflictingConstraint, InvalidRequest, Unsupported
from shared.generation import (
    ChatMessage,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    ToolCall,
)

# Encrypted reasoning of an earlier turn: nothing this server can render. A `thinking` block is
# the turn's reasoning (ChatMessage.reasoning); the chat template decides whether it is shown.
_DROPPED_BLOCKS = ("redacted_thinking",)


def error_paths(body: dict) -> ErrorPaths:
    key = structured_outputs_key(body)
    config = body.get("output_config")
    if key:
        constraint, schema = f"structured_outputs.{key}", None
    elif body.get("output_format") is not None and not (isinstance(config, dict) and
                                                        config.get("format") is not None):
        constraint, schema = "output_format", "output_format.schema"
    else:
        constraint, schema = "output_config.format", "output_config.format.schema"
    return ErrorPaths(
        content_schema=schema, constraint=constraint,
        tool_base="tools[{i}]", tool_fields={"parameters": "input_schema"},
        aliases={"stop": "stop_sequences", "prompt": "messages", "constraint": constraint,
                 "thinking_budget": "thinking", "enable_thinking": "thinking"})


def prompt_input(body: dict, limits: GatewayLimits,
                 policy: FieldPolicy = FieldPolicy()) -> tuple[PromptInput, ToolChoice]:
    """The prompt (system, messages, tools, thinking on/off) and the call policy of a Messages
    body. A final assistant message is continued (prefill): only the new suffix is generated."""
    policy.check(body, "", known.MESSAGES)
    messages = _messages(body, limits, policy)
    tools = _tools(body, limits, policy)
    choice = tool_policy(tools, _tool_choice(body, policy))
    last = messages[-1]
    prefill = last.role == "assistant" and not last.tool_calls
    enable, _ = _thinking(body, policy)
    return PromptInput(messages=messages, tools=tools, continue_final_assistant=prefill,
                       enable_thinking=enable), choice


def _thinking(body: dict, policy: FieldPolicy) -> tuple[bool | None, int | None]:
    """`thinking`: {type: enabled, budget_tokens} turns thinking on with that budget, {type:
    disabled} off; absent: the model template's default (Qwen3.5 thinks)."""
    thinking = f.get_dict(body, "thinking", "")
    if thinking is None:
        return None, None
    policy.check(thinking, "thinking", known.MESSAGES_THINKING_CONFIG)
    kind = f.get_str(thinking, "type", "thinking", required=True)
    if kind == "disabled":
        return False, None
    f.reject_unless(kind == "enabled", "thinking.type",
                    f"thinking.type {kind!r} is not supported (enabled, disabled)")
    budget = f.get_int(thinking, "budget_tokens", "thinking", required=True)
    if budget < 0:
        raise InvalidRequest(f"thinking.budget_tokens must be >= 0, got {budget}",
                             field="thinking.budget_tokens")
    return True, budget


def translate(body: dict, request_id: str, limits: GatewayLimits,
              policy: FieldPolicy = FieldPolicy()) -> Translated:
    """Messages body -> GenerateRequest. Raises typed RequestErrors naming the original field."""
    model = f.get_str(body, "model", "", required=True)
    max_tokens = f.get_int(body, "max_tokens", "", required=True)
    prompt, choice = prompt_input(body, limits, policy)
    _, budget = _thinking(body, policy)
    # Anthropic's documented ranges: temperature and top_p 0..1.
    sampling = SamplingParams(temperature=f.get_ranged(body, "temperature", "", 0.0, 1.0,
                                                       default=1.0),
                              top_p=f.get_ranged(body, "top_p", "", 0.0, 1.0, default=1.0),
                              top_k=f.get_int(body, "top_k", "", default=0))
    stops = f.get_list(body, "stop_sequences", "") or []
    for i, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise f.wrong_type(f"stop_sequences[{i}]", "a non-empty string", stop)
    constraint = merge_content_constraint(_output_format(body, limits, policy),
                                          structured_outputs(body, limits), "output_config.format")
    options = RequestOptions(max_tokens=max_tokens, sampling=sampling, constraint=constraint,
                             tool_choice=choice, stop=tuple(stops), thinking_budget=budget)
    return Translated((GenerateRequest(request_id, prompt, options, model),), error_paths(body),
                      stream=f.get_bool(body, "stream", "", default=False))


def _system(body: dict, policy: FieldPolicy) -> str | None:
    value = f.get(body, "system", "")
    if value is f.MISSING:
        return None
    _check_text_blocks(value, "system", policy)
    return f.text_parts(value, "system", part_types=("text",))


def _check_text_blocks(value: Any, path: str, policy: FieldPolicy) -> None:
    if isinstance(value, list):
        for j, block in enumerate(value):
            if isinstance(block, dict) and block.get("type") == "text":
                policy.check(block, f.join(path, j), known.MESSAGES_TEXT)


def _messages(body: dict, limits: GatewayLimits, policy: FieldPolicy) -> tuple[ChatMessage, ...]:
    raw = f.get_list(body, "messages", "", required=True)
    if not raw:
        raise InvalidRequest("messages must hold at least one message", field="messages")
    limits.check_messages(len(raw), "messages")
    system = _system(body, policy)
    out = [ChatMessage("system", system)] if system else []
    for i, message in enumerate(raw):
        path = f"messages[{i}]"
        message = f.as_dict(message, path)
        policy.check(message, path, known.MESSAGES_MESSAGE)
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
        blocks = [_block(b, f"{path}.content[{j}]", policy,
                         ("text", "tool_use", "thinking") if role == "assistant"
                         else ("text", "tool_result"))
                  for j, b in enumerate(content)]
        out += _assistant(blocks, path) if role == "assistant" else _user(blocks, path)
    return tuple(out)


_BLOCK_SHAPES = {"text": known.MESSAGES_TEXT, "tool_use": known.MESSAGES_TOOL_USE,
                 "tool_result": known.MESSAGES_TOOL_RESULT, "thinking": known.MESSAGES_THINKING,
                 "redacted_thinking": known.MESSAGES_THINKING}


def _block(block: Any, path: str, policy: FieldPolicy, allowed: tuple[str, ...]) -> dict:
    block = f.as_dict(block, path)
    kind = f.get_str(block, "type", path, required=True)
    if kind not in allowed and kind not in _DROPPED_BLOCKS:
        raise Unsupported(f"{path}.type {kind!r} is not supported here ({', '.join(allowed)})",
                          field=f"{path}.type")
    policy.check(block, path, _BLOCK_SHAPES[kind])
    return block


def _user(blocks: list[dict], path: str) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        kind = block["type"]
        if kind == "text":
            texts.append(f.get_str(block, "text", bpath, required=True))
        elif kind == "tool_result":
            if texts:
                out.append(ChatMessage("user", "".join(texts)))
                texts = []
            content = f.get(block, "content", bpath)
            text = "" if content is f.MISSING else f.text_parts(content, f"{bpath}.content",
                                                                part_types=("text",))
            out.append(
                ChatMessage(
                    "tool", text, tool_call_id=f.get_str(block, "tool_use_id", bpath, required=True)
                )
            )
    if texts or not out:
        out.append(ChatMessage("user", "".join(texts)))
    return out


def _assistant(blocks: list[dict], path: str) -> list[ChatMessage]:
    texts: list[str] = []
    calls: list[ToolCall] = []
    thoughts: list[str] = []
    for j, block in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        kind = block["type"]
        if kind == "text":
            texts.append(f.get_str(block, "text", bpath, required=True))
        elif kind == "thinking":
            text = f.get_str(block, "thinking", bpath, required=True)
            signature = f.get_str(block, "signature", bpath, default="")
            if not signature_matches(text, signature):
                raise InvalidRequest(f"{bpath}.signature was issued for another thinking text: "
                                     "send thinking blocks back unchanged",
                                     field=f"{bpath}.signature")
            thoughts.append(text)
        elif kind == "tool_use":
            arguments = f.get_dict(block, "input", bpath, required=True)
            calls.append(ToolCall(f.get_str(block, "id", bpath, required=True),
                                  f.get_str(block, "name", bpath, required=True),
                                  canonical_json(arguments)))
    return [ChatMessage("assistant", "".join(texts) if texts or not calls else None, tuple(calls),
                        reasoning="".join(thoughts) if thoughts else None)]


def _tools(body: dict, limits: GatewayLimits, policy: FieldPolicy) -> tuple:
    tools = []
    for i, path, tool in declared_tools(body, limits, policy, known.MESSAGES_TOOL, kind="custom",
                                        default_kind="custom", what="custom (client) tools"):
        tools.append(tool_definition(
            i, f.get_str(tool, "name", path, required=True),
            f.get_dict(tool, "input_schema", path, required=True),
            description=f.get_str(tool, "description", path),
            strict=f.get_bool(tool, "strict", path, default=False),
            schema_path=f"{path}.input_schema", limits=limits))
    return tuple(tools)


def _tool_choice(body: dict, policy: FieldPolicy) -> ToolChoice:
    value = f.get_dict(body, "tool_choice", "")
    if value is None:
        return ToolChoice()
    policy.check(value, "tool_choice", known.MESSAGES_TOOL_CHOICE)
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


def _output_format(body: dict, limits: GatewayLimits,
                   policy: FieldPolicy) -> OutputConstraint | None:
    """`output_config.format`, or the structured-outputs beta's top-level `output_format` (the
    same object); both at once is a ConflictingConstraint."""
    config = f.get_dict(body, "output_config", "")
    if config is not None:
        policy.check(config, "output_config", known.MESSAGES_OUTPUT_CONFIG)
    fmt = None if config is None else f.get_dict(config, "format", "output_config")
    beta = f.get_dict(body, "output_format", "")
    if fmt is not None and beta is not None:
        raise ConflictingConstraint("output_config.format and output_format both constrain the "
                                    "content; a content constraint has one source",
                                    field="output_format")
    path = "output_config.format" if fmt is not None else "output_format"
    fmt = fmt if fmt is not None else beta
    if fmt is None:
        return None
    policy.check(fmt, path, known.MESSAGES_FORMAT)
    kind = f.get_str(fmt, "type", path, required=True)
    f.reject_unless(kind == "json_schema", f"{path}.type",
                    f"{path}.type {kind!r} is not supported (json_schema)")
    return json_schema_constraint(f.get(fmt, "schema", path), f"{path}.schema", limits)
