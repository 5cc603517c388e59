"""The output decoder of the Qwen3.5 XML tool format (literals and value rules: qwen_xml.py).

Input: the content pieces of the phase decoder (shared/frontends/thinking.py): `str` text and
`Control` pieces, one per control token, so the call opener `<tool_call>` and closer
`</tool_call>` reach the reader by token id; a spelled `<tool_call>` is text.

Constrained route (a tool grammar enforces the canonical framing): the reader consumes the output
once as it is generated and publishes each call's arguments in fragments that concatenate to its
final `arguments_json` (design document, ConstrainedToolStream): `{"K": ` when a parameter name
closes, a string value as its JSON string while it arrives, a strict JSON value verbatim, and a
non-strict value whose JSON depends on all of it when its parameter closes; `}` when the call
closes. Text that could still be the value delimiter is held back until it is decided. Content
before the first call streams as it comes, except up to two trailing line breaks, which are the
template's framing before a call (published if no call follows). Any deviation from the framing
is an implementation inconsistency (InternalError), never content.

Free route (tools declared, nothing enforced): content streams until the first opener token; the
rest is read at the end the way vLLM's qwen3_coder parser reads it (a value ends at
`</parameter>`, the next `<parameter=` or `</function>`; one leading and one trailing newline
stripped; values converted by the declared types); a call that cannot be read, or names an
undeclared tool, stays content as its text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Mapping

from shared.errors import InternalError
from shared.frontends.formats.qwen_xml import (
    CALL_CLOSE,
    CALL_HEAD,
    CALL_OPEN,
    CALL_SEPARATOR,
    CALL_TAIL,
    PARAM_OPEN,
    VALUE_END,
    ArgumentCoding,
    Call,
    convert_value,
)
from shared.frontends.pieces import Control, Piece, piece_text
from shared.generation import TextDelta, ToolCall, ToolCallArgumentsDelta, ToolCallStart

_HELD_NEWLINES = 2  # "\n\n" before a call is the template's framing


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _escaped(text: str) -> str:
    """`text` as the inside of a JSON string (per-character escaping: fragments concatenate)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class ToolStream:
    """Feed content pieces with `feed`, end with `finish`; both return protocol events.

    `codings`: tool name -> ArgumentCoding (the value-decoding contract the grammar was built
    from); a tool without one decodes with no declared types."""

    def __init__(self, *, constrained: bool, codings: Mapping[str, ArgumentCoding] | None = None,
                 union: bool = False) -> None:
        # `union` (JSON content OR calls) changes nothing here: the opener is a control token,
        # which JSON content never holds.
        self.constrained = constrained
        self.codings = dict(codings or {})
        self.state = "content"  # content, then the call states below
        self.buf = ""  # text of the current state not yet consumed
        self.held = ""  # content: trailing newlines held back
        self.content: list[str] = []
        self.calls: list[Call] = []
        self.free_tail: list[Piece] = []  # free route: everything from the first opener on
        self._param = ""  # the current parameter's name
        self._text: list[str] = []  # the current value's text so far

    @property
    def branch(self) -> str:
        if self.calls or self.state != "content" or self.free_tail:
            return "tools"
        return "content" if self.content or self.held else "undecided"

    # -- input ---------------------------------------------------------------------------------
    def feed(self, piece: Piece) -> list:
        events: list = []
        if self.free_tail:
            self.free_tail.append(piece)
            return events
        if isinstance(piece, Control):
            self._control(piece, events)
            return events
        if self.state == "content":
            self._content_text(piece, events)
            return events
        self.buf += piece
        while self.buf:
            before = (self.state, len(self.buf))
            getattr(self, "_" + self.state)(events)
            if (self.state, len(self.buf)) == before:
                break  # waiting for more text
        return events

    def _control(self, piece: Control, events: list) -> None:
        if piece.spelling == CALL_OPEN and self.state in ("content", "next") and not self.buf:
            if self.state == "content":
                self.held = ""  # the framing before the call
                if not self.constrained:
                    self.free_tail.append(piece)
                    return
            self.calls.append(Call(_new_id()))
            self.state, self.buf = "head", ""
            return
        if piece.spelling == CALL_CLOSE and self.state == "closer" and not self.buf:
            call = self.calls[-1]
            self._fragment("{}" if not call.params else "}", events)
            self.state = "after"
            return
        if self.constrained and self.state != "content":
            raise InternalError(f"tool call framing broken: control token {piece.spelling!r} "
                                f"in state {self.state}")
        self._content_text(piece.spelling, events)  # not a tool control token here: content

    def _content_text(self, text: str, events: list) -> None:
        if self.state != "content":
            raise InternalError(f"tool call framing broken: text {text!r} after a call")
        text = self.held + text
        keep = len(text) - len(text.rstrip("\n"))
        keep = min(keep, _HELD_NEWLINES)
        self.held = text[len(text) - keep:] if keep else ""
        self._publish(text[: len(text) - keep], events)

    def _publish(self, text: str, events: list) -> None:
        if text:
            self.content.append(text)
            events.append(TextDelta(text))

    # -- constrained states --------------------------------------------------------------------
    # head: "\n<function=" | fname: NAME ">\n" | between: "<parameter=" or "</function>\n" |
    # pname: K ">\n" | value: V "\n</parameter>" | sep: "\n" | closer: the closer token |
    # after: "\n" (or the end) | next: the next opener token
    def _expect(self, literal: str, next_state: str) -> None:
        n = min(len(literal), len(self.buf))
        if self.buf[:n] != literal[:n]:
            raise InternalError(f"tool call framing broken: expected {literal!r}, got "
                                f"{self.buf[:len(literal)]!r}")
        if n == len(literal):
            self.buf, self.state = self.buf[n:], next_state

    def _head(self, events: list) -> None:
        self._expect(CALL_HEAD, "fname")

    def _fname(self, events: list) -> None:
        at = self.buf.find(">\n")
        if at < 0:
            return
        call = self.calls[-1]
        call.name, self.buf, self.state = self.buf[:at], self.buf[at + 2:], "between"
        events.append(ToolCallStart(len(self.calls) - 1, call.id, call.name))

    def _between(self, events: list) -> None:
        if len(self.buf) < 2:
            if self.buf != "<":
                raise InternalError(f"tool call framing broken: {self.buf!r} after a parameter")
            return
        self._expect(CALL_TAIL if self.buf[1] == "/" else PARAM_OPEN,
                     "closer" if self.buf[1] == "/" else "pname")

    def _pname(self, events: list) -> None:
        at = self.buf.find(">\n")
        if at < 0:
            return
        call = self.calls[-1]
        self._param, self.buf, self.state = self.buf[:at], self.buf[at + 2:], "value"
        lead = "{" if not call.params else ", "
        call.params += 1
        self._text = []
        opening = '"' if self._coding().streams_as_string(self._param) else ""
        self._fragment(f"{lead}{json.dumps(self._param, ensure_ascii=False)}: {opening}", events)

    def _value(self, events: list) -> None:
        at = self.buf.find(VALUE_END)
        if at >= 0:
            self._value_text(self.buf[:at], events)
            self.buf, self.state = self.buf[at + len(VALUE_END):], "sep"
            coding, text = self._coding(), "".join(self._text)
            if coding.streams_as_string(self._param):
                self._fragment('"', events)
            elif not coding.verbatim(self._param):
                self._fragment(coding.value_json(self._param, text), events)
            return
        keep = 0  # the longest suffix that may still become the delimiter
        for k in range(min(len(VALUE_END) - 1, len(self.buf)), 0, -1):
            if VALUE_END.startswith(self.buf[-k:]):
                keep = k
                break
        self._value_text(self.buf[: len(self.buf) - keep], events)
        self.buf = self.buf[len(self.buf) - keep:]

    def _value_text(self, text: str, events: list) -> None:
        if not text:
            return
        self._text.append(text)
        coding = self._coding()
        if coding.streams_as_string(self._param):
            self._fragment(_escaped(text), events)
        elif coding.verbatim(self._param):
            self._fragment(text, events)

    def _sep(self, events: list) -> None:
        self._expect("\n", "between")

    def _coding(self) -> ArgumentCoding:
        return self.codings.get(self.calls[-1].name, ArgumentCoding(strict=False))

    def _closer(self, events: list) -> None:
        raise InternalError(f"tool call framing broken: {self.buf[:16]!r} before {CALL_CLOSE!r}")

    def _after(self, events: list) -> None:
        self._expect(CALL_SEPARATOR, "next")

    def _next(self, events: list) -> None:
        raise InternalError(f"tool call framing broken: {self.buf[:16]!r} between calls")

    def _fragment(self, text: str, events: list) -> None:
        call = self.calls[-1]
        call.fragments.append(text)
        events.append(ToolCallArgumentsDelta(len(self.calls) - 1, text))

    # -- end -----------------------------------------------------------------------------------
    def finish(self, *, complete: bool) -> list:
        """Flush at the end of generation. `complete`: the output ended normally (EOS).

        Afterwards `tool_calls()` and `text()` hold the results. On a truncated constrained output
        completed calls are kept and an unfinished call is dropped (no arguments_json)."""
        events: list = []
        if not self.constrained:
            tail, self.free_tail = self.free_tail, []
            if tail:
                self.held = ""
            else:
                self._publish(self.held, events)
                self.held = ""
            events.extend(self._parse_free(tail))
            return events
        if self.state == "content":
            self._publish(self.held, events)
            self.held = ""
        elif self.state != "after" or self.buf:
            if complete:
                raise InternalError(f"output ended normally inside a tool call ({self.state})")
            self.calls.pop()
        return events

    def forget_content(self) -> None:
        """Drop the content read so far (a continued prefix, never published again)."""
        self.content.clear()
        self.held = ""

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c.id, c.name, "".join(c.fragments)) for c in self.calls)

    def text(self) -> str:
        return "".join(self.content)

    # -- free route ----------------------------------------------------------------------------
    def _parse_free(self, tail: list[Piece]) -> list:
        events: list = []
        segments: list[list[Piece]] = []
        for piece in tail:
            if isinstance(piece, Control) and piece.spelling == CALL_OPEN:
                segments.append([piece])
            else:
                segments[-1].append(piece)
        leftover: list[str] = []
        for segment in segments:
            parsed = self._read_free_call(segment)
            if parsed is None:
                leftover.append("".join(piece_text(p) for p in segment))
                continue
            name, args = parsed
            call = Call(_new_id(), name, [json.dumps(args, ensure_ascii=False)])
            self.calls.append(call)
            index = len(self.calls) - 1
            events.append(ToolCallStart(index, call.id, name))
            events.append(ToolCallArgumentsDelta(index, call.fragments[0]))
        self._publish("".join(leftover), events)
        return events

    def _read_free_call(self, segment: list[Piece]) -> tuple[str, dict] | None:
        body: list[str] = []
        for piece in segment[1:]:
            if isinstance(piece, Control):
                if piece.spelling != CALL_CLOSE:
                    return None
                break  # text after the closer (the separator) is dropped with the call
            body.append(piece)
        text = "".join(body)
        m = _FREE_FUNCTION.match(text)
        if m is None or m.group(1) not in self.codings:
            return None
        coding, args = self.codings[m.group(1)], {}
        for p in _FREE_PARAM.finditer(m.group(2)):
            value = p.group(2)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            if coding.strict:
                types = ("string",) if p.group(1) in coding.raw else ()
            else:
                types = dict(coding.types).get(p.group(1), ())
            args[p.group(1)] = convert_value(value, types)
        return m.group(1), args


_FREE_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>\s*)?$", re.S)
_FREE_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?=</parameter>|<parameter=|</function>|$)",
                         re.S)
