"""Anthropic Messages replies: the message object and the streamed event sequence of finished
(or streaming) generations, with Anthropic's stop reasons, ids and usage."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Callable

from services.gateway.choices import Results
from services.gateway.cut_calls import is_cut, partial_object
from services.gateway.generation import PromptCounts
from services.gateway.sse import SSE
from services.gateway.translate import Translated
from shared.errors import InternalError
from shared.generation import (
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)


def stop_reason(finished: Finished) -> str:
    if finished.finish_reason is FinishReason.TOOL_CALLS:
        return "tool_use"
    if finished.finish_reason is FinishReason.LENGTH:
        return "max_tokens"
    return "stop_sequence" if finished.stop_sequence else "end_turn"


def tool_use_id(call_id: str) -> str:
    """Anthropic's tool-use id form (`toolu_...`) of a worker call id; ids already in that form
    are kept, so a client's ids round-trip unchanged."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def _usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    """Anthropic counts prompt tokens read from the cache apart from `input_tokens`."""
    cached = min(cached_tokens, prompt_tokens)
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def aggregate(tr: Translated, results: Results, created: int) -> dict[str, Any]:
    """The message object of a finished generation."""
    finished = results.first
    content: list[dict] = []
    if finished.reasoning:
        content.append(_thinking_block(finished.reasoning))
    if finished.content:
        content.append({"type": "text", "text": finished.content})
    content += [{"type": "tool_use", "id": tool_use_id(c.id), "name": c.name,
                 "input": partial_object(c.arguments_json) if is_cut(c) else
                 _arguments(c.arguments_json)} for c in finished.tool_calls]
    return {"id": tr.request.request_id, "type": "message", "role": "assistant",
            "model": tr.request.model, "content": content, "stop_reason": stop_reason(finished),
            "stop_sequence": finished.stop_sequence,
            "usage": _usage(results.prompt_tokens, results.cached_tokens,
                            results.completion_tokens),
            "infernix": {"constraint": finished.constraint}}


_SIGNATURE_PREFIX = "infernix-sha256:"


def thinking_signature(text: str) -> str:
    """The signature of a thinking block this server publishes: a digest of its text (an
    integrity check that any gateway can repeat, not a secret), so a client that sends the block
    back unchanged, as Anthropic clients do, is accepted and an edited one is told apart."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return _SIGNATURE_PREFIX + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def signature_matches(text: str, signature: str) -> bool:
    """False only for a signature this server issued for another text (others: not ours to
    judge; the reasoning is passed to the chat template either way)."""
    return not signature.startswith(_SIGNATURE_PREFIX) or signature == thinking_signature(text)


def _thinking_block(text: str, signature: str | None = None) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text,
            "signature": thinking_signature(text) if signature is None else signature}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise InternalError("the worker published tool arguments that are not JSON") from None


class Streamer:
    """message_start, content blocks (thinking_delta and its closing signature_delta /
    text_delta / input_json_delta), message_delta with the stop reason, usage and constraint
    report, message_stop; failures as `event: error`."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.blocks = 0  # content blocks opened so far
        self.open: str | None = None  # "text" or "tool_use"
        self.open_call: int | None = None  # the worker's call index of an open tool_use block
        self.counts: Callable[[], PromptCounts | None] = lambda: None
        self.started = False  # message_start sent
        self.thinking = ""  # the text of an open thinking block, for its signature

    @staticmethod
    def _ev(kind: str, **data: Any) -> SSE:
        return SSE({"type": kind, **data}, event=kind)

    def begin(self, counts: Callable[[], PromptCounts | None]) -> list[SSE]:
        """Nothing yet: message_start waits for the first output (or the end), when the
        worker's last Started event has given the prompt's real token count and the prefix
        cache's share of it (the lookup runs when the request gets a lane)."""
        self.counts = counts
        return []

    def _message_start(self) -> list[SSE]:
        if self.started:
            return []
        self.started = True
        counts = self.counts() or PromptCounts()
        message = {"id": self.tr.request.request_id, "type": "message", "role": "assistant",
                   "model": self.tr.request.model, "content": [], "stop_reason": None,
                   "stop_sequence": None,
                   "usage": _usage(counts.prompt_tokens, counts.cached_tokens, 0)}
        return [self._ev("message_start", message=message), self._ev("ping")]

    def _close(self) -> list[SSE]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # its signature, once its text is whole
            out.append(self._ev("content_block_delta", index=self.blocks - 1, delta={
                "type": "signature_delta", "signature": thinking_signature(self.thinking)}))
            self.thinking = ""
        self.open, self.open_call = None, None
        return out + [self._ev("content_block_stop", index=self.blocks - 1)]

    def _start(self, kind: str, block: dict) -> list[SSE]:
        out = self._close()
        self.open = kind
        self.blocks += 1
        return out + [self._ev("content_block_start", index=self.blocks - 1, content_block=block)]

    def event(self, event: Any, choice: int = 0) -> list[SSE]:
        out: list[SSE] = self._message_start()
        if isinstance(event, ReasoningDelta) and event.text:
            if self.open != "thinking":
                out += self._start("thinking", _thinking_block("", signature=""))
            self.thinking += event.text
            out.append(self._ev("content_block_delta", index=self.blocks - 1,
                                delta={"type": "thinking_delta", "thinking": event.text}))
        elif isinstance(event, TextDelta) and event.text:
            if self.open != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(self._ev("content_block_delta", index=self.blocks - 1,
                                delta={"type": "text_delta", "text": event.text}))
        elif isinstance(event, ToolCallStart):
            out += self._start("tool_use", {"type": "tool_use", "id": tool_use_id(event.id),
                                            "name": event.name, "input": {}})
            self.open_call = event.index
        elif isinstance(event, ToolCallArgumentsDelta):
            if self.open_call != event.index:
                raise InternalError(f"arguments for call {event.index} arrived while it was not "
                                    "the open call")
            out.append(self._ev("content_block_delta", index=self.blocks - 1,
                                delta={"type": "input_json_delta", "partial_json": event.fragment}))
        return out

    def choice_done(self, finished: Finished, choice: int = 0) -> list[SSE]:
        return []

    def finish(self, results: Results) -> list[SSE]:
        finished = results.first
        usage = _usage(results.prompt_tokens, results.cached_tokens, results.completion_tokens)
        return self._message_start() + self._close() + [
            self._ev("message_delta", delta={"stop_reason": stop_reason(finished),
                                             "stop_sequence": finished.stop_sequence},
                     usage=usage, infernix={"constraint": finished.constraint}),
            self._ev("message_stop")]

    def fail(self, error_body: dict) -> list[SSE]:
        return [SSE(error_body, event="error")]
