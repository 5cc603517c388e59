"""The events of one request as an async iterator, fed from the worker thread, and the outbox
that hands one step's events of every request to their event loops in one wake-up each."""

from __future__ import annotations

import asyncio
from collections import deque

from shared.generation import Finished, GenerationEvent


class RequestStream:
    """Events pushed with `push` (any thread, through `loop.call_soon_threadsafe`); iteration ends
    after the `Finished` event. One consumer: the events wait in a deque and the consumer, when it
    finds none, on one future that the next delivery completes (an asyncio.Queue would wake its
    getter through more objects per event, on the loop that also runs the consumers)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        self._loop = loop
        self._events: deque[GenerationEvent] = deque()
        self._waiter: asyncio.Future | None = None  # the consumer waiting for an event

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The consumer's event loop."""
        return self._loop

    def push(self, event: GenerationEvent) -> None:
        """Thread-safe; raises RuntimeError when the consumer's loop is closed."""
        self._loop.call_soon_threadsafe(self.deliver, event)

    def deliver(self, event: GenerationEvent) -> None:
        """On the consumer's loop: queue `event`."""
        self.deliver_all((event,))

    def deliver_all(self, events) -> None:
        """On the consumer's loop: queue `events` in order, with one wake-up of the consumer for
        all of them (the Outbox's batched hand-over: a step's events of this request)."""
        self._events.extend(events)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():  # done: its consumer was cancelled
            waiter.set_result(None)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> GenerationEvent:
        if self.finished:
            raise StopAsyncIteration
        while not self._events:
            self._waiter = self._loop.create_future()
            await self._waiter
        event = self._events.popleft()
        if isinstance(event, Finished):
            self.finished = True
        return event


def _deliver(items: list[tuple[RequestStream, list[GenerationEvent]]]) -> None:
    for stream, events in items:
        stream.deliver_all(events)


class Outbox:
    """Held events: `add(sink, event, owner)` holds an event for a `RequestStream` sink,
    `flush()` hands everything held to each event loop with one `call_soon_threadsafe` (one
    wake-up of the loop instead of one per event), each stream's events in the order added, as
    one delivery per stream. Any other sink (a function of the event) is called at once. Both
    return the owners whose consumer is gone (a closed loop, a failing sink)."""

    def __init__(self) -> None:
        # per stream, in the order of its first held event: the stream, its events, its owner
        self._held: dict[int, tuple[RequestStream, list, object]] = {}

    def add(self, sink, event: GenerationEvent, owner=None) -> list:
        return self.add_all(sink, (event,), owner)

    def add_all(self, sink, events, owner=None) -> list:
        """`add` of each of `events` in order (one look-up of the sink's held events for all).
        A list passed here is the Outbox's afterwards: the caller does not use it again."""
        if not isinstance(sink, RequestStream):
            gone = False
            for event in events:
                try:
                    sink(event)
                except Exception:  # the consumer is gone
                    gone = True
            return [owner] if gone else []
        entry = self._held.get(id(sink))
        if entry is None:  # a list of the caller's is kept as it is: it hands it over
            self._held[id(sink)] = (sink, events if events.__class__ is list else list(events),
                                    owner)
        else:
            entry[1].extend(events)
        return []

    def flush(self) -> list:
        held, self._held = self._held, {}
        loops: dict[int, tuple[asyncio.AbstractEventLoop, list, list]] = {}
        for stream, events, owner in held.values():
            loop = stream._loop
            entry = loops.get(id(loop))
            if entry is None:
                entry = loops[id(loop)] = (loop, [], [])
            entry[1].append((stream, events))
            entry[2].append(owner)
        failed = []
        for loop, items, owners in loops.values():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed
                failed.extend(owners)
        return failed
