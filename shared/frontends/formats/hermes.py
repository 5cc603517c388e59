"""The Hermes tool-call format (the built-in default model's): literals, rendering and the
incremental parser, in one home for the grammar service's tool grammar
(services/grammar/tools/hermes.py) and the worker's output decoding alike.

A call is the canonical text the chat template renders and the grammar enforces:

    <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>

Calls follow each other separated by one newline. Tool declarations are rendered the way the
Qwen2.5/Qwen3 family frames them: a `# Tools` section with one JSON declaration per line inside
<tools></tools> in the system turn; tool results go back as `<tool_response>...</tool_response>`.

Output decoding (`ToolStream`). Constrained route: the grammar guarantees the canonical framing,
so the reader consumes the text once as it is generated and publishes each call's arguments in
fragments that concatenate to its final `arguments_json` (the arguments' exact generated text).
Any deviation is an implementation inconsistency (InternalError), never silently turned into
content. Under a JSON-or-tools union (`union=True`) a call opens only at the start of the output,
as the grammar (`json | calls`) has it: once JSON content started, a spelled `<tool_call>` inside
it (in a string) is text. Free route (tools declared but nothing enforced): content streams
until a spelled `<tool_call>`; the rest is read at the end, each well-formed call becoming a
ToolCall and anything unreadable staying content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.errors import InternalError
from shared.frontends.pieces import Control
from shared.generation import TextDelta, ToolCall, ToolCallArgumentsDelta, ToolCallStart

if TYPE_CHECKING:
    from shared.contract import ToolDefinition

FRAMING = "hermes-v1"  # part of compiled tool grammars' cache identity
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
NAME_PREFIX = '{"name": "'
ARGS_PREFIX = '", "arguments": '
CALL_SUFFIX = "}\n" + CALL_CLOSE
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def render_call(name: str, arguments_json: str) -> str:
    """The canonical text of one call: what the model emits and what history re-renders."""
    args = json.loads(arguments_json) if arguments_json else {}
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def render_tools_section(tools: "tuple[ToolDefinition, ...]") -> str:
    """The system-turn section that declares `tools` (appended to the system message)."""
    lines = [
        "",
        "",
        "# Tools",
        "",
        "You can call the functions declared below. Their signatures are JSON Schema documents "
        "inside <tools></tools>:",
        "<tools>",
    ]
    for tool in tools:
        decl = {"type": "function", "function": {"name": tool.name,
                                                 "description": tool.description or "",
                                                 "parameters": tool.parameters}}
        lines.append(json.dumps(decl, ensure_ascii=False))
    lines += [
        "</tools>",
        "",
        "To call a function, write one JSON object with its name and arguments between "
        "<tool_call></tool_call> tags:",
        CALL_OPEN,
        '{"name": <function-name>, "arguments": <arguments-object>}',
        CALL_CLOSE,
    ]
    return "\n".join(lines)


def render_tool_result(content: str) -> str:
    """The body of the user turn that carries one tool result."""
    return f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"


_HEAD = CALL_OPEN + "\n" + NAME_PREFIX


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Call:
    id: str
    name: str = ""
    args: list[str] = field(default_factory=list)


class ToolStream:
    """Feed published text with `feed`, end with `finish`; both return protocol events."""

    def __init__(self, *, constrained: bool, codings: object = None, union: bool = False) -> None:
        # `codings` (the XML format's value contract) has no meaning here: Hermes arguments are
        # JSON.
        self.constrained = constrained
        self.union = union and constrained  # JSON content OR calls: calls only at the start
        self.state = "content"  # content | head | name | args_prefix | args | suffix | between
        self.buf = ""  # text not yet consumed by the current state
        self.content: list[str] = []
        self.calls: list[_Call] = []
        self.free_tail = ""  # free route: everything from the first opener on
        # JSON scanning state of the current arguments value
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self._handlers = {"content": self._content, "head": self._head, "name": self._name,
                          "args_prefix": self._args_prefix, "args": self._args,
                          "suffix": self._suffix, "between": self._between}

    @property
    def branch(self) -> str:
        if self.calls or self.state not in ("content",):
            return "tools"
        return "content" if self.content else "undecided"

    def feed(self, text: "str | Control") -> list:
        if isinstance(text, Control):  # Hermes framing is text: a control token reads as spelled
            text = text.spelling
        if not self.constrained and (self.free_tail or self.state != "content"):
            self.free_tail += text
            return []
        self.buf += text
        events: list = []
        while self.buf:
            before = (self.state, len(self.buf))
            self._handlers[self.state](events)
            if (self.state, len(self.buf)) == before:
                break  # waiting for more text
        return events

    # -- states ------------------------------------------------------------------------------
    def _content(self, events: list) -> None:
        if self.union and (self.content or not CALL_OPEN.startswith(self.buf[:len(CALL_OPEN)])):
            self._publish_content(self.buf, events)  # JSON content: an opener in it is text
            self.buf = ""
            return
        at = self.buf.find(CALL_OPEN)
        if at >= 0:
            self._publish_content(self.buf[:at], events)
            self.buf = self.buf[at:]
            if not self.constrained:
                self.free_tail, self.buf, self.state = self.buf, "", "free"
                return
            self.state = "head"
            return
        # hold back a suffix that may still become the opener
        keep = 0
        for k in range(min(len(CALL_OPEN) - 1, len(self.buf)), 0, -1):
            if CALL_OPEN.startswith(self.buf[-k:]):
                keep = k
                break
        self._publish_content(self.buf[: len(self.buf) - keep], events)
        self.buf = self.buf[len(self.buf) - keep:]

    def _expect(self, literal: str, next_state: str) -> bool:
        n = min(len(literal), len(self.buf))
        if self.buf[:n] != literal[:n]:
            raise InternalError(f"tool call framing broken: expected {literal!r}, got "
                                f"{self.buf[:len(literal)]!r}")
        if n < len(literal):
            return False
        self.buf = self.buf[len(literal):]
        self.state = next_state
        return True

    def _head(self, events: list) -> None:
        if self._expect(_HEAD, "name"):
            self.calls.append(_Call(_new_id()))

    def _name(self, events: list) -> None:
        at = self.buf.find('"')
        if at < 0:
            return
        call = self.calls[-1]
        call.name = self.buf[:at]
        self.buf = self.buf[at:]
        self.state = "args_prefix"
        events.append(ToolCallStart(len(self.calls) - 1, call.id, call.name))

    def _args_prefix(self, events: list) -> None:
        if self._expect(ARGS_PREFIX, "args"):
            self.depth, self.in_string, self.escaped = 0, False, False

    def _args(self, events: list) -> None:
        taken = 0
        for ch in self.buf:
            taken += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.state = "suffix"
                    break
        fragment, self.buf = self.buf[:taken], self.buf[taken:]
        self.calls[-1].args.append(fragment)
        events.append(ToolCallArgumentsDelta(len(self.calls) - 1, fragment))

    def _suffix(self, events: list) -> None:
        self._expect(CALL_SUFFIX, "between")

    def _between(self, events: list) -> None:
        self._expect("\n", "head")

    def _publish_content(self, text: str, events: list) -> None:
        if text:
            self.content.append(text)
            events.append(TextDelta(text))

    # -- end ---------------------------------------------------------------------------------
    def finish(self, *, complete: bool) -> list:
        """Flush at the end of generation. `complete`: the output ended normally (EOS).

        Returns the last events; afterwards `tool_calls()` and `text()` hold the results. On a
        truncated constrained output, completed calls are kept and an unfinished call is dropped."""
        events: list = []
        if not self.constrained:
            tail, self.free_tail = (
                self.free_tail + (self.buf if self.state != "content" else ""),
                "",
            )
            if self.state == "content":
                self._publish_content(self.buf, events)
            self.buf = ""
            events.extend(self._parse_free(tail))
            return events
        if self.state == "content":
            self._publish_content(self.buf, events)
            self.buf = ""
        elif self.state != "between":
            if complete:
                raise InternalError(f"output ended normally inside a tool call ({self.state})")
            if self.state != "head":  # in "head" the unfinished call has no entry yet
                self.calls.pop()  # unfinished: no arguments_json is published for it
        return events

    def _parse_free(self, tail: str) -> list:
        events: list = []
        pattern = re.compile(re.escape(CALL_OPEN) + r"\s*(\{.*?\})\s*" + re.escape(CALL_CLOSE),
                             re.S)
        pos = 0
        for m in pattern.finditer(tail):
            try:
                obj = json.loads(m.group(1))
                name, args = obj["name"], obj.get("arguments", {})
                if not isinstance(name, str) or not isinstance(args, dict):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                continue
            self._publish_content(tail[pos:m.start()].strip("\n"), events)
            pos = m.end()
            call = _Call(_new_id(), name, [json.dumps(args, ensure_ascii=False)])
            self.calls.append(call)
            index = len(self.calls) - 1
            events.append(ToolCallStart(index, call.id, name))
            events.append(ToolCallArgumentsDelta(index, call.args[0]))
        self._publish_content(tail[pos:].strip("\n") if self.calls else tail[pos:], events)
        return events

    def forget_content(self) -> None:
        """Drop the content read so far (a continued prefix, never published again)."""
        self.content.clear()

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c.id, c.name, "".join(c.args)) for c in self.calls)

    def text(self) -> str:
        return "".join(self.content)
