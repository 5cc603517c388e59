"""structlog setup: one JSON object per line on stderr, the same in every service.

Modules log through `get_logger(__name__)`; only a service's `main` calls `configure_logging`.
Never put grammar, schema or prompt text into a log event: keys, counts and timings only.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _Stderr:
    """Whatever `sys.stderr` is when a line is written (a test or a daemon may replace it after
    configuration; writing to the object seen at configuration time would then fail)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "INFO") -> None:
    """Route structlog events as JSON lines (ISO timestamp, level, logger_name) to stderr.

    `level` is a standard level name (default INFO); raises ValueError for an unknown name."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> Any:
    """A lazy structlog logger whose events carry `logger_name=name` (configuration is read at
    first use, so module-level loggers follow `configure_logging` and `structlog.testing`)."""
    return structlog.get_logger(logger_name=name)
