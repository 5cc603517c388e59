"""A byte-level reader of generated JSON text that knows, at every byte, the counted subtree
(schema/lengths.py) of the value being read, and inside a counted string its characters so far:
the model of `json_lengths.JsonLengthConstraint`.

It reads only what a JSON content grammar can write (canonical escapes, schema/strings.py), so it
needs no error recovery: a byte no JSON text could hold at that point makes the state `LOST`.
A container's place is its path from the root: in an object the member name's bytes as the
grammar spells them (one spelling per name), in an array the element index. Characters are
counted when their first byte arrives (a UTF-8 lead byte, or the `\\` of an escape); escape
states (`State.esc`): 0 none, -1 just after `\\`, k > 0 hex digits of `\\u` still to come.
`step` raises `Violation` at the byte that takes a counted string past its maximum, or closes it
short of its minimum.
"""

from __future__ import annotations

from typing import NamedTuple

from services.grammar.schema.lengths import Counted, CountedArray, CountedObject

# reader modes
WAIT, VALUE, VALUE0, KEY0, KEYX, KEY, COLON, STR, SCALAR, AFTER, DONE, LOST = range(12)
_WS = frozenset(b" \t\n\r")
QUOTE, BACKSLASH, LETTER_U = ord('"'), ord("\\"), ord("u")


class State(NamedTuple):
    """`mode`; `stack`: per open container (is_array, counted subtree or None, element index);
    `child`: the counted subtree of the value being read or next; in a string or name: `esc`,
    and for a counted string its `bounds` and `count`; in a name its bytes so far."""

    mode: int
    stack: tuple = ()
    child: Counted | None = None
    bounds: tuple | None = None
    count: int = 0
    esc: int = 0
    name: bytes = b""


class Violation(Exception):
    """A byte leaves a counted string's bounds."""


def esc_next(esc: int, byte: int) -> int:
    if esc == -1:
        return 4 if byte == LETTER_U else 0
    return esc - 1


def _open(child: Counted | None, byte: int, s: State) -> State:
    """The first byte of a value."""
    if byte == ord("{"):
        sub = child if isinstance(child, CountedObject) else None
        return State(KEY0, s.stack + ((False, sub, 0),))
    if byte == ord("["):
        sub = child if isinstance(child, CountedArray) else None
        return State(VALUE0, s.stack + ((True, sub, 0),), None if sub is None else sub.child(0))
    if byte == QUOTE:
        return State(STR, s.stack, None, child if isinstance(child, tuple) else None)
    return State(SCALAR, s.stack)


def _after(byte: int, stack: tuple) -> State:
    if byte == ord(","):
        is_array, sub, n = stack[-1]
        if not is_array:
            return State(KEYX, stack)
        return State(VALUE, stack[:-1] + ((True, sub, n + 1),),
                     None if sub is None else sub.child(n + 1))
    if byte in (ord("}"), ord("]")):
        rest = stack[:-1]
        return State(AFTER if rest else DONE, rest)
    return State(LOST, stack)


def step(s: State, byte: int) -> State:
    """The state after one byte the grammar accepted; raises _Violation past a counted bound."""
    mode = s.mode
    if mode == STR:
        if s.esc:
            return s._replace(esc=esc_next(s.esc, byte))
        if byte == QUOTE:
            if s.bounds is not None and s.count < s.bounds[0]:
                raise Violation
            return State(AFTER if s.stack else DONE, s.stack)
        if byte == BACKSLASH or byte & 0xC0 != 0x80:
            if s.bounds is not None:
                hi = s.bounds[1]
                if hi is not None and s.count >= hi:
                    raise Violation
                s = s._replace(count=s.count + 1)
            if byte == BACKSLASH:
                return s._replace(esc=-1)
        return s
    if mode == KEY:
        if s.esc:
            return s._replace(esc=esc_next(s.esc, byte), name=s.name + bytes([byte]))
        if byte == QUOTE:
            _, sub, _ = s.stack[-1]
            return State(COLON, s.stack, None if sub is None else sub.child(s.name))
        return s._replace(esc=-1 if byte == BACKSLASH else 0, name=s.name + bytes([byte]))
    if mode in (WAIT, DONE, LOST):
        return s
    if byte in _WS:
        return State(AFTER if s.stack else DONE, s.stack) if mode == SCALAR else s
    if mode in (VALUE, VALUE0):
        if mode == VALUE0 and byte == ord("]"):
            return _after(byte, s.stack)
        return _open(s.child, byte, s)
    if mode in (KEY0, KEYX):
        if byte == QUOTE:
            return State(KEY, s.stack)
        return _after(byte, s.stack) if mode == KEY0 and byte == ord("}") else State(LOST, s.stack)
    if mode == COLON:
        return State(VALUE, s.stack, s.child) if byte == ord(":") else State(LOST, s.stack)
    if mode == SCALAR:
        return _after(byte, s.stack) if byte in (ord(","), ord("}"), ord("]")) else s
    return _after(byte, s.stack)  # AFTER
