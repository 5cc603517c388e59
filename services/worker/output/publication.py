"""What one request publishes: its committed output tokens read by the Frontend's phase decoder,
then stop strings (content only) and the tool-call stream of the model's format.

Design document ("Qwen output phases"): "The Frontend owns Qwen's output-phase rules, and the
grammar and the OutputSession's publication decoder use the same rules. The runtime does not guess
with separate booleans whether thinking ended." The phase decoder (shared/frontends/thinking.py)
turns committed token ids into `ReasoningDelta` events and content pieces (`str` text, `Control`
for a control token); the same decoder runs for constrained and unconstrained requests, so
reasoning and content split the same way with and without a constraint. Content pieces then pass
through the request's stop strings and its tool stream (which reads the call opener by token id
where the format makes it a control token: ConstrainedToolStream for a tool grammar, the free
reader otherwise); content bytes after the thinking separator publish as generated.

Only committed tokens are fed (after the Program commit and the session's confirm), so nothing
here is ever rolled back. A continued final assistant message (`continue_from`) is read first and
not published ("Only the new suffix is published"), except the head of a call the prefix leaves
unfinished: its start and argument fragments so far go out with the first events, so that the
streamed fragments still concatenate to the call's arguments. `feed` and `finish` return the
protocol events in order; afterwards `content()`, `reasoning()` and `tool_calls()` hold the
aggregate result, which the streamed events concatenate to by construction.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Sequence

from services.worker.output.stop_strings import StopStrings
from shared.frontends.pieces import Control
from shared.frontends.thinking import PhaseDecoder
from shared.generation import (
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

if TYPE_CHECKING:
    from shared.frontends.formats import ToolStream


class Publication:
    """One request's output decoder (see the module docstring).

    `phases`: the Frontend's phase decoder for where the output starts. `stop`: stop strings of an
    unconstrained request (matched on content). `tools`: the tool stream when tools are active."""

    def __init__(self, phases: PhaseDecoder, *, stop: StopStrings | None = None,
                 tools: "ToolStream | None" = None) -> None:
        self.phases = phases
        self.stop = stop
        self.tools = tools
        self._content: list[str] = []  # published content (without a tool stream)
        self._reasoning: list[str] = []
        self.reasoning_tokens = 0  # committed tokens read in reasoning (the close token included)
        self._pending: list[GenerationEvent] = []  # an unfinished continued call's head

    # ---------------------------------------------------------------- state

    @property
    def in_reasoning(self) -> bool:
        return self.phases.in_reasoning

    @property
    def stopped(self) -> bool:
        """A stop string completed: the request stops."""
        return self.stop is not None and self.stop.stopped

    @property
    def branch(self) -> str | None:
        """The tool stream's publication branch ("undecided" | "content" | "tools"), if any."""
        return self.tools.branch if self.tools is not None else None

    def would_stop(self, tokens: Sequence[int]) -> bool:
        """Feeding `tokens` would complete a stop string (nothing here changes): a verification
        round keeps only the shortest prefix that does, as one-token decoding would."""
        if self.stop is None or self.stopped:
            return False
        shared = {id(self.phases.domain): self.phases.domain,
                  id(self.phases.thinking): self.phases.thinking}
        phases, stop = copy.deepcopy(self.phases, shared), copy.deepcopy(self.stop)
        for t in tokens:
            for piece in phases.feed((t,)):
                if isinstance(piece, ReasoningDelta):
                    continue
                if isinstance(piece, Control):
                    if self.tools is not None:  # the tool stream takes it; held text flushes
                        stop.flush()
                        continue
                    piece = piece.spelling
                stop.feed(piece)
                if stop.stopped:
                    return True
        return False

    def forced_close(self) -> tuple[int, ...]:
        """The close sequence a thinking budget forces now; () outside reasoning."""
        return self.phases.forced_close()

    # ---------------------------------------------------------------- input

    def continue_from(self, tokens: Sequence[int]) -> None:
        """Read the continued content `tokens` (the Frontend's continuation tokens) without
        publishing it. Only a tool stream keeps state from it; its content stays unpublished."""
        if self.tools is None:
            return
        events: list[GenerationEvent] = []
        for piece in self.phases.feed(tokens):
            if not isinstance(piece, ReasoningDelta):
                events += self.tools.feed(piece)
        self.tools.forget_content()
        self._pending = [
            e for e in events if isinstance(e, (ToolCallStart, ToolCallArgumentsDelta))
        ]

    def feed(self, tokens: Sequence[int]) -> list[GenerationEvent]:
        """Events of newly committed output tokens (EOS ids publish nothing)."""
        events, self._pending = self._pending, []
        phases = self.phases
        plain = self.stop is None and self.tools is None  # content text publishes as it comes
        for t in tokens:
            if plain:  # an ordinary ASCII token of content text: published as it is
                text = phases.content_text(t)
                if text is not None:
                    if text:
                        self._content.append(text)
                        events.append(TextDelta(text))
                    continue
            if phases.in_reasoning:
                self.reasoning_tokens += 1
            for piece in phases.feed_token(t):
                if plain and piece.__class__ is str:  # `_piece` of plain text, one call less
                    if not piece:
                        continue
                    self._content.append(piece)
                    events.append(TextDelta(piece))
                else:
                    self._piece(piece, events)
        return events

    def finish(self, *, complete: bool) -> list[GenerationEvent]:
        """Flush what is held at the end of the output: an unfinished character (as U+FFFD),
        stop-string look-behind, the tool stream's last events. `complete`: the output ended
        normally (EOS). Raises InternalError when the tool stream finds a constrained call it
        cannot read (an implementation inconsistency, never content)."""
        events, self._pending = self._pending, []
        for piece in self.phases.finish():
            self._piece(piece, events)
        if self.stop is not None:
            self._content_text(self.stop.flush(), events)
        if self.tools is not None:
            events += self.tools.finish(complete=complete)
        return events

    def _piece(self, piece, events: list) -> None:
        if isinstance(piece, ReasoningDelta):
            self._reasoning.append(piece.text)
            events.append(piece)
            return
        if self.stopped:
            return
        if isinstance(piece, Control):
            if self.tools is not None:
                if self.stop is not None:  # text held for a stop string goes first
                    self._content_text(self.stop.flush(), events)
                events += self.tools.feed(piece)
                return
            piece = piece.spelling  # no tool stream: a control token displays as spelled
        if self.stop is not None:
            piece = self.stop.feed(piece)
        self._content_text(piece, events)

    def _content_text(self, text: str, events: list) -> None:
        if not text:
            return
        if self.tools is not None:
            events += self.tools.feed(text)
            return
        self._content.append(text)
        events.append(TextDelta(text))

    # ---------------------------------------------------------------- results

    def content(self) -> str:
        return self.tools.text() if self.tools is not None else "".join(self._content)

    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.tools.tool_calls() if self.tools is not None else ()
