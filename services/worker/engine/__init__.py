"""The Engine: request lifecycle, scheduling and the one commit path.

    engine.py       Engine (start, stop, submit, cancel, step) and its worker thread
    config.py       EngineConfig: lanes, lengths, prefill budget, graphs, speculation, warm-up
    pipeline.py     chaining decode step n+1 (or a prefill step) before step n's commit
    scheduler.py    waiting and resident requests: retire, admit, schedule the next batch
    postprocess.py  the commit path: preview every row -> Program commit -> confirm -> publish
    prepare.py      prepare(request) -> Request: render, output language, OutputSession
    stream.py       RequestStream, the events of one request as an async iterator; the Outbox
"""

from services.worker.engine.config import EngineConfig
from services.worker.engine.engine import Engine
from services.worker.engine.stream import RequestStream

__all__ = ["Engine", "EngineConfig", "RequestStream"]
