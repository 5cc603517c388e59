"""Fixtures of the gateway tests on the real embedded default: the built-in SmolLM2 on the CPU
behind a real gateway, built by the same settings and `open_worker` as `infernix serve` with no
flags. Loading the model is the costly part, so one such gateway serves the whole test session
(every module that asks for `gateway_url`, `chat` or `claude`); it runs in its own thread and
event loop, and each module's SDK clients reach it over HTTP from the module's loop."""

from __future__ import annotations

import anthropic
import openai
import pytest
import pytest_asyncio

from tests.support.fake_worker import InProcessGateway


def _open_default():
    from services.embedded import WorkerSettings, open_worker

    return open_worker(WorkerSettings())


@pytest.fixture(scope="session")
def gateway_url():
    """The base URL of the session's embedded default gateway."""
    with InProcessGateway(_open_default) as gateway:
        yield gateway.url


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
