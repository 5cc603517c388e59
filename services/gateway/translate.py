"""Pieces of protocol translation shared by all entries: the `structured_outputs` extension,
response schemas, tool declarations and the call policy, and the translated-request record."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

from services.gateway import fields as f
from services.gateway.errors import ErrorPaths
from services.gateway.known import FieldPolicy, Shape
from services.gateway.limits import GatewayLimits
from services.gateway.schema_meta import check_meta_schema
from shared.contract import (
    JSON_WHITESPACE,
    ConstraintKind,
    OutputConstraint,
    ToolChoice,
    ToolDefinition,
    ToolMode,
    validate_tools,
)
from shared.errors import ConflictingConstraint, InvalidRequest, Unsupported
from shared.generation import GenerateRequest

STRUCTURED_OUTPUT_KEYS = ("grammar", "regex", "choice")
# An option beside them: the JSON whitespace profile of the request's JSON content
# (response_format json_schema/json_object), one of shared.contract.JSON_WHITESPACE.
WHITESPACE_KEY = "whitespace"


@dataclass(frozen=True)
class Translated:
    """A protocol request translated into the worker contract, with what the reply needs."""

    requests: tuple[GenerateRequest, ...]  # one per choice, in choice order
    paths: ErrorPaths
    stream: bool = False
    include_usage: bool = False  # OpenAI stream_options.include_usage
    echo: dict[str, Any] = field(default_factory=dict)  # request values the reply repeats
    per_prompt: int = 1  # consecutive choices that share one prompt (OpenAI n)

    def __post_init__(self) -> None:
        assert self.requests and len(self.requests) % self.per_prompt == 0

    @property
    def request(self) -> GenerateRequest:
        """The first choice's request (model, id and options every choice shares)."""
        return self.requests[0]


def choice_count(body: dict, limits: GatewayLimits, prompts: int = 1) -> int:
    """OpenAI's `n` (default 1): at least 1, and `n * prompts` within `max_choices`."""
    n = f.get_int(body, "n", "", default=1)
    if n < 1:
        raise InvalidRequest(f"n must be at least 1, got {n}", field="n")
    limits.check_choices(n * prompts, "n")
    return n


def structured_outputs_key(body: dict) -> str | None:
    """The single key of a well-formed `structured_outputs` object, for error paths."""
    value = body.get("structured_outputs")
    if isinstance(value, dict):
        keys = [k for k in value if k != WHITESPACE_KEY]
        if len(keys) == 1:
            return keys[0]
    return None


def structured_outputs(body: dict, limits: GatewayLimits) -> OutputConstraint | None:
    """The Infernix extension `structured_outputs`: exactly one of grammar, regex or choice.

    Raises InvalidRequest naming `structured_outputs` or `structured_outputs.<key>`."""
    value = f.get_dict(body, "structured_outputs", "")
    if value is None:
        return None
    value = {k: v for k, v in value.items() if k != WHITESPACE_KEY}
    if not value:
        return None
    unknown = [k for k in value if k not in STRUCTURED_OUTPUT_KEYS]
    if unknown:
        raise InvalidRequest(
            f"structured_outputs.{unknown[0]} is not a known constraint; give exactly one of "
            f"{', '.join(STRUCTURED_OUTPUT_KEYS)}", field=f"structured_outputs.{unknown[0]}")
    if len(value) != 1:
        raise InvalidRequest(
            f"structured_outputs must hold exactly one of {', '.join(STRUCTURED_OUTPUT_KEYS)}, "
            f"got {len(value)}", field="structured_outputs")
    key, source = next(iter(value.items()))
    path = f"structured_outputs.{key}"
    if key == "choice":
        if not isinstance(source, list):
            raise f.wrong_type(path, "an array of strings", source)
        limits.check_source("".join(s for s in source if isinstance(s, str)), path)
        return OutputConstraint.choice(source)
    if not isinstance(source, str):
        raise f.wrong_type(path, "a string", source)
    limits.check_source(source, path, key)
    if key == "grammar":
        return OutputConstraint.grammar(source)
    return OutputConstraint.regex(source)


def with_json_whitespace(
    constraint: OutputConstraint | None, body: dict
) -> OutputConstraint | None:
    """`constraint` with `structured_outputs.whitespace` applied. Raises InvalidRequest for a
    profile that is not one of JSON_WHITESPACE, ConflictingConstraint when the content is not
    JSON (field `structured_outputs.whitespace` in both)."""
    value = body.get("structured_outputs")
    if not isinstance(value, dict) or WHITESPACE_KEY not in value:
        return constraint
    path = f"structured_outputs.{WHITESPACE_KEY}"
    profile = value[WHITESPACE_KEY]
    if profile not in JSON_WHITESPACE:
        raise InvalidRequest(f"{path} must be one of {', '.join(JSON_WHITESPACE)}, got "
                             f"{profile!r}", field=path)
    if constraint is None or constraint.kind not in (ConstraintKind.JSON_OBJECT,
                                                     ConstraintKind.JSON_SCHEMA):
        raise ConflictingConstraint(f"{path} applies to JSON content (response_format "
                                    "json_object or json_schema) only", field=path)
    return dataclasses.replace(constraint, whitespace=profile)


def merge_content_constraint(standard: OutputConstraint | None, extension: OutputConstraint | None,
                             standard_path: str) -> OutputConstraint | None:
    """A content constraint has one source: a standard response format plus the extension is a
    ConflictingConstraint naming `structured_outputs`."""
    if standard is not None and extension is not None:
        raise ConflictingConstraint(
            f"{standard_path} and structured_outputs both constrain the content; a content "
            "constraint has one source", field="structured_outputs")
    return standard if standard is not None else extension


def json_schema_constraint(schema: Any, path: str, limits: GatewayLimits) -> OutputConstraint:
    """A response JSON Schema (object or boolean) found at `path`."""
    if schema is f.MISSING or schema is None:
        raise InvalidRequest(f"{path} is required for a json_schema format", field=path)
    if not isinstance(schema, (dict, bool)):
        raise f.wrong_type(path, "a JSON Schema object", schema)
    limits.check_schema(schema, path)
    return OutputConstraint.json_schema(schema)


def declared_tools(body: dict, limits: GatewayLimits, policy: FieldPolicy, shape: Shape, *,
                   kind: str, default_kind: str | None = None,
                   what: str) -> Iterator[tuple[int, str, dict]]:
    """The entries of the body's `tools` array as (index, path, object): their count within the
    gateway limit, each an object of `type` `kind` (`default_kind` when absent; None: the type is
    required) with only the fields `shape` knows. `what` names the supported tools in the
    refusal of another type."""
    raw = f.get_list(body, "tools", "") or []
    limits.check_tools(len(raw), "tools")
    for i, tool in enumerate(raw):
        path = f"tools[{i}]"
        tool = f.as_dict(tool, path)
        given = f.get_str(tool, "type", path, required=default_kind is None, default=default_kind)
        f.reject_unless(given == kind, f"{path}.type",
                        f"{path}.type {given!r} is not supported; only {what}")
        policy.check(tool, path, shape)
        yield i, path, tool


def tool_definition(index: int, name: Any, parameters: Any, *, description: Any, strict: bool,
                    schema_path: str, limits: GatewayLimits) -> ToolDefinition:
    """One function tool; the parameters schema's size is checked against the gateway limit,
    and a non-strict tool's schema (which nothing compiles) against the JSON Schema meta-schema
    (InvalidSchema with its pointer). A strict tool's schema is validated by its compilation."""
    if parameters is not None:
        limits.check_schema(parameters, schema_path)
    tool = ToolDefinition.create(name, parameters, description=description, strict=strict,
                                 index=index)
    if not strict and parameters is not None:
        check_meta_schema(parameters, tool_index=index, tool_name=tool.name)
    return tool


def tool_policy(tools: tuple[ToolDefinition, ...], choice: ToolChoice) -> ToolChoice:
    """Check the declarations against the choice (duplicates, unknown names, required without
    tools) and return the choice. With no tools declared every mode but REQUIRED is plain AUTO."""
    validate_tools(tools, choice)
    if not tools and choice.mode is not ToolMode.REQUIRED:
        return ToolChoice(parallel=choice.parallel)
    return choice


def openai_tool_choice(body: dict, policy: FieldPolicy, shape: Shape, *,
                       nested: bool) -> ToolChoice:
    """OpenAI's `tool_choice` and `parallel_tool_calls`: a mode string, a named function or
    `allowed_tools`, in Chat's shape (`nested`: `{type: function, function: {name}}` and
    `{type: allowed_tools, allowed_tools: {mode, tools}}`) or Responses' flat one (`{type:
    function, name}`, `{type: allowed_tools, mode, tools}`); `shape`: the object's known
    fields. Raises InvalidRequest or Unsupported naming the field."""
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
    policy.check(value, "tool_choice", shape)
    kind = f.get_str(value, "type", "tool_choice", required=True)
    if kind not in ("function", "allowed_tools"):
        raise Unsupported(f"tool_choice.type {kind!r} is not supported (function, allowed_tools)",
                          field="tool_choice.type")
    inner, path = value, "tool_choice"
    if nested:  # Chat: the function or the allowed tools in an object of their own
        inner, path = f.get_dict(value, kind, path, required=True), f"{path}.{kind}"
    if kind == "function":
        return ToolChoice.named(f.get_str(inner, "name", path, required=True))
    mode = f.get_str(inner, "mode", path, required=True)
    if mode not in ("auto", "required"):
        raise InvalidRequest(f"{path}.mode {mode!r} must be auto or required",
                             field=f"{path}.mode")
    names = allowed_names(inner.get("tools"), f"{path}.tools", nested_function=nested)
    return ToolChoice(ToolMode(mode), names, parallel)


def allowed_names(entries: Any, path: str, *, nested_function: bool) -> tuple[str, ...]:
    """Names from an `allowed_tools` list: `{type: function, function: {name}}` (Chat) or
    `{type: function, name}` (Responses)."""
    if not isinstance(entries, list) or not entries:
        raise f.wrong_type(path, "a non-empty array of tools", entries)
    names = []
    for i, entry in enumerate(entries):
        entry_path = f.join(path, i)
        entry = f.as_dict(entry, entry_path)
        kind = f.get_str(entry, "type", entry_path, required=True)
        f.reject_unless(kind == "function", f.join(entry_path, "type"),
                        f"{entry_path}.type {kind!r} is not supported; only function tools")
        if nested_function:
            function = f.get_dict(entry, "function", entry_path, required=True)
            names.append(f.get_str(function, "name", f.join(entry_path, "function"), required=True))
        else:
            names.append(f.get_str(entry, "name", entry_path, required=True))
    return tuple(dict.fromkeys(names))


# ---- thinking --------------------------------------------------------------------------------

# `reasoning.effort` (Responses) and `reasoning_effort` (Chat) as thinking budgets: reasoning
# tokens before the worker forces the close (docs/using-openai-responses.md lists them). "none"
# turns thinking off (the template's closed empty think block).
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768}


@dataclass(frozen=True)
class Thinking:
    """A request's thinking settings: on/off (None: the template's default) and the budget."""

    enable: bool | None = None
    budget: int | None = None


def thinking_budget(body: dict, parent: str = "") -> int | None:
    """The Infernix extension `thinking_budget`: an integer >= 0, or absent."""
    budget = f.get_int(body, "thinking_budget", parent)
    if budget is not None and budget < 0:
        path = f.join(parent, "thinking_budget")
        raise InvalidRequest(f"{path} must be >= 0, got {budget}", field=path)
    return budget


def thinking_field(body: dict, effort_path: str) -> str:
    """The request field a worker error about the thinking budget is about: `thinking_budget`
    when given, else the effort that set it."""
    return "thinking_budget" if body.get("thinking_budget") is not None else effort_path


def effort_thinking(effort: Any, path: str) -> Thinking:
    """A reasoning effort as thinking settings (EFFORT_BUDGETS; "none": thinking off)."""
    if effort is None:
        return Thinking()
    if effort == "none":
        return Thinking(enable=False)
    if not isinstance(effort, str) or effort not in EFFORT_BUDGETS:
        raise InvalidRequest(f"{path} must be one of none, {', '.join(EFFORT_BUDGETS)}; got "
                             f"{effort!r}", field=path)
    return Thinking(enable=True, budget=EFFORT_BUDGETS[effort])


def merge_thinking(effort: Thinking, budget: int | None, effort_path: str) -> Thinking:
    """An explicit `thinking_budget` beside an effort: one source of the budget only."""
    if budget is None:
        return effort
    if effort.budget is not None or effort.enable is False:
        raise InvalidRequest(f"give {effort_path} or thinking_budget, not both",
                             field="thinking_budget")
    return Thinking(effort.enable, budget)
