"""The in-process WorkerClient (embedded mode): the gateway's view of an Engine in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry

from services.grammar.client import GrammarClient, in_process_client
from services.worker.engine import Engine, EngineConfig
from services.worker.runtime import ModelRuntime
from shared.errors import InvalidRequest
from shared.generation import (
    GenerateRequest,
    GenerationEvent,
    PromptInput,
    WorkerClient,
)
from shared.metrics import WorkerMetrics


class InProcessWorkerClient(WorkerClient):
    """`generate` yields the Engine's events for one request (TextDelta ... Finished); request
    errors raise before the first event. Leaving the iteration early cancels the request."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def models(self) -> list[str]:
        return [self.engine.runtime.name]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationEvent]:
        stream = await self.engine.submit(request)
        try:
            async for event in stream:
                yield event
        finally:
            if not stream.finished:
                self.engine.cancel(request.request_id)

    async def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)

    async def count_tokens(self, prompt: PromptInput, model: str) -> int:
        """Rendered prompt tokens; raises InvalidRequest(field="model") for another model."""
        if model != self.engine.runtime.name:
            raise InvalidRequest(f"model {model!r} is not served here; expected "
                                 f"{self.engine.runtime.name!r}", field="model")
        return await asyncio.to_thread(self.engine.count_tokens, prompt)

    async def health(self) -> dict[str, Any]:
        """The engine's state and the grammar client's (`grammar`), with `degraded` (a dependency
        is missing but requests are served) and `ready` (constrained requests can be served now;
        `missing` names what is not)."""
        health = self.engine.health()
        grammar = await self.engine.grammar.health()
        health["grammar"] = grammar
        health["degraded"] = bool(grammar.get("degraded"))
        health["ready"] = health["status"] == "ok" and bool(grammar.get("ready", True))
        health["missing"] = list(grammar.get("missing", ()))
        return health

    async def drain(self, seconds: float) -> None:
        """Wait up to `seconds` for the engine's requests to finish, then cancel the rest and wait
        for their terminal events (a few steps)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, seconds)
        while self.engine.live_requests() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        left = self.engine.live_requests()
        for request_id in left:
            self.engine.cancel(request_id)
        while self.engine.live_requests() and loop.time() < deadline + 10.0:
            await asyncio.sleep(0.02)

    async def aclose(self) -> None:
        """Stop the engine (unfinished requests finish as cancelled) and close its grammar
        client."""
        await asyncio.to_thread(self.engine.stop)
        await self.engine.grammar.close()


def open_in_process(runtime: ModelRuntime, config: EngineConfig = EngineConfig(), *,
                    grammar: GrammarClient | None = None,
                    registry: CollectorRegistry | None = None) -> InProcessWorkerClient:
    """A started Engine over `runtime` behind an InProcessWorkerClient. Without `grammar`, an
    in-process grammar client with an in-memory cache for the runtime's model. Metrics go to
    `registry` (a fresh one when None)."""
    if grammar is None:
        grammar = in_process_client({runtime.name: runtime.domain}, registry=registry)
    engine = Engine(runtime, grammar, config, WorkerMetrics(registry))
    engine.start()
    return InProcessWorkerClient(engine)
