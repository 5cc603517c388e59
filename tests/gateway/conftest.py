"""Fixtures of the gateway tests on the real embedded default: the built-in SmolLM2 on the CPU
behind a real gateway, one per test module (its event loop is the module's), and the official
SDK clients on it."""

from __future__ import annotations

import anthropic
import openai
import pytest_asyncio

from tests.support.fake_worker import running_gateway


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway_url():
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    worker = open_in_process(load_runtime(), EngineConfig(max_batch=2, max_len=1024))
    try:
        async with running_gateway(worker) as url:
            yield url
    finally:
        await worker.aclose()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chat(gateway_url):
    async with openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="k", max_retries=0,
                                  timeout=300) as sdk:
        yield sdk


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def claude(gateway_url):
    async with anthropic.AsyncAnthropic(base_url=gateway_url, api_key="k", max_retries=0,
                                        timeout=300) as sdk:
        yield sdk
