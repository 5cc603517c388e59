"""Reading a tool call's arguments cut by the token limit (services/gateway/cut_calls.py): the
non-streaming Anthropic reply must give the same `input` the anthropic SDK reads from the stream
of the same call, so every prefix of an arguments text is checked against the SDK's own partial
reader (jiter in partial mode, what `messages.stream` accumulates with)."""

from __future__ import annotations

import jiter
import pytest

from services.gateway.cut_calls import CallTracker, CutCall, partial_object
from shared.generation import (
    Finished,
    FinishReason,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    Usage,
)

ARGUMENTS = ('{"city": "Par\\u00e9is", "n": 12.5e3, "ok": true, "list": [1, {"b": null, '
             '"c": ["x", false]}], "z": -0.5, "s": "a\\"b\\\\", "e": {}, "f": [], "g": 1e}')


@pytest.mark.parametrize("cut", range(len(ARGUMENTS)))
def test_every_prefix_reads_as_the_sdk_reads_the_stream(cut: int) -> None:
    text = ARGUMENTS[:cut]
    want = jiter.from_json(text.encode(), partial_mode=True) if text else {}
    assert partial_object(text) == want


def test_a_call_cut_by_the_limit_follows_the_complete_ones() -> None:
    """A tool call cut by the token limit shows in the stream, so it is kept after the complete
    calls, marked as cut; a generation that did not end at the limit is left as it was."""
    tracker = CallTracker()
    events = [ToolCallStart(0, "call_a", "ping"), ToolCallArgumentsDelta(0, "{}"),
              ToolCallStart(1, "call_b", "get"), ToolCallArgumentsDelta(1, '{"ci'),
              ToolCallArgumentsDelta(1, 'ty": "Os')]
    for event in events:
        tracker.see(event)
    done = ToolCall("call_a", "ping", "{}")
    cut = tracker.complete(Finished(FinishReason.LENGTH, Usage(1, 9), tool_calls=(done,)))
    assert cut.tool_calls == (done, CutCall("call_b", "get", '{"city": "Os'))
    assert isinstance(cut.tool_calls[1], CutCall) and not isinstance(cut.tool_calls[0], CutCall)
    stopped = Finished(FinishReason.TOOL_CALLS, Usage(1, 9), tool_calls=(done,))
    assert tracker.complete(stopped) is stopped
