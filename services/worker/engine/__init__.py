"""The Engine: request lifecycle, scheduling and the one commit path.

    engine.py       Engine (start, stop, submit, cancel, step) and its worker thread
    pipeline.py     chaining decode step n+1 before step n's commit: hold, advance, drain
    scheduler.py    waiting and resident requests: retire, admit, schedule the next batch
    postprocess.py  the commit path: preview every row -> Program commit -> confirm -> publish
    prepare.py      prepare(request) -> Request: render, output language, OutputSession
    stream.py       RequestStream, the events of one request as an async iterator; the Outbox
"""

from services.worker.engine.engine import Engine, EngineConfig
from services.worker.engine.stream import RequestStream

__all__ = ["Engine", "EngineConfig", "RequestStream"]
