"""The events of one request as an async iterator, fed from the worker thread, and the outbox
that hands one step's events of every request to their event loops in one wake-up each."""

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

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> GenerationEvent:
        if self.finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        if isinstance(event, Finished):
            self.finished = True
        return event


def _deliver(items: list[tuple["asyncio.Queue[GenerationEvent]", GenerationEvent]]) -> None:
    for q, event in items:
        q.put_nowait(event)


class Outbox:
    """Held events: `add(sink, event, owner)` holds an event for a `RequestStream.push` sink,
    `flush()` hands everything held to each event loop with one `call_soon_threadsafe` (one
    wake-up of the loop instead of one per event), in the order added. Any other sink is called
    at once. Both return the owners whose consumer is gone (a closed loop, a failing sink)."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[asyncio.AbstractEventLoop, list, list]] = {}

    def add(self, sink, event: GenerationEvent, owner=None) -> list:
        stream = getattr(sink, "__self__", None)
        if not isinstance(stream, RequestStream) or getattr(sink, "__func__", None) is not RequestStream.push:
            try:
                sink(event)
            except Exception:  # the consumer is gone
                return [owner]
            return []
        entry = self._held.get(id(stream._loop))
        if entry is None:
            entry = self._held[id(stream._loop)] = (stream._loop, [], [])
        entry[1].append((stream._queue, event))
        entry[2].append(owner)
        return []

    def flush(self) -> list:
        held, self._held = self._held, {}
        failed = []
        for loop, items, owners in held.values():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed
                failed.extend(owners)
        return failed
