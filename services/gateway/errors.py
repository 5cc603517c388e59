"""Typed Infernix errors -> HTTP status, original field path and each protocol's error body.

A schema error's JSON Pointer is relative to the schema the caller gave; `ErrorPaths` remembers
where in the request that schema (or tool, or constraint source) was, so the client sees
`response_format.json_schema.schema/properties/age` or `tools[1].input_schema/required`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from shared.errors import (
    ConflictingConstraint,
    ConstraintDeadEnd,
    ConstraintTooComplex,
    InfernixError,
    InvalidChoice,
    InvalidGrammar,
    InvalidRegex,
    InvalidRequest,
    InvalidSchema,
    InvalidToolDefinition,
    SchemaSource,
    Unsupported,
    UnsupportedSchema,
)


@dataclass(frozen=True)
class ErrorPaths:
    """Where the parts of one protocol request were, for naming them in errors."""

    content_schema: str | None = None  # path of a response JSON schema, e.g. "text.format.schema"
    constraint: str | None = None  # path of the content constraint's source
    tool_base: str = "tools[{i}]"  # path of one declared tool
    tool_fields: Mapping[str, str] = field(default_factory=dict)  # contract field -> tool path tail
    aliases: Mapping[str, str] = field(default_factory=dict)  # contract field -> request field

    def tool(self, index: int, contract_field: str | None = None) -> str:
        base = self.tool_base.format(i=index)
        if contract_field is None:
            return base
        return f"{base}.{self.tool_fields.get(contract_field, contract_field)}"

    def alias(self, contract_field: str) -> str:
        return self.aliases.get(contract_field, contract_field)


@dataclass
class GatewayError(Exception):
    """An HTTP-level refusal the gateway makes itself (auth, size, unknown route or model)."""

    status: int
    message: str
    code: str  # OpenAI `code`; also picks the Anthropic error type
    param: str | None = None

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)


def error_param(err: InfernixError, paths: ErrorPaths) -> str | None:
    """The request field path an error is about, or None when it names no field."""
    if isinstance(err, (InvalidSchema, UnsupportedSchema)):
        if err.source is SchemaSource.TOOL_ARGUMENTS and err.tool_index is not None:
            return paths.tool(err.tool_index, "parameters") + err.pointer
        return (paths.content_schema or paths.constraint or "") + err.pointer or None
    if isinstance(err, InvalidToolDefinition):
        if err.tool_index is None:
            return paths.alias(err.field or "tools")
        return paths.tool(err.tool_index, err.field)
    if isinstance(err, (InvalidGrammar, InvalidRegex)):
        return paths.constraint
    if isinstance(err, InvalidChoice):
        if paths.constraint is not None and err.index is not None:
            return f"{paths.constraint}[{err.index}]"
        return paths.constraint
    if isinstance(err, (InvalidRequest, Unsupported, ConflictingConstraint)) and err.field:
        return paths.alias(err.field)
    if isinstance(err, ConstraintTooComplex):  # names the constraint it is about
        return paths.constraint or "tools"
    return None


def describe(err: InfernixError) -> str:
    """The message, with the position details a typed error carries."""
    extra = []
    if isinstance(err, InvalidGrammar) and err.line is not None:
        extra.append(f"line {err.line}, column {err.column}")
    if isinstance(err, InvalidRegex) and err.position is not None:
        extra.append(f"position {err.position}")
    if isinstance(err, ConstraintDeadEnd) and err.position is not None:
        extra.append(f"output position {err.position}")
    if isinstance(err, ConstraintTooComplex) and err.limit and err.limit not in err.message:
        extra.append(f"limit {err.limit}")
    return f"{err.message} ({'; '.join(extra)})" if extra else err.message


def code_of(err: InfernixError) -> str:
    """A stable snake_case code from the error type: UnsupportedSchema -> unsupported_schema."""
    name = err.type_name
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


# Statuses by the error's `fault` (shared/errors.py): a full queue or slot (429) and a dependency
# that is down (503) are neither the client's fault nor a bug, and both carry a Retry-After
# (`retry_after_s` when the error has it, else DEFAULT_RETRY_AFTER_S).
DEFAULT_RETRY_AFTER_S = 1
_FAULT_STATUS = {"overloaded": 429, "unavailable": 503}


def status_of(err: InfernixError, *, started: bool = False) -> int:
    """400 for request errors found before generation, 422 for request errors found while
    generating (a constraint dead end), 429 for a full queue, 503 for a dependency that is down,
    500 for internal failures."""
    if err.fault == "request":
        return 422 if started else 400
    return _FAULT_STATUS.get(err.fault, 500)


def retry_after(err: InfernixError | None, status: int) -> int | None:
    """Seconds for a Retry-After header on 429/503, None otherwise."""
    if status not in (429, 503):
        return None
    value = getattr(err, "retry_after_s", None) if err is not None else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        return DEFAULT_RETRY_AFTER_S
    return max(1, math.ceil(value))


_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 413: "invalid_request_error", 422: "invalid_request_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def openai_error(status: int, message: str, *, param: str | None, code: str | None) -> dict:
    """OpenAI's error body `{"error": {message, type, param, code}}`."""
    return {
        "error": {
            "message": message,
            "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def anthropic_error(status: int, message: str, *, param: str | None, code: str | None) -> dict:
    """Anthropic's error body `{"type": "error", "error": {type, message}}`; the field path is
    kept in the message and as an extra `param` member."""
    body: dict[str, Any] = {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}
    if param is not None:
        body["message"] = f"{param}: {message}" if not message.startswith(param) else message
        body["param"] = param
    return {"type": "error", "error": body}


def infernix_error_parts(err: InfernixError, paths: ErrorPaths, *, started: bool = False
                         ) -> tuple[int, str, str | None, str]:
    """(status, message, param, code) for a typed error."""
    status = status_of(err, started=started)
    if status in (429, 503):
        return status, describe(err), None, code_of(err)
    if status != 500:
        return status, describe(err), error_param(err, paths), code_of(err)
    return 500, "internal error while generating; see the gateway and worker logs", None, \
        "internal_error"
