"""Tool-call formats: one module per format with its literals, rendering and incremental parser.

A Frontend names its model family's format; the grammar service's tool grammar and the worker's
output decoding both read the same module, so what is enforced, rendered and parsed cannot drift.

- Hermes (hermes.py): the built-in SmolLM2's; the opener `<tool_call>` is text.
- Qwen XML (qwen_xml.py, qwen_xml_stream.py): Qwen3.5's; the opener and closer are control
  tokens, named by id in grammars and received by the decoder as `Control` pieces.

A format's stream (a `ToolStream`) is built as `stream(constrained=bool, codings=...,
union=bool)` (`union`: the constrained output is JSON content OR calls, so a call opens only at
its start) and fed content pieces (`str` or `Control`, shared/frontends/pieces.py) with `feed`, then
`finish(complete=)`; it returns protocol events and afterwards holds `tool_calls()` and `text()`.
`codings` (tool name -> `qwen_xml.ArgumentCoding`) is the value-decoding contract of a format
whose values need one (`coded_arguments`); Hermes ignores it. What differs between formats is
the format's to say, so that the worker names none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from shared.frontends.formats import hermes, qwen_xml, qwen_xml_stream
from shared.frontends.pieces import Piece
from shared.generation import GenerationEvent, ToolCall


@runtime_checkable
class ToolStream(Protocol):
    """One request's call decoder, built by `ToolFormat.stream` (see the module docstring)."""

    constrained: bool  # a tool grammar enforces the calls (False: tools declared, free output)

    @property
    def branch(self) -> str:
        """"tools", "content" or "undecided" so far (the constraint report's branch)."""

    def feed(self, piece: Piece) -> Sequence[GenerationEvent]:
        """Read one published content piece; the events it completes."""

    def finish(self, *, complete: bool) -> Sequence[GenerationEvent]:
        """End of output (`complete`: the language ended normally); the last events."""

    def forget_content(self) -> None:
        """Drop the content read so far (a continued prefix: read, never published)."""

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls read, after `finish`."""

    def text(self) -> str:
        """The content published outside calls."""


@dataclass(frozen=True)
class ToolFormat:
    framing: str  # the format's id: part of a compiled tool grammar's cache identity
    call_open: str  # the spelling of the text or control token that opens a call
    opener_is_token: bool  # True: the opener is a control token, matched by id only
    render_call: Callable[[str, str], str]  # (name, arguments_json) -> the call's canonical text
    stream: Callable[..., ToolStream]  # stream(constrained=, codings=, union=): a new decoder
    # The declarations' text in the system turn and one tool result's text, for renderers that
    # write them themselves (ChatML); None where the model's chat template writes them.
    render_tools_section: Callable | None = None
    render_tool_result: Callable[[str], str] | None = None
    # True: a call's argument values are bare text, decoded by each tool's declared parameters
    # (`codings`: the grammar service's argument_codings, the contract its grammar was built
    # from); False: the arguments are JSON text (Hermes), no codings.
    coded_arguments: bool = False
    # The (open, close) control tokens of a call inside which a non-strict tool's argument names
    # must not repeat (the grammar service's ParameterNameConstraint); None: the format needs no
    # name constraint (Hermes' arguments are one JSON object, whose member names the grammar
    # service's JSON name companion keeps unique, as it does for JSON-valued XML parameters).
    name_guard: tuple[str, str] | None = None


HERMES = ToolFormat(framing=hermes.FRAMING, call_open=hermes.CALL_OPEN, opener_is_token=False,
                    render_call=hermes.render_call, stream=hermes.ToolStream,
                    render_tools_section=hermes.render_tools_section,
                    render_tool_result=hermes.render_tool_result)
QWEN_XML = ToolFormat(framing=qwen_xml.FRAMING, call_open=qwen_xml.CALL_OPEN, opener_is_token=True,
                      render_call=qwen_xml.render_call, stream=qwen_xml_stream.ToolStream,
                      coded_arguments=True, name_guard=(qwen_xml.CALL_OPEN, qwen_xml.CALL_CLOSE))
FORMATS = {f.framing: f for f in (HERMES, QWEN_XML)}

__all__ = ["FORMATS", "HERMES", "QWEN_XML", "ToolFormat", "ToolStream"]
