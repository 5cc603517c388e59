"""The Outbox of the commit path (engine/stream.py): one step's events of every request reach
their event loop with one call_soon_threadsafe, each stream's events in order; a closed loop is
reported so its requests stop generating (issue 14: "one call_soon_threadsafe per step instead
of per event")."""

from __future__ import annotations

import asyncio
import threading

from services.worker.engine.stream import Outbox, RequestStream
from shared.generation import Finished, FinishReason, TextDelta, Usage


def test_one_wakeup_per_loop_and_order_kept():
    loop = asyncio.new_event_loop()
    calls = []
    original = loop.call_soon_threadsafe

    def counting(fn, *args):
        calls.append(fn)
        return original(fn, *args)

    loop.call_soon_threadsafe = counting
    a, b = RequestStream(loop, "a"), RequestStream(loop, "b")
    others = []
    outbox = Outbox()
    for k in range(3):
        outbox.add(a, TextDelta(f"a{k}"))
        outbox.add(b, TextDelta(f"b{k}"))
    assert outbox.add(others.append, TextDelta("direct")) == []  # not a stream: delivered at once

    def broken(event):
        raise RuntimeError("consumer gone")

    assert outbox.add(broken, TextDelta("lost"), "gone") == ["gone"]
    assert others == [TextDelta("direct")] and not calls
    outbox.add(a, Finished(FinishReason.STOP, Usage(1, 3)))
    worker = threading.Thread(target=outbox.flush)
    worker.start()
    worker.join()
    assert len(calls) == 1

    async def drain(stream):
        return [e async for e in stream]

    got_a = loop.run_until_complete(drain(a))
    assert [getattr(e, "text", None) for e in got_a] == ["a0", "a1", "a2", None]
    got_b = [loop.run_until_complete(anext(b)).text for _ in range(3)]
    assert got_b == ["b0", "b1", "b2"]
    loop.close()


def test_closed_loop_is_reported():
    loop = asyncio.new_event_loop()
    stream = RequestStream(loop, "gone")
    loop.close()
    outbox = Outbox()
    assert outbox.add(stream, TextDelta("x"), "owner") == []
    assert outbox.flush() == ["owner"]
    assert outbox.flush() == []  # flushed once


def test_add_all_holds_each_event_in_order_and_reports_a_gone_consumer_once():
    """`add_all` is `add` of each event: a stream's events keep their order with those added one
    by one; a function sink is called with every event and its owner is reported as gone."""
    loop = asyncio.new_event_loop()
    stream = RequestStream(loop, "a")
    outbox = Outbox()
    outbox.add(stream, TextDelta("a0"))
    assert outbox.add_all(stream, [TextDelta("a1"), TextDelta("a2")], "a") == []
    outbox.add(stream, TextDelta("a3"))
    seen = []

    def failing(event):
        seen.append(event)
        raise RuntimeError("consumer gone")

    assert outbox.add_all(failing, [TextDelta("x"), TextDelta("y")], "gone") == ["gone"]
    assert seen == [TextDelta("x"), TextDelta("y")]
    assert outbox.flush() == []
    got = [loop.run_until_complete(anext(stream)).text for _ in range(4)]
    assert got == ["a0", "a1", "a2", "a3"]
    loop.close()


def test_a_cancelled_wait_loses_no_event():
    """A consumer cancelled while it waits (a client that went away) leaves the stream intact:
    an event delivered afterwards is the next one read, and iteration still ends after
    Finished."""
    loop = asyncio.new_event_loop()
    stream = RequestStream(loop, "a")

    async def scenario():
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.sleep(0)
        stream.deliver(TextDelta("kept"))
        stream.deliver(Finished(FinishReason.STOP, Usage(1, 1)))
        return [e async for e in stream]

    got = loop.run_until_complete(scenario())
    assert [type(e) for e in got] == [TextDelta, Finished] and got[0].text == "kept"
    loop.close()


def test_a_streams_events_of_one_flush_are_one_delivery(monkeypatch):
    """"one delivery per stream": the events a flush holds for a stream reach it together (one
    wake-up of its consumer), in the order added, and the other stream's separately."""
    loop = asyncio.new_event_loop()
    a, b = RequestStream(loop, "a"), RequestStream(loop, "b")
    deliveries = []
    original = RequestStream.deliver_all

    def recording(self, events):
        deliveries.append((self.request_id, [e.text for e in events]))
        original(self, events)

    monkeypatch.setattr(RequestStream, "deliver_all", recording)
    outbox = Outbox()
    outbox.add(a, TextDelta("a0"))
    outbox.add(b, TextDelta("b0"))
    outbox.add_all(a, [TextDelta("a1"), TextDelta("a2")])
    outbox.flush()

    async def read(stream, n):
        return [(await anext(stream)).text for _ in range(n)]

    assert loop.run_until_complete(read(a, 3)) == ["a0", "a1", "a2"]
    assert loop.run_until_complete(read(b, 1)) == ["b0"]
    assert deliveries == [("a", ["a0", "a1", "a2"]), ("b", ["b0"])]
    loop.close()
