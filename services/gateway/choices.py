"""The worker generations behind one protocol response: one per choice.

OpenAI's `n` (and a completions `prompt` list) asks for several independent choices; each is its
own worker request (its own seed, its own matcher), so constrained choices are each valid. A
request with one choice takes the plain path: no tasks, events as they come.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from dataclasses import dataclass
from typing import AsyncIterator

from services.gateway.generation import Generation, PromptCounts
from shared.generation import Finished, GenerateRequest, GenerationEvent, Usage, WorkerClient


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index`: None stays None (each request draws its own); choice 0 keeps
    the caller's seed (so n=1 and the first of n agree); others get a 63-bit hash of (seed, i)."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def choice_requests(request: GenerateRequest, n: int) -> tuple[GenerateRequest, ...]:
    """`n` requests for `n` choices of one prompt, each with its own id and derived seed
    (choice 0 is `request` itself)."""
    out = [request]
    for i in range(1, n):
        sampling = dataclasses.replace(request.options.sampling,
                                       seed=choice_seed(request.options.sampling.seed, i))
        options = dataclasses.replace(request.options, sampling=sampling)
        out.append(dataclasses.replace(request, request_id=f"{request.request_id}-{i}",
                                       options=options))
    return tuple(out)


@dataclass(frozen=True)
class Results:
    """Every choice's Finished, in choice order, and the response's usage: each distinct prompt
    counted once (`per_prompt` choices share one), completions summed over choices."""

    finished: tuple[Finished, ...]
    counts: tuple[PromptCounts | None, ...]
    per_prompt: int = 1

    @property
    def first(self) -> Finished:
        return self.finished[0]

    @property
    def prompt_tokens(self) -> int:
        return sum(f.usage.prompt_tokens for f in self.finished[::self.per_prompt])

    @property
    def completion_tokens(self) -> int:
        return sum(f.usage.completion_tokens for f in self.finished)

    @property
    def reasoning_tokens(self) -> int:
        return sum(f.usage.reasoning_tokens for f in self.finished)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the worker's prefix cache held: known at admission, so reported in
        Finished's usage (a Started event may carry it too)."""
        pairs = zip(self.finished[::self.per_prompt], self.counts[::self.per_prompt])
        return sum(
            max(f.usage.cached_tokens, c.cached_tokens if c is not None else 0) for f, c in pairs
        )

    @property
    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, cached_tokens=self.cached_tokens,
                     reasoning_tokens=self.reasoning_tokens)

    def summary(self) -> Finished:
        """The first choice's Finished with the summed usage (for the request_done record)."""
        return dataclasses.replace(self.first, usage=self.usage)


class Choices:
    """Start, follow and close the generations of one response."""

    def __init__(self, worker: WorkerClient, requests: tuple[GenerateRequest, ...],
                 per_prompt: int = 1) -> None:
        assert requests, "at least one choice"
        self.generations = [Generation(worker, r) for r in requests]
        self.per_prompt = per_prompt
        self._pumps: list[asyncio.Task] = []  # one per choice while events() merges them

    @property
    def counts(self) -> PromptCounts | None:
        """The first choice's prompt counts (its Started event), if the worker sent them."""
        return self.generations[0].counts

    @property
    def first_output_at(self) -> float | None:
        times = [g.first_output_at for g in self.generations if g.first_output_at is not None]
        return min(times) if times else None

    async def start(self) -> None:
        """Start every choice; the first failure (in choice order) is raised after all settle."""
        results = await asyncio.gather(*(g.start() for g in self.generations),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def results(self, finished: list[Finished]) -> Results:
        return Results(tuple(finished), tuple(g.counts for g in self.generations),
                       self.per_prompt)

    async def collect(self) -> list[Finished]:
        """Every choice's Finished, in choice order (raises what a generation raises)."""
        if len(self.generations) == 1:
            return [await self.generations[0].collect()]
        return list(await asyncio.gather(*(g.collect() for g in self.generations)))

    async def events(self) -> AsyncIterator[tuple[int, GenerationEvent]]:
        """(choice index, event) in arrival order; each choice ends with its Finished."""
        if len(self.generations) == 1:
            async for event in self.generations[0].events():
                yield 0, event
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, generation: Generation) -> None:
            try:
                async for event in generation.events():
                    await queue.put((index, event, None))
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
                await queue.put((index, None, exc))

        self._pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(self.generations)]
        try:
            done = 0
            while done < len(self._pumps):
                index, event, exc = await queue.get()
                if exc is not None:
                    raise exc
                if isinstance(event, Finished):
                    done += 1
                yield index, event
        finally:
            await self._stop_pumps()

    async def _stop_pumps(self) -> None:
        pumps, self._pumps = self._pumps, []
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    async def close(self) -> None:
        """Stop following the choices and close every generation (cancelling at the worker what
        has not finished). Safe to call while `events()` is suspended."""
        await self._stop_pumps()
        await asyncio.gather(*(g.close() for g in self.generations))
