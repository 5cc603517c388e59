"""Tool-call formats: one module per format with its literals, rendering and incremental parser.

A Frontend names its model family's format; the grammar service's tool grammar and the worker's
output decoding both read the same module, so what is enforced, rendered and parsed cannot drift.

- Hermes (hermes.py): the built-in SmolLM2's; the opener `<tool_call>` is text.
- Qwen XML (qwen_xml.py, qwen_xml_stream.py): Qwen3.5's; the opener and closer are control
  tokens, named by id in grammars and received by the decoder as `Control` pieces.

A format's stream is built as `stream(constrained=bool, codings=..., union=bool)` (`union`: the
constrained output is JSON content OR calls, so a call opens only at its start) and fed pieces
(`str` or `Control`, shared/frontends/pieces.py) with `feed`, then `finish(complete=)`; it returns
protocol events and afterwards holds `tool_calls()` and `text()`. `codings` (tool name ->
`qwen_xml.ArgumentCoding`) is the value-decoding contract of a format whose values need one;
Hermes ignores it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.frontends.formats import hermes, qwen_xml, qwen_xml_stream


@dataclass(frozen=True)
class ToolFormat:
    framing: str  # the format's id: part of a compiled tool grammar's cache identity
    call_open: str  # the spelling of the text or control token that opens a call
    opener_is_token: bool  # True: the opener is a control token, matched by id only
    render_call: Callable[[str, str], str]  # (name, arguments_json) -> the call's canonical text
    stream: Callable  # stream(constrained=bool, codings=None, union=False): a new output decoder
    # The declarations' text in the system turn and one tool result's text, for renderers that
    # write them themselves (ChatML); None where the model's chat template writes them.
    render_tools_section: Callable | None = None
    render_tool_result: Callable[[str], str] | None = None


HERMES = ToolFormat(framing=hermes.FRAMING, call_open=hermes.CALL_OPEN, opener_is_token=False,
                    render_call=hermes.render_call, stream=hermes.ToolStream,
                    render_tools_section=hermes.render_tools_section,
                    render_tool_result=hermes.render_tool_result)
QWEN_XML = ToolFormat(framing=qwen_xml.FRAMING, call_open=qwen_xml.CALL_OPEN, opener_is_token=True,
                      render_call=qwen_xml.render_call, stream=qwen_xml_stream.ToolStream)
FORMATS = {f.framing: f for f in (HERMES, QWEN_XML)}

__all__ = ["FORMATS", "HERMES", "QWEN_XML", "ToolFormat"]
