"""Gateway request limits and API-key checks."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Mapping

from services.gateway.body import group_depth
from shared.contract import canonical_json
from shared.errors import InvalidRequest


@dataclass(frozen=True)
class GatewayLimits:
    max_body_bytes: int = 4 * 1024 * 1024  # bytes of one request body; larger bodies get 413
    max_messages: int = 512  # chat messages / Responses input items / Anthropic messages
    max_tools: int = 128  # declared tools per request
    max_schema_bytes: int = 256 * 1024  # canonical JSON bytes of one schema (or grammar/regex text)
    # Bracket nesting of a body ({} is 1). 64 leaves every real request room (OpenAI allows 10
    # levels of schema nesting) and keeps every later walk of the body (the parser, canonical
    # JSON, the schema reader) far from Python's recursion limit.
    max_json_depth: int = 64
    max_choices: int = 16  # choices of one response: n (times the prompts of a completions list)
    # Parenthesis nesting of a regex or GBNF source (and of a schema's patterns): the parsers
    # behind it recurse once or more per level.
    max_constraint_nesting: int = 64

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_tools", "max_schema_bytes",
                     "max_json_depth", "max_choices", "max_constraint_nesting"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GatewayLimits.{name} must be a positive integer, got {value!r}")

    def check_messages(self, count: int, path: str) -> None:
        """Raise InvalidRequest(field=path) when more than `max_messages` were given."""
        if count > self.max_messages:
            raise InvalidRequest(
                f"{path} holds {count} entries, more than this gateway's limit max_messages="
                f"{self.max_messages}", field=path)

    def check_tools(self, count: int, path: str) -> None:
        """Raise InvalidRequest(field=path) when more than `max_tools` were declared."""
        if count > self.max_tools:
            raise InvalidRequest(
                f"{path} declares {count} tools, more than this gateway's limit max_tools="
                f"{self.max_tools}", field=path)

    def check_choices(self, count: int, path: str) -> None:
        """Raise InvalidRequest(field=path) when a response would hold more than `max_choices`."""
        if count > self.max_choices:
            raise InvalidRequest(
                f"{path} asks for {count} choices, more than this gateway's limit max_choices="
                f"{self.max_choices}", field=path)

    def check_schema(self, schema: Any, path: str) -> None:
        """Raise InvalidRequest(field=path) when the schema's canonical JSON exceeds the limit,
        or one of its `pattern`s (or `patternProperties` names) nests groups too deep."""
        size = len(canonical_json(schema).encode())
        self._check_source_size(size, path, "schema")
        stack = [schema]
        while stack:  # iterative: the body's depth is bounded, but no walk here recurses
            node = stack.pop()
            if isinstance(node, dict):
                pattern = node.get("pattern")
                if isinstance(pattern, str):
                    self.check_nesting(pattern, "regex", path)
                names = node.get("patternProperties")
                for name in names if isinstance(names, dict) else ():
                    self.check_nesting(name, "regex", path)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)

    def check_source(self, text: str, path: str, kind: str | None = None) -> None:
        """The same byte limit for grammar and regex text and choice lists; for `kind` "regex"
        or "grammar" also the group nesting limit."""
        self._check_source_size(len(text.encode()), path, "constraint source")
        if kind is not None:
            self.check_nesting(text, kind, path)

    def check_nesting(self, source: str, kind: str, path: str) -> None:
        """Raise InvalidRequest(field=path) when a regex / GBNF source nests its groups deeper
        than `max_constraint_nesting`."""
        if source.count("(") <= self.max_constraint_nesting:
            return
        depth = group_depth(source, kind)
        if depth > self.max_constraint_nesting:
            raise InvalidRequest(
                f"{path}: a {'regex' if kind == 'regex' else 'grammar'} nests its groups {depth} "
                f"deep, more than this gateway's limit max_constraint_nesting="
                f"{self.max_constraint_nesting}", field=path)

    def _check_source_size(self, size: int, path: str, what: str) -> None:
        if size > self.max_schema_bytes:
            raise InvalidRequest(
                f"{path}: the {what} is {size} bytes, more than this gateway's limit "
                f"max_schema_bytes={self.max_schema_bytes}", field=path)


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """The API keys a request presents: `Authorization: Bearer KEY` and/or `x-api-key: KEY`."""
    keys = []
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        keys.append(auth[7:].strip())
    key = headers.get("x-api-key", "").strip()
    if key:
        keys.append(key)
    return keys


def key_allowed(presented: list[str], api_keys: frozenset[str]) -> bool:
    """True when no keys are configured or a presented key equals one of them (constant time)."""
    if not api_keys:
        return True
    found = False
    for key in presented:
        for allowed in api_keys:
            found |= hmac.compare_digest(key.encode(), allowed.encode())
    return found
