"""The one place a request body becomes Python data: bounded nesting, strict JSON, no lone
surrogates.

- Nesting is measured on the raw bytes before parsing, without recursion (strings are cut out by a
  regular expression, then the bracket depth is a running sum), so a body nested 100,000 deep is a
  400 naming `max_json_depth` and never reaches a recursive parser or walk; every later walk of
  the parsed body is therefore bounded by that depth.
- JSON is parsed strictly: `NaN`, `Infinity` and numbers that overflow a double are refused.
- A lone UTF-16 surrogate (`"\\ud800"` without its pair, what a JavaScript string cut inside an
  emoji carries) is not a Unicode character: the body is refused with a 400 naming the field that
  holds it, wherever it is (prompt text, schema, grammar, choice, tool). OpenAI and Anthropic
  refuse such bodies with a 400 as well; replacing the character would silently change a
  constraint's language, and one rule for every field is simpler to state and to test.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from services.gateway.errors import GatewayError
from services.gateway.fields import join
from shared.contract import read_float

# A JSON string token; `[^"\\]` and `\\.` are disjoint, so matching is linear in the input.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# A JSON escape of a UTF-16 surrogate: the only way one can arrive (the UTF-8 decoder refuses
# encoded surrogates). A cheap filter: only bodies that contain one are walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def bracket_depth(text: bytes, opening: bytes, closing: bytes) -> int:
    """The deepest nesting of `opening` / `closing` bytes in `text` (a running sum), without
    recursion and without a Python-level loop over the characters."""
    keep = opening + closing
    brackets = text.translate(None, bytes(b for b in range(256) if b not in keep))
    if sum(brackets.count(bytes([b])) for b in opening) <= 1:
        return 1 if any(b in opening for b in brackets) else 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where(np.isin(codes, np.frombuffer(opening, dtype=np.uint8)), 1, -1)
    return int(np.cumsum(steps.astype(np.int32)).max())


def json_depth(raw: bytes) -> int:
    """The bracket nesting depth of JSON text (`{}` is 1): strings cut out, then a running sum."""
    return bracket_depth(_STRING.sub(b"", raw), b"[{", b"]}")


# What cannot hold a group parenthesis: escapes and character classes of a regex; string
# literals, character classes and comments of GBNF.
_REGEX_INERT = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]", re.DOTALL)
_GBNF_INERT = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*', re.DOTALL)


def group_depth(source: str, kind: str) -> int:
    """How deep the parentheses of a regex (`kind` "regex") or GBNF text ("grammar") nest."""
    inert = _REGEX_INERT if kind == "regex" else _GBNF_INERT
    return bracket_depth(inert.sub("", source).encode("utf-8", "replace"), b"(", b")")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """A finite float; a number parsing rounds stays marked (shared.contract.read_float), so a
    schema reader can refuse it where it asserts."""
    return read_float(text)


def parse_body(raw: bytes, max_depth: int) -> dict:
    """The request body as a dict. Raises GatewayError(400): code `json_too_deep` past
    `max_depth`, `invalid_json` for text that is not strict JSON or not an object, and
    `invalid_unicode` (naming the field) for a lone surrogate."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise GatewayError(400, f"the request body nests JSON {depth} levels deep, more than this "
                           f"gateway's limit max_json_depth={max_depth}", "json_too_deep")
    try:
        text = raw.decode("utf-8")  # RFC 8259: JSON between systems is UTF-8
        body = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}", "invalid_json") \
            from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object", "invalid_json")
    if _SURROGATE_ESCAPE.search(raw):
        path = lone_surrogate_path(body)
        if path is not None:
            raise GatewayError(
                400, f"{path or 'a key of the request body'} holds a lone UTF-16 surrogate, which "
                "is not a Unicode character (a string cut inside a surrogate pair); send "
                "well-formed text", "invalid_unicode", param=path or None)
    return body


def _key_text(key: str) -> str:
    """A key for a field path: as is, or JSON-escaped when it holds a surrogate itself."""
    return json.dumps(key) if _SURROGATE.search(key) else key


def lone_surrogate_path(value: Any) -> str | None:
    """The path (`messages[0].content`) of the first string or key holding a lone surrogate, or
    None. Iterative: bounded by the body's size, not by Python's recursion limit."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return path
        elif isinstance(node, dict):
            for key in node:
                if _SURROGATE.search(key):
                    return join(path, _key_text(key))
            stack.extend((v, join(path, k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, join(path, i)) for i, v in reversed(list(enumerate(node))))
    return None
