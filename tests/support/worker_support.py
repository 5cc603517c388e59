"""Helpers of the worker engine tests: a tiny random-weight runtime, a greedy oracle that never
uses the engine (full recomputation from a fresh cache for every token), and a model wrapper with
hooks that inject failures (NaN logits, cancellation mid-forward, slow steps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from bench.random_weights import random_runtime
from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.models import KVCache
from services.worker.runtime import ModelRuntime
from shared.frontends.token_domain import TokenDomain
from shared.generation import (
    Finished,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    TextDelta,
)
from tests.support.common import byte_domain


def no_z_domain() -> TokenDomain:
    """The byte test domain with the token of 'z' never generable: a language that needs a 'z'
    has prefixes after which no token is legal (a real dead end, not an injected one)."""
    base = byte_domain()
    return TokenDomain(name="bytes-no-z", token_bytes=base.token_bytes, size=base.size,
                       eos_ids=base.eos_ids, control_ids=base.control_ids,
                       never_ids=frozenset({ord("z")}), special_names=base.special_names)


def tiny_runtime(domain: TokenDomain | None = None, **kw) -> ModelRuntime:
    """A 2-layer float64 random model over the byte test domain (float64 keeps batched and
    isolated arithmetic equal far below any greedy tie)."""
    return random_runtime(
        domain or byte_domain(), dtype=torch.float64, seed=kw.pop("seed", 1), **kw
    )


class HookedModel(nn.Module):
    """Wraps a decoder; `before(tokens, positions, lanes)` runs before each forward and
    `after(logits, positions, lanes)` may edit its logits in place."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.before: Callable | None = None
        self.after: Callable | None = None
        self.calls = 0

    def max_len_for_budget(self, *args, **kwargs):
        return self.inner.max_len_for_budget(*args, **kwargs)

    def new_state(self, *args, **kwargs):
        return self.inner.new_state(*args, **kwargs)

    def forward(self, tokens, positions, cache, lanes, *, kv_len=None, logit_index=None,
                num_tokens=None):
        self.calls += 1
        if self.before is not None:
            self.before(tokens, positions, lanes)
        logits = self.inner(tokens, positions, cache, lanes, kv_len=kv_len, logit_index=logit_index,
                            num_tokens=num_tokens)
        if self.after is not None:
            self.after(logits, positions, lanes)
        return logits


def hooked(runtime: ModelRuntime) -> tuple[ModelRuntime, HookedModel]:
    model = HookedModel(runtime.model)
    return replace(runtime, model=model), model


def open_client(runtime: ModelRuntime, **config):
    return open_in_process(runtime, EngineConfig(**config))


async def until_warm(client, timeout_s: float = 300.0):
    """The engine's warm-up report once health says ok: the warm-up runs on the worker thread
    after the client opens, so what it captured is there only then (None if it never ran)."""
    for _ in range(int(timeout_s / 0.5)):
        if (await client.health())["status"] == "ok":
            break
        await asyncio.sleep(0.5)
    return client.engine.warmup


def greedy(max_tokens: int, **options) -> RequestOptions:
    return RequestOptions(
        max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0), **options
    )


def text_request(
    request_id: str, text: str, options: RequestOptions, model: str
) -> GenerateRequest:
    return GenerateRequest(request_id, PromptInput(text=text), options, model=model)


async def collect(client, request: GenerateRequest) -> tuple[list[str], Finished]:
    """All text deltas and the Finished event of one request."""
    deltas: list[str] = []
    async for event in client.generate(request):
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        elif isinstance(event, Finished):
            return deltas, event
    raise AssertionError("the stream ended without Finished")


@torch.inference_mode()
def oracle_greedy(runtime: ModelRuntime, prompt_ids, max_tokens: int, *,
                  presence: float = 0.0, frequency: float = 0.0) -> list[int]:
    """Greedy decoding without the engine: every token from a fresh cache over the whole sequence,
    never-generable ids excluded, ties to the smaller id, stopping after an EOS."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only wait on each other
    try:
        return _oracle(runtime, prompt_ids, max_tokens, presence, frequency)
    finally:
        torch.set_num_threads(threads)


def _oracle(runtime, prompt_ids, max_tokens, presence, frequency):
    model, domain = runtime.model, runtime.domain
    ids, out = list(prompt_ids), []
    counts: dict[int, int] = {}
    for _ in range(max_tokens):
        dev = runtime.device
        cache = KVCache.allocate(runtime.config, 1, len(ids), runtime.dtype, dev)
        tokens = torch.tensor([ids], device=dev)
        z = model(tokens, torch.arange(len(ids), device=dev)[None], cache,
                  torch.tensor([0], device=dev))[0, -1]
        z = z.double()[:domain.size].cpu()
        z[len(domain.token_bytes):] = float("-inf")
        for t in domain.never_ids:
            z[t] = float("-inf")
        for t, c in counts.items():
            z[t] -= presence + frequency * c
        t = int(torch.argmax(z))  # first maximum: the smaller id
        out.append(t)
        counts[t] = counts.get(t, 0) + 1
        if t in domain.eos_ids:
            break
        ids.append(t)
    return out


def text_of(domain: TokenDomain, tokens) -> str:
    """The published text of committed tokens (EOS is never text)."""
    data = b"".join(domain.token_bytes[t] for t in tokens if t not in domain.eos_ids)
    return data.decode("utf-8", "replace")
