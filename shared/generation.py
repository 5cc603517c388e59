"""The generation contract between the gateway and the worker: requests in, events out.

Protocol translation (OpenAI Chat / Responses, Anthropic Messages, completions) produces a
`GenerateRequest`; the worker answers with a stream of `GenerationEvent`s that always ends with
exactly one `Finished`. Plain data, no third-party types: the same objects travel in process and
(as protobuf) over gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

from shared.contract import OutputConstraint, ToolChoice, ToolDefinition
from shared.errors import InvalidRequest


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (ties to the smaller id)
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # [0, 1)
    seed: int | None = None  # None: drawn per request
    presence_penalty: float = 0.0  # [-2, 2], OpenAI semantics
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0, 1 = off

    def __post_init__(self) -> None:
        checks = [
            ("temperature", 0.0 <= self.temperature <= 100.0, "between 0 and 100"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("min_p", 0.0 <= self.min_p < 1.0, "in [0, 1)"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "between -2 and 2"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "between -2 and 2"),
            ("repetition_penalty", self.repetition_penalty > 0.0, "> 0"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise InvalidRequest(f"{name} must be {expected}, got {getattr(self, name)!r}",
                                     field=name)


MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's bound)


@dataclass(frozen=True)
class RequestOptions:
    max_tokens: int | None = None  # None: until the context is full
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constraint: OutputConstraint | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    stop: tuple[str, ...] = ()  # stop strings (rejected for constrained requests)
    stop_token_ids: tuple[int, ...] = ()  # extra stop ids (rejected for constrained requests)
    timeout_s: float | None = None  # deadline from submission
    # Output tokens the reasoning (thinking) phase may take before the worker forces its close;
    # None: no budget (the output budget alone). Only meaningful while thinking is on.
    thinking_budget: int | None = None
    # Log-probabilities of the output tokens: None = off; n = each token's log-probability and
    # its n most likely alternatives (0..MAX_TOP_LOGPROBS), as `TokenLogprobs` events.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest(
                f"max_tokens must be >= 1, got {self.max_tokens}", field="max_tokens"
            )
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise InvalidRequest(f"thinking_budget must be >= 0, got {self.thinking_budget}",
                                 field="thinking_budget")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise InvalidRequest("timeout must be positive", field="timeout")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got "
                                 f"{self.logprobs}", field="top_logprobs")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str  # the complete arguments object as JSON text


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # for role "tool"
    name: str | None = None
    reasoning: str | None = None  # an assistant turn's reasoning (templates read reasoning_content)


@dataclass(frozen=True)
class PromptInput:
    """Chat messages (rendered by the model's chat template), raw text to continue, or raw token
    ids to continue (exactly one)."""

    messages: tuple[ChatMessage, ...] | None = None
    text: str | None = None
    tools: tuple[ToolDefinition, ...] = ()
    continue_final_assistant: bool = False
    # Thinking on/off for templates with a thinking mode (the template's `enable_thinking`, as
    # vLLM/SGLang clients send it in chat_template_kwargs); None: the template's own default.
    enable_thinking: bool | None = None
    token_ids: tuple[int, ...] | None = None
    # Where the prompt sits in the client's body: an id outside the vocabulary is named
    # `{source}[position]` (a completions batch of id lists gives each its own `prompt[i]`).
    source: str = "prompt"

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.messages, self.text, self.token_ids)]
        if sum(given) != 1:
            raise InvalidRequest("give either messages, a raw text prompt or token ids",
                                 field="prompt")


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt: PromptInput
    options: RequestOptions = field(default_factory=RequestOptions)
    model: str = "smollm2"


class FinishReason(str, Enum):
    STOP = "stop"  # EOS / stop condition; for constrained output: ended normally
    LENGTH = "length"  # max_tokens or context exhausted
    TOOL_CALLS = "tool_calls"  # the turn ended with tool calls
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (<= prompt_tokens)
    reasoning_tokens: int = 0  # of completion_tokens: reasoning, its close token included


@dataclass(frozen=True)
class Started:
    """The first event of every generation, sent once the worker has prepared and queued the
    request: the prompt's token count (and how many of them a prefix cache held). A worker with a
    prefix cache sends it again when the request first gets a lane, with the cached count its
    lookup found, before any output event; the last one received holds."""

    prompt_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str  # reasoning (thinking) text; concatenated deltas are the turn's reasoning


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    fragment: str  # concatenated fragments of one call equal its final arguments_json


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: bytes  # the token's raw bytes (a special token: its spelling)
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability under the distribution it was sampled from (or, with
    the worker's raw logprobs mode, the model's own), with the most likely alternatives in
    descending order (ties: the smaller id first)."""

    token_id: int
    token: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class TokenLogprobs:
    """The log-probabilities of the content tokens committed in one step, sent (when the request
    asked for them) before the step's text: one entry per content token in output order, reasoning
    tokens, forced controls and the EOS token left out. Stop strings regroup text, so the entries
    align with tokens, not with text deltas."""

    tokens: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    usage: Usage
    content: str = ""  # the whole published content
    reasoning: str = ""  # the whole published reasoning (thinking) text; "" without thinking
    tool_calls: tuple[ToolCall, ...] = ()
    constraint: dict[str, Any] | None = None  # the constraint report, when a matcher was enabled
    error: dict[str, Any] | None = None  # InfernixError.to_dict() when finish_reason is ERROR
    timings: dict[str, float] = field(default_factory=dict)  # seconds: prepare, queue, ttft, decode
    stop_sequence: str | None = None  # the stop string that ended the output (Anthropic reports it)
    # Every TokenLogprobs entry of the generation, in order, when the request asked for them (the
    # gateway's Generation gathers them from the events; None: not asked).
    logprobs: tuple[TokenLogprob, ...] | None = None


GenerationEvent = Union[Started, TextDelta, ReasoningDelta, ToolCallStart, ToolCallArgumentsDelta,
                        TokenLogprobs, Finished]


class WorkerClient:
    """What the gateway needs from a worker; in-process and gRPC implementations share it.

    `generate` yields events, a `Started` first, and always ends with one `Finished` (errors after
    submission arrive as
    `Finished(ERROR)`); request errors found before generation starts (bad schema, conflicting
    constraints) raise the typed `RequestError` from `generate` before the first event.
    """

    async def models(self) -> list[str]:
        raise NotImplementedError

    def generate(self, request: GenerateRequest):  # -> AsyncIterator[GenerationEvent]
        raise NotImplementedError

    async def cancel(self, request_id: str) -> None:
        raise NotImplementedError

    async def count_tokens(self, prompt: PromptInput, model: str) -> int:
        raise NotImplementedError

    async def health(self) -> dict[str, Any]:
        raise NotImplementedError

    async def drain(self, seconds: float) -> None:
        """Let the requests in flight finish within `seconds`, then cancel the rest (each ends with
        its terminal event). The caller has stopped sending new requests. Default: nothing in
        flight to wait for."""

    async def aclose(self) -> None:
        """Release what the client holds (connections, an in-process engine)."""
