"""Served model names (`--served-model-name`, as vLLM users know it): the names clients call a
worker's model by, in place of its own name (a checkpoint directory's path, as given).

`AliasedWorker` wraps a WorkerClient: `models()` lists the aliases, and a request naming one
reaches the worker under the model's own name; the reply still names what the client asked for
(the gateway echoes the request's model). The worker's own name is no longer served, so a client
sees one set of names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shared.generation import GenerateRequest, PromptInput, WorkerClient


class AliasedWorker(WorkerClient):
    """`worker` serving its one model `target` under `aliases` (at least one, first listed
    first)."""

    def __init__(self, worker: WorkerClient, target: str, aliases: tuple[str, ...]) -> None:
        if not aliases:
            raise ValueError("at least one served model name")
        self.worker = worker
        self.target = target
        self.aliases = tuple(dict.fromkeys(aliases))

    def _own(self, model: str) -> str:
        # An unknown name passes unchanged: the gateway's model check has refused it already.
        return self.target if model in self.aliases else model

    async def models(self) -> list[str]:
        return list(self.aliases)

    def generate(self, request: GenerateRequest):
        return self.worker.generate(dataclasses.replace(request, model=self._own(request.model)))

    async def cancel(self, request_id: str) -> None:
        await self.worker.cancel(request_id)

    async def count_tokens(self, prompt: PromptInput, model: str) -> int:
        return await self.worker.count_tokens(prompt, self._own(model))

    async def health(self) -> dict[str, Any]:
        return await self.worker.health()

    async def drain(self, seconds: float) -> None:
        await self.worker.drain(seconds)

    async def aclose(self) -> None:
        await self.worker.aclose()
