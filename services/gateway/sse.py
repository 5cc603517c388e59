"""Server-sent events over an aiohttp StreamResponse."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class SSE:
    """One event: `data` is a JSON value (or the literal text `[DONE]`), `event` an optional
    name."""

    data: Any
    event: str | None = None

    def encode(self) -> bytes:
        text = self.data if isinstance(self.data, str) else json.dumps(
            self.data, ensure_ascii=False, separators=(",", ":"))
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {text}\n\n".encode()


DONE = SSE("[DONE]")


async def open_stream(request: web.Request, request_id: str) -> web.StreamResponse:
    """Send the SSE response headers and return the response to write events to."""
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        "X-Request-Id": request_id,
    })
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, events: list[SSE]) -> None:
    """Write the events in one chunk (raises ConnectionResetError when the client is gone)."""
    if events:
        await response.write(b"".join(e.encode() for e in events))
