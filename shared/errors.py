"""Typed errors of the public request contract.

Every error a client can cause is a `RequestError` subclass that names what was wrong (a field, a
JSON Pointer, a line and column). Errors travel between services as plain dictionaries
(`to_dict` / `error_from_dict`), never as text to be parsed, and come back as the same Python types.
Internal failures (bugs, broken invariants) are `InternalError` and are never dressed up as a user's
schema or grammar error.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, ClassVar


class SchemaSource(str, Enum):
    """Where a JSON Schema came from: the response content or a tool's arguments."""

    CONTENT = "content"
    TOOL_ARGUMENTS = "tool_arguments"


@dataclass
class InfernixError(Exception):
    """Base of all Infernix errors. `message` is a complete sentence for humans."""

    message: str
    # Whose fault: "request" errors map to 4xx / INVALID_ARGUMENT, "internal" ones to 5xx /
    # INTERNAL, "overloaded" to 429 / RESOURCE_EXHAUSTED and "unavailable" to 503 / UNAVAILABLE
    # (both: retry later, after `retry_after_s` when the error carries one).
    fault: ClassVar[str] = "internal"
    registry: ClassVar[dict[str, type["InfernixError"]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # One class per error name: a second definition would silently turn every error of that
        # name rebuilt from its dictionary into the other class.
        known = InfernixError.registry.get(cls.__name__)
        if known is not None and (known.__module__, known.__qualname__) != \
                (cls.__module__, cls.__qualname__):
            raise TypeError(f"error type {cls.__name__} is already defined in {known.__module__}")
        InfernixError.registry[cls.__name__] = cls

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def __str__(self) -> str:
        return self.message

    @property
    def type_name(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type_name}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Enum):
                value = value.value
            if value is not None:
                out[f.name] = value
        return out


InfernixError.registry["InfernixError"] = InfernixError


@dataclass
class InternalError(InfernixError):
    """A bug or broken invariant inside Infernix; never the client's fault."""


@dataclass
class RequestError(InfernixError):
    """The request itself is wrong; resending it unchanged fails the same way."""

    fault: ClassVar[str] = "request"


@dataclass
class InvalidRequest(RequestError):
    """A request field is missing, of the wrong type or out of range. `field` names it."""

    field: str | None = None


@dataclass
class Unsupported(RequestError):
    """A well-formed request asks for a feature Infernix does not implement."""

    field: str | None = None


@dataclass
class InvalidGrammar(RequestError):
    """GBNF text that does not parse or breaks a rule of the grammar contract (1-based
    positions)."""

    line: int | None = None
    column: int | None = None


@dataclass
class _SchemaError(RequestError):
    # JSON Pointer (RFC 6901) into the schema the caller gave, "" for the root.
    pointer: str = ""
    source: SchemaSource = SchemaSource.CONTENT
    # For tool arguments: the index and name of the tool whose schema failed.
    tool_index: int | None = None
    tool_name: str | None = None

    def __post_init__(self) -> None:
        self.source = SchemaSource(self.source)
        super().__post_init__()


@dataclass
class InvalidSchema(_SchemaError):
    """The schema is not a valid JSON Schema (wrong keyword type, dangling $ref, ...)."""


@dataclass
class UnsupportedSchema(_SchemaError):
    """A valid schema uses a keyword or composition outside the enforced subset."""


@dataclass
class InvalidRegex(RequestError):
    """A regex that does not parse or uses an unsupported construct. `position` is a 0-based
    index."""

    position: int | None = None


@dataclass
class InvalidChoice(RequestError):
    """A choice list that is empty or holds something other than strings."""

    index: int | None = None


@dataclass
class InvalidToolDefinition(RequestError):
    """A tool declaration is malformed (bad or duplicate name, parameters not an object schema)."""

    tool_index: int | None = None
    tool_name: str | None = None
    field: str | None = None


@dataclass
class ConflictingConstraint(RequestError):
    """Two request features that cannot be combined (e.g. a regex and an active tool set)."""

    field: str | None = None


@dataclass
class ConstraintDeadEnd(RequestError):
    """The constrained output reached a position where no token is legal."""

    position: int | None = None


@dataclass
class DeadlineExceeded(RequestError):
    """The request's own timeout passed before it finished (what was published stays published)."""

    timeout_s: float | None = None


@dataclass
class ConstraintTooComplex(RequestError):
    """A constraint whose compile went past one of the compile limits and was stopped. `limit`
    names the limit ("compile_deadline_s", "compile_memory_bytes") and `value` its configured
    value (seconds, bytes). Resending the same constraint fails the same way: simplify it."""

    limit: str | None = None
    value: float | None = None


@dataclass
class Overloaded(InfernixError):
    """A bounded resource stayed busy for longer than a request may wait for it (`resource`, e.g.
    "cold_compile_slots"); the request was not started. Retry after `retry_after_s` seconds."""

    fault: ClassVar[str] = "overloaded"
    resource: str | None = None
    retry_after_s: float | None = None


@dataclass
class ServiceUnavailable(InfernixError):
    """A service this request depends on (`service`) cannot be reached and nothing can stand in
    for it. Retry after `retry_after_s` seconds when given."""

    fault: ClassVar[str] = "unavailable"
    service: str | None = None
    retry_after_s: float | None = None


@dataclass
class GrammarServiceUnavailable(ServiceUnavailable):
    """The grammar service cannot be reached and this process may not compile by itself."""


def error_from_dict(data: dict[str, Any]) -> InfernixError:
    """Rebuild the typed error that `InfernixError.to_dict` produced (unknown types become
    `InternalError`, keeping the message)."""
    cls = InfernixError.registry.get(str(data.get("type")), InternalError)
    known = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in known}
    kwargs.setdefault("message", str(data.get("message", "unknown error")))
    return cls(**kwargs)


__all__ = [
    "ConflictingConstraint",
    "ConstraintDeadEnd",
    "ConstraintTooComplex",
    "DeadlineExceeded",
    "GrammarServiceUnavailable",
    "InfernixError",
    "InternalError",
    "InvalidChoice",
    "InvalidGrammar",
    "InvalidRegex",
    "InvalidRequest",
    "InvalidSchema",
    "InvalidToolDefinition",
    "Overloaded",
    "RequestError",
    "SchemaSource",
    "ServiceUnavailable",
    "Unsupported",
    "UnsupportedSchema",
    "error_from_dict",
]
