"""Where the JSON texts of an output lie: the frames `json_names.JsonNameConstraint` reads through.

A frame follows an output's bytes and control tokens and says which of them are JSON whose member
names must stay unique. Its state is a pair `(where, json)`: `where` is the frame's own position
(hashable), `json` the JSON reader's state (json_text.py), `WAITING` outside every JSON span, so
that nothing outside a span can use, repeat or approach a name. Each span starts from `START`,
with object scopes of its own: parallel calls and the parameters of one call never share names.

- `ContentFrame`: the whole output is one JSON text, or it starts at the thinking close token.
- `HermesFrame`: each call's `ARGS` in `<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n
  </tool_call>` (shared/frontends/formats/hermes.py): the span opens after the envelope's
  `", "arguments": ` and closes with the arguments' own closing brace, so the envelope's keys and
  the free text before the first call (which never holds `<tool_call>`: the grammar's rule) are
  not read; under a JSON-or-calls union the first byte that is neither layout nor the call's `<`
  starts JSON content that runs to the end.
- `XmlFrame`: the JSON-valued parameters of the Qwen XML format (a strict or enforced tool's
  parameters that are not raw strings, xml_tools.argument_codings): each value between
  `<parameter=K>\\n` and `\\n</parameter>` is a span; the framing is read by the XML companions'
  own steps (raw_lengths.framing_step, framing_token); a JSON-or-calls union's content as above
  (its calls open with a control token, which no JSON text holds).

A thinking framing (`start`: its close token id) leaves the reasoning unread; an XML opener inside
the reasoning opens a call (the grammar's implicit end of reasoning).
"""

from __future__ import annotations

from services.grammar.json_text import DONE, START, WAIT, WAITING, feed, step
from services.grammar.tools.param_names import kmp_next
from services.grammar.tools.raw_lengths import State, framing_step, framing_token
from shared.frontends.formats.hermes import ARGS_PREFIX, CALL_OPEN

_WS = frozenset(b" \t\n\r")
_OPEN, _ARGS = CALL_OPEN.encode(), ARGS_PREFIX.encode()


class ContentFrame:
    """JSON content: the output itself, or what follows the close token `start`."""

    fast = True  # `feed` reads a whole token at once

    def __init__(self, start: int | None = None) -> None:
        self.start = start
        self.initial = (0, START if start is None else WAITING)

    def token(self, state: tuple, token_id: int) -> tuple | None:
        return (0, START) if token_id == self.start else None

    def feed(self, state: tuple, data: bytes) -> tuple:
        return (state[0], feed(state[1], data))

    def step(self, state: tuple, byte: int) -> tuple:
        return (state[0], step(state[1], byte))


class _Union:
    """The part every tool frame shares: the thinking close, and the JSON-or-calls union's
    content branch (`begin`: nothing but layout yet; `content`: JSON to the end)."""

    fast = False

    def __init__(self, first: object, union: bool, start: int | None) -> None:
        self.first = "begin" if union else first  # where the tool language starts
        self.start = start
        self.initial = ("wait" if start is not None else self.first, WAITING)

    def feed(self, state: tuple, data: bytes) -> tuple:
        for byte in data:
            state = self.step(state, byte)
        return state

    def _shared(self, state: tuple, byte: int, call_byte: int | None) -> tuple | None:
        """The step of the shared positions (None: a position of the tool frame's own)."""
        where, js = state
        if where == "content":
            return (where, step(js, byte))
        if where == "wait":
            return state
        if where == "begin":
            if byte in _WS:
                return state
            if byte == call_byte:
                return None
            return ("content", step(START, byte))
        return None


class HermesFrame(_Union):
    """Hermes calls' arguments (see the module docstring). `union`: JSON content OR calls."""

    def __init__(self, union: bool = False, start: int | None = None) -> None:
        super().__init__(("seek", 0), union, start)

    def token(self, state: tuple, token_id: int) -> tuple | None:
        if token_id == self.start and state[0] == "wait":
            return (self.first, WAITING)
        return None

    def step(self, state: tuple, byte: int) -> tuple:
        where, js = state
        if where == "json":
            js = step(js, byte)
            return (("seek", 0), WAITING) if js[0] == DONE else (where, js)
        shared = self._shared(state, byte, _OPEN[0])
        if shared is not None:
            return shared
        tag, k = ("seek", 0) if where == "begin" else where
        if tag == "seek":  # the opener: the free text before it never holds one
            k = kmp_next(_OPEN, k, byte)
            return (("head", 0), WAITING) if k == len(_OPEN) else (("seek", k), WAITING)
        k = kmp_next(_ARGS, k, byte)  # a tool name holds no quote: the first match is the one
        return ("json", START) if k == len(_ARGS) else (("head", k), WAITING)


class XmlFrame(_Union):
    """The JSON-valued parameters of Qwen XML calls (see the module docstring). `json_params`:
    function name -> the names of its parameters whose values are JSON (UTF-8 bytes)."""

    def __init__(self, json_params: dict[bytes, frozenset[bytes]], open_id: int, close_id: int,
                 union: bool = False, start: int | None = None) -> None:
        super().__init__(State("out"), union, start)
        self.json_params = json_params
        self.open_id, self.close_id = open_id, close_id

    def token(self, state: tuple, token_id: int) -> tuple | None:
        where = state[0]
        if token_id == self.start and where == "wait":
            return (self.first, WAITING)
        if token_id not in (self.open_id, self.close_id) or where == "content":
            return None
        s = State("out") if where in ("wait", "begin") else where
        return (framing_token(s, token_id, self.open_id, self.close_id), WAITING)

    def step(self, state: tuple, byte: int) -> tuple:
        shared = self._shared(state, byte, None)
        if shared is not None:
            return shared
        s, js = state
        nxt = framing_step(s, byte)
        if s.mode == "value":
            if nxt.mode == "sep":  # the delimiter completed: the span is over
                return (nxt, WAITING)
            return (nxt, js if js[0] == WAIT else step(js, byte))
        if s.mode == "name_nl" and nxt.mode == "value" and \
                nxt.parameter in self.json_params.get(nxt.function, ()):
            return (nxt, START)
        return (nxt, js)


__all__ = ["ContentFrame", "HermesFrame", "XmlFrame"]
