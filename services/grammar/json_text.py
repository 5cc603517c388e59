"""A byte-level reader of generated JSON text that knows, at every byte, which object it is in
and which member names that object has used (names compared after JSON unescaping).

It is the model of `json_names.JsonNameConstraint` (the companion that keeps generated names
unique) and of `grammar check` (a text repeating a name is not an output). It reads only what a
JSON grammar can write, so it needs no error recovery: a byte no JSON text could hold at that
point makes the state `LOST`, which ignores the rest.

A state is an immutable tuple `(mode, done, pend, stack)`:

- `mode`: where the reader is (the constants below);
- `done`: the bytes of the member name read so far, unescaped, as UTF-8 (surrogatepass: a lone
  `\\ud800` is a name of its own, as Python's json reads it);
- `pend`: an escape sequence of the name not yet complete (b"" outside one);
- `stack`: one entry per open container, the innermost last: the frozenset of the names an
  object has used, or None for an array.

`step(state, byte)` raises `Duplicate` when the byte completes a name its object already used.
"""

from __future__ import annotations

WAIT = 0  # before the JSON value (reasoning of a thinking framing): only a token starts it
VALUE = 1  # a value is next
VALUE0 = 2  # a value or `]` is next (just after `[`)
KEY0 = 3  # a name or `}` is next (just after `{`)
KEYX = 4  # a name is next (after `,` in an object)
KEY = 5  # inside a member name
COLON = 6  # the `:` after a name is next
STR = 7  # inside a string value
STR_ESC = 8  # after `\` inside a string value
SCALAR = 9  # inside a number or a literal
AFTER = 10  # after a value: `,`, a closer, or (at the top) the end
DONE = 11  # the top-level value is complete
LOST = 12  # not JSON the reader follows

_WS = frozenset(b" \t\n\r")
_QUOTE, _BSLASH, _COMMA, _COLON = ord('"'), ord("\\"), ord(","), ord(":")
_SIMPLE = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b", ord("f"): b"\f",
           ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}
_HEX = frozenset(b"0123456789abcdefABCDEF")

START = (VALUE, b"", b"", ())
WAITING = (WAIT, b"", b"", ())


class Duplicate(Exception):
    """The byte completed a member name its object already used."""


def _lost(stack: tuple) -> tuple:
    return (LOST, b"", b"", stack)


def _utf8(code: int) -> bytes:
    return chr(code).encode("utf-8", "surrogatepass")


def _escape(done: bytes, pend: bytes, byte: int, stack: tuple) -> tuple:
    """One byte of a name's escape sequence `pend` (it starts with `\\`)."""
    pend += bytes([byte])
    if len(pend) == 2:
        if byte in _SIMPLE:
            return (KEY, done + _SIMPLE[byte], b"", stack)
        return (KEY, done, pend, stack) if byte == ord("u") else _lost(stack)
    if len(pend) <= 6:  # \uXXXX
        if byte not in _HEX:
            return _lost(stack)
        if len(pend) < 6:
            return (KEY, done, pend, stack)
        code = int(pend[2:6], 16)
        if 0xD800 <= code < 0xDC00:  # a high surrogate: a low one may follow
            return (KEY, done, pend, stack)
        return (KEY, done + _utf8(code), b"", stack)
    # after a high surrogate: `\uDC00`..`\uDFFF` pairs with it, anything else leaves it alone
    if len(pend) == 7:
        if byte == _BSLASH:
            return (KEY, done, pend, stack)
        return _key(done + _utf8(int(pend[2:6], 16)), byte, stack)
    if len(pend) == 8:
        if byte == ord("u"):
            return (KEY, done, pend, stack)
        lone = done + _utf8(int(pend[2:6], 16))
        return _escape(lone, b"\\", byte, stack)
    if byte not in _HEX:
        return _lost(stack)
    if len(pend) < 12:
        return (KEY, done, pend, stack)
    high, low = int(pend[2:6], 16), int(pend[8:12], 16)
    if 0xDC00 <= low < 0xE000:
        return (KEY, done + _utf8(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)), b"", stack)
    after_high = done + _utf8(high)
    if 0xD800 <= low < 0xDC00:  # another high surrogate: it waits for its own pair
        return (KEY, after_high, pend[6:], stack)
    return (KEY, after_high + _utf8(low), b"", stack)


def _key(done: bytes, byte: int, stack: tuple) -> tuple:
    """One byte of a member name (no escape pending)."""
    if byte == _BSLASH:
        return (KEY, done, b"\\", stack)
    if byte != _QUOTE:
        return (KEY, done + bytes([byte]), b"", stack)
    used = stack[-1]
    if done in used:
        raise Duplicate
    return (COLON, b"", b"", stack[:-1] + (used | {done},))


def _value(byte: int, stack: tuple) -> tuple:
    if byte == ord("{"):
        return (KEY0, b"", b"", stack + (frozenset(),))
    if byte == ord("["):
        return (VALUE0, b"", b"", stack + (None,))
    if byte == _QUOTE:
        return (STR, b"", b"", stack)
    return (SCALAR, b"", b"", stack)


def _after(byte: int, stack: tuple) -> tuple:
    if not stack:
        return (DONE, b"", b"", stack)
    if byte == _COMMA:
        return (KEYX if stack[-1] is not None else VALUE, b"", b"", stack)
    if byte in (ord("}"), ord("]")):
        rest = stack[:-1]
        return (AFTER if rest else DONE, b"", b"", rest)
    return _lost(stack)


def step(state: tuple, byte: int) -> tuple:
    """The state after one more byte of text (see the module docstring); raises Duplicate."""
    mode, done, pend, stack = state
    if mode == KEY:
        return _escape(done, pend, byte, stack) if pend else _key(done, byte, stack)
    if mode == STR:
        if byte == _QUOTE:
            return (AFTER if stack else DONE, b"", b"", stack)
        return (STR_ESC, b"", b"", stack) if byte == _BSLASH else state
    if mode == STR_ESC:
        return (STR, b"", b"", stack)
    if mode in (WAIT, DONE, LOST):
        return state
    if byte in _WS:
        return (AFTER if stack else DONE, b"", b"", stack) if mode == SCALAR else state
    if mode in (VALUE, VALUE0):
        if mode == VALUE0 and byte == ord("]"):
            return _after(byte, stack)
        return _value(byte, stack)
    if mode in (KEY0, KEYX):
        if byte == _QUOTE:
            return (KEY, b"", b"", stack)
        return _after(byte, stack) if mode == KEY0 and byte == ord("}") else _lost(stack)
    if mode == COLON:
        return (VALUE, b"", b"", stack) if byte == _COLON else _lost(stack)
    if mode == SCALAR:
        return _after(byte, stack) if byte in (_COMMA, ord("}"), ord("]")) else state
    return _after(byte, stack)  # AFTER


def feed(state: tuple, data: bytes) -> tuple:
    """The state after `data`; raises Duplicate."""
    for byte in data:
        state = step(state, byte)
    return state


def repeats_a_name(data: bytes) -> bool:
    """True when the JSON text `data` uses some member name twice in one object."""
    try:
        feed(START, data)
    except Duplicate:
        return True
    return False


def any_used(state: tuple) -> bool:
    """Whether some open object has used a name (else no byte can repeat one)."""
    return any(s for s in state[3])


def near_used(state: tuple) -> bool:
    """Whether, in this state, the text could go on to repeat a name of the innermost object
    without the reader seeing a byte that rules it out: a name is next in an object that used
    one, or the name being read is a prefix of a used one (or inside an escape)."""
    mode, done, pend, stack = state
    if mode == KEYX:
        return bool(stack[-1])
    if mode != KEY or not stack[-1]:
        return False
    return any(u.startswith(done) for u in stack[-1])
