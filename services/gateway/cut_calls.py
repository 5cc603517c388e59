"""A tool call cut by the token limit: the stream has shown its start and argument fragments, so
the non-streaming reply keeps it too (as OpenAI returns a partial call with finish_reason
`length`), marked as cut so each protocol can say so.

The worker's Finished holds only complete calls; `CallTracker` follows the events of one
generation and, when it ends at the token limit inside a call, adds that call (`CutCall`) after
them. `partial_object` reads a cut call's arguments as far as they go, for protocols whose
arguments are a JSON object rather than text (Anthropic's `input`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from shared.generation import (
    Finished,
    FinishReason,
    GenerationEvent,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)


@dataclass(frozen=True)
class CutCall(ToolCall):
    """A call the token limit cut: `arguments_json` is the published prefix, maybe not JSON."""


def is_cut(call: ToolCall) -> bool:
    return isinstance(call, CutCall)


class CallTracker:
    """The calls one generation's events started, with their argument fragments."""

    def __init__(self) -> None:
        self._calls: dict[int, tuple[str, str, list[str]]] = {}

    def see(self, event: GenerationEvent) -> None:
        if isinstance(event, ToolCallStart):
            self._calls[event.index] = (event.id, event.name, [])
        elif isinstance(event, ToolCallArgumentsDelta) and event.index in self._calls:
            self._calls[event.index][2].append(event.fragment)

    def complete(self, finished: Finished) -> Finished:
        """`finished` with the call the token limit cut after its complete calls, if any."""
        if finished.finish_reason is not FinishReason.LENGTH:
            return finished
        cut = [i for i in sorted(self._calls) if i >= len(finished.tool_calls)]
        if not cut:
            return finished
        call_id, name, fragments = self._calls[cut[0]]
        cut_call = CutCall(call_id, name, "".join(fragments))
        return dataclasses.replace(finished, tool_calls=finished.tool_calls + (cut_call,))


_CLOSERS = {"{": "}", "[": "]"}
_TOKEN_CHARS = frozenset("0123456789+-.eEtruefalsn")  # inside a number or true/false/null


def partial_object(text: str) -> dict[str, Any]:
    """The longest prefix of a cut JSON object's text that closes into an object, `{}` when none
    does. A string, number or literal the cut split is dropped with its member, as the anthropic
    SDK reads a streamed tool input (partial mode), so both replies agree."""
    stack: list[str] = []
    in_string = escaped = False
    cuts: list[tuple[int, str]] = [(0, "")]  # (prefix length outside strings, its closers)
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif ch in "}]" and stack:
            stack.pop()
        after = text[i + 1:i + 2]
        inside_token = ch in _TOKEN_CHARS and after != "" and after in _TOKEN_CHARS
        if not in_string and not inside_token:
            cuts.append((i + 1, "".join(reversed(stack))))
    for length, closers in reversed(cuts):
        try:
            value = json.loads(text[:length] + closers)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}
