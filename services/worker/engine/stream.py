"""The events of one request as an async iterator, fed from the worker thread."""

from __future__ import annotations

import asyncio

from shared.generation import Finished, GenerationEvent


class RequestStream:
    """Events pushed with `push` (any thread, through `loop.call_soon_threadsafe`); iteration ends
    after the `Finished` event."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        self._loop = loop
        self._queue: asyncio.Queue[GenerationEvent] = asyncio.Queue()

    def push(self, event: GenerationEvent) -> None:
        """Thread-safe; raises RuntimeError when the consumer's loop is closed."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self.finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        if isinstance(event, Finished):
            self.finished = True
        return event
