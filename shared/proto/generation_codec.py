"""The generation contract <-> worker.proto messages, lossless in both directions.

`request_to_proto` / `request_from_proto` carry every field of `GenerateRequest` (prompt messages
with their tool calls, tools, the constraint, tool choice, sampling, stop, timeout, logprobs);
`event_to_proto` / `event_from_proto` carry every event type. Optional fields use protobuf
presence, so `None` and `()` / `""` / `0` stay distinct. The constraint report and the error dict
travel as JSON text (a Struct would turn integers into floats); timings as a map of doubles.

Decoding rebuilds the frozen dataclasses through their constructors, so their own checks run again
on the receiving side: a request that fails them raises the same typed error it would in process.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, TypeVar

from shared.contract import (
    ConstraintKind,
    OutputConstraint,
    ToolChoice,
    ToolConstraints,
    ToolDefinition,
    ToolMode,
)
from shared.errors import InternalError, InvalidRequest
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    GenerationEvent,
    PromptInput,
    ReasoningDelta,
    RequestOptions,
    SamplingParams,
    Started,
    TextDelta,
    TokenLogprob,
    TokenLogprobs,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    TopLogprob,
    Usage,
)
from shared.proto import worker_pb2 as pb

_INT64 = (-(2**63), 2**63 - 1)
E = TypeVar("E", bound=Enum)


def _int64(value: int, field: str) -> int:
    if not _INT64[0] <= value <= _INT64[1]:
        raise InvalidRequest(f"{field} must be a 64-bit signed integer, got {value}", field=field)
    return value


def _enum(cls: type[E], value: str, field: str) -> E:
    try:
        return cls(value)
    except ValueError:
        raise InvalidRequest(f"unknown {field} {value!r}; expected one of "
                             f"{', '.join(m.value for m in cls)}", field=field) from None


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


# ---- request -------------------------------------------------------------------------------

def sampling_to_proto(s: SamplingParams) -> pb.SamplingParams:
    out = pb.SamplingParams(
        temperature=s.temperature, top_p=s.top_p, top_k=_int64(s.top_k, "top_k"), min_p=s.min_p,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty)
    if s.seed is not None:
        out.seed = _int64(s.seed, "seed")
    return out


def sampling_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=msg.temperature, top_p=msg.top_p, top_k=msg.top_k, min_p=msg.min_p,
        seed=_opt(msg, "seed"), presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty, repetition_penalty=msg.repetition_penalty)


def constraint_to_proto(c: OutputConstraint) -> pb.OutputConstraint:
    return pb.OutputConstraint(kind=c.kind.value, source=c.source, choices=list(c.choices))


def constraint_from_proto(msg: pb.OutputConstraint) -> OutputConstraint:
    # The plain constructor, not the class methods: the sender already canonicalised the source.
    return OutputConstraint(_enum(ConstraintKind, msg.kind, "constraint.kind"), msg.source,
                            tuple(msg.choices))


def tool_choice_to_proto(c: ToolChoice) -> pb.ToolChoice:
    out = pb.ToolChoice(mode=c.mode.value, parallel=c.parallel, constraints=c.constraints.value)
    if c.allowed_names is not None:
        out.allowed_names.CopyFrom(pb.NameList(names=list(c.allowed_names)))
    return out


def tool_choice_from_proto(msg: pb.ToolChoice) -> ToolChoice:
    names = tuple(msg.allowed_names.names) if msg.HasField("allowed_names") else None
    return ToolChoice(_enum(ToolMode, msg.mode, "tool_choice.mode"), names, msg.parallel,
                      _enum(ToolConstraints, msg.constraints, "tool_choice.constraints"))


def options_to_proto(o: RequestOptions) -> pb.RequestOptions:
    out = pb.RequestOptions(
        sampling=sampling_to_proto(o.sampling), tool_choice=tool_choice_to_proto(o.tool_choice),
        stop=list(o.stop), stop_token_ids=[_int64(t, "stop_token_ids") for t in o.stop_token_ids])
    if o.max_tokens is not None:
        out.max_tokens = _int64(o.max_tokens, "max_tokens")
    if o.constraint is not None:
        out.constraint.CopyFrom(constraint_to_proto(o.constraint))
    if o.timeout_s is not None:
        out.timeout_s = o.timeout_s
    if o.thinking_budget is not None:
        out.thinking_budget = _int64(o.thinking_budget, "thinking_budget")
    if o.logprobs is not None:
        out.logprobs = _int64(o.logprobs, "top_logprobs")
    return out


def options_from_proto(msg: pb.RequestOptions) -> RequestOptions:
    return RequestOptions(
        max_tokens=_opt(msg, "max_tokens"),
        sampling=(sampling_from_proto(msg.sampling) if msg.HasField("sampling")
                  else SamplingParams()),
        constraint=constraint_from_proto(msg.constraint) if msg.HasField("constraint") else None,
        tool_choice=(tool_choice_from_proto(msg.tool_choice) if msg.HasField("tool_choice")
                     else ToolChoice()),
        stop=tuple(msg.stop), stop_token_ids=tuple(msg.stop_token_ids),
        timeout_s=_opt(msg, "timeout_s"), thinking_budget=_opt(msg, "thinking_budget"),
        logprobs=_opt(msg, "logprobs"))


def tool_to_proto(t: ToolDefinition) -> pb.ToolDefinition:
    return pb.ToolDefinition(name=t.name, parameters_json=t.parameters_json,
                             description=t.description, strict=t.strict)


def tool_from_proto(msg: pb.ToolDefinition) -> ToolDefinition:
    return ToolDefinition(msg.name, msg.parameters_json, _opt(msg, "description"), msg.strict)


def tool_call_to_proto(c: ToolCall) -> pb.ToolCall:
    return pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json)


def tool_call_from_proto(msg: pb.ToolCall) -> ToolCall:
    return ToolCall(msg.id, msg.name, msg.arguments_json)


def message_to_proto(m: ChatMessage) -> pb.ChatMessage:
    return pb.ChatMessage(role=m.role, content=m.content, name=m.name,
                          tool_calls=[tool_call_to_proto(c) for c in m.tool_calls],
                          tool_call_id=m.tool_call_id, reasoning=m.reasoning)


def message_from_proto(msg: pb.ChatMessage) -> ChatMessage:
    return ChatMessage(msg.role, _opt(msg, "content"),
                       tuple(tool_call_from_proto(c) for c in msg.tool_calls),
                       _opt(msg, "tool_call_id"), _opt(msg, "name"), _opt(msg, "reasoning"))


def prompt_to_proto(p: PromptInput) -> pb.PromptInput:
    out = pb.PromptInput(tools=[tool_to_proto(t) for t in p.tools],
                         continue_final_assistant=p.continue_final_assistant,
                         enable_thinking=p.enable_thinking, source=p.source)
    if p.token_ids is not None:  # ids outside int64 are named at their place in the body
        out.token_ids.CopyFrom(pb.TokenList(
            ids=[_int64(t, f"{p.source}[{i}]") for i, t in enumerate(p.token_ids)]))
    elif p.messages is not None:
        out.messages.CopyFrom(pb.MessageList(messages=[message_to_proto(m) for m in p.messages]))
    else:
        out.text = p.text or ""
    return out


def prompt_from_proto(msg: pb.PromptInput) -> PromptInput:
    which = msg.WhichOneof("input")
    messages = (tuple(message_from_proto(m) for m in msg.messages.messages)
                if which == "messages" else None)
    text = msg.text if which == "text" else None
    token_ids = tuple(msg.token_ids.ids) if which == "token_ids" else None
    return PromptInput(messages, text, tuple(tool_from_proto(t) for t in msg.tools),
                       msg.continue_final_assistant, _opt(msg, "enable_thinking"),
                       token_ids=token_ids, source=msg.source or "prompt")


def request_to_proto(r: GenerateRequest) -> pb.GenerateRequest:
    """The protobuf form of `r`. Raises InvalidRequest(field=...) for an integer (seed, top_k,
    max_tokens, stop_token_ids) outside the signed 64-bit range."""
    return pb.GenerateRequest(request_id=r.request_id, prompt=prompt_to_proto(r.prompt),
                              options=options_to_proto(r.options), model=r.model)


def request_from_proto(msg: pb.GenerateRequest) -> GenerateRequest:
    """The GenerateRequest `msg` carries. Raises the contract's typed errors (InvalidRequest for
    an unknown enum value, a missing prompt or an out-of-range option)."""
    if not msg.HasField("prompt"):
        raise InvalidRequest("the request has no prompt", field="prompt")
    options = options_from_proto(msg.options) if msg.HasField("options") else RequestOptions()
    return GenerateRequest(msg.request_id, prompt_from_proto(msg.prompt), options, msg.model)


# ---- events --------------------------------------------------------------------------------

def _json_or_none(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def finished_to_proto(f: Finished) -> pb.Finished:
    return pb.Finished(
        finish_reason=f.finish_reason.value,
        usage=pb.Usage(prompt_tokens=f.usage.prompt_tokens,
                       completion_tokens=f.usage.completion_tokens,
                       cached_tokens=f.usage.cached_tokens,
                       reasoning_tokens=f.usage.reasoning_tokens),
        content=f.content, tool_calls=[tool_call_to_proto(c) for c in f.tool_calls],
        constraint_json=_json_or_none(f.constraint), error_json=_json_or_none(f.error),
        timings=dict(f.timings), stop_sequence=f.stop_sequence, reasoning=f.reasoning)


def finished_from_proto(msg: pb.Finished) -> Finished:
    constraint, error = _opt(msg, "constraint_json"), _opt(msg, "error_json")
    return Finished(
        _enum(FinishReason, msg.finish_reason, "finish_reason"),
        Usage(msg.usage.prompt_tokens, msg.usage.completion_tokens,
              cached_tokens=msg.usage.cached_tokens, reasoning_tokens=msg.usage.reasoning_tokens),
        content=msg.content, tool_calls=tuple(tool_call_from_proto(c) for c in msg.tool_calls),
        constraint=None if constraint is None else json.loads(constraint),
        error=None if error is None else json.loads(error),
        timings=dict(msg.timings), stop_sequence=_opt(msg, "stop_sequence"),
        reasoning=msg.reasoning)


def logprobs_to_proto(event: TokenLogprobs) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(tokens=[
        pb.TokenLogprob(token_id=t.token_id, token=t.token, logprob=t.logprob,
                        top=[pb.TopLogprob(token_id=a.token_id, token=a.token, logprob=a.logprob)
                             for a in t.top]) for t in event.tokens])


def logprobs_from_proto(msg: pb.TokenLogprobs) -> TokenLogprobs:
    return TokenLogprobs(tuple(
        TokenLogprob(t.token_id, t.token, t.logprob,
                     tuple(TopLogprob(a.token_id, a.token, a.logprob) for a in t.top))
        for t in msg.tokens))


def event_to_proto(event: GenerationEvent) -> pb.GenerationEvent:
    """The protobuf form of one event. Raises InternalError for an object that is not one."""
    if isinstance(event, Started):
        return pb.GenerationEvent(started=pb.Started(prompt_tokens=event.prompt_tokens,
                                                     cached_tokens=event.cached_tokens))
    if isinstance(event, TextDelta):
        return pb.GenerationEvent(text=pb.TextDelta(text=event.text))
    if isinstance(event, ReasoningDelta):
        return pb.GenerationEvent(reasoning=pb.ReasoningDelta(text=event.text))
    if isinstance(event, ToolCallStart):
        return pb.GenerationEvent(tool_call_start=pb.ToolCallStart(
            index=event.index, id=event.id, name=event.name))
    if isinstance(event, ToolCallArgumentsDelta):
        return pb.GenerationEvent(tool_call_arguments=pb.ToolCallArgumentsDelta(
            index=event.index, fragment=event.fragment))
    if isinstance(event, TokenLogprobs):
        return pb.GenerationEvent(logprobs=logprobs_to_proto(event))
    if isinstance(event, Finished):
        return pb.GenerationEvent(finished=finished_to_proto(event))
    raise InternalError(f"not a generation event: {type(event).__name__}")


def event_from_proto(msg: pb.GenerationEvent) -> GenerationEvent:
    """The event `msg` carries. Raises InternalError for an empty or malformed event (the
    worker's fault, never the caller's)."""
    which = msg.WhichOneof("event")
    try:
        if which == "started":
            return Started(msg.started.prompt_tokens, msg.started.cached_tokens)
        if which == "text":
            return TextDelta(msg.text.text)
        if which == "reasoning":
            return ReasoningDelta(msg.reasoning.text)
        if which == "tool_call_start":
            m = msg.tool_call_start
            return ToolCallStart(m.index, m.id, m.name)
        if which == "tool_call_arguments":
            m = msg.tool_call_arguments
            return ToolCallArgumentsDelta(m.index, m.fragment)
        if which == "logprobs":
            return logprobs_from_proto(msg.logprobs)
        if which == "finished":
            return finished_from_proto(msg.finished)
    except (InvalidRequest, ValueError) as exc:
        raise InternalError(f"the worker sent a malformed event: {exc}") from None
    raise InternalError("the worker sent an empty event")
