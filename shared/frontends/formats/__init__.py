"""Tool-call formats: one module per format with its literals, rendering and incremental parser.

A Frontend names its model family's format; the grammar service's tool grammar and the worker's
output decoding both read the same module, so what is enforced, rendered and parsed cannot drift.
Only Hermes exists today (the built-in model); the Qwen3.5 XML format joins it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.frontends.formats import hermes


@dataclass(frozen=True)
class ToolFormat:
    framing: str  # the format's id: part of a compiled tool grammar's cache identity
    call_open: str  # the text that opens a call
    render_call: Callable[[str, str], str]  # (name, arguments_json) -> the call's canonical text
    render_tools_section: Callable  # (tools) -> the declarations' text in the system turn
    render_tool_result: Callable[[str], str]  # content -> the text of one tool result
    stream: Callable[..., hermes.ToolStream]  # stream(constrained=bool): a new output decoder


HERMES = ToolFormat(framing=hermes.FRAMING, call_open=hermes.CALL_OPEN,
                    render_call=hermes.render_call,
                    render_tools_section=hermes.render_tools_section,
                    render_tool_result=hermes.render_tool_result, stream=hermes.ToolStream)

__all__ = ["HERMES", "ToolFormat"]
