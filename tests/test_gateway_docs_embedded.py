"""The "Using Infernix" pages run as written against the real embedded default: the gateway and
an in-process worker over the built-in SmolLM2 on the CPU, built by the same settings and
`open_worker` as `infernix serve` with no flags. Every Python block of each page runs in order
with the official SDK (tests/test_gateway_docs.py runs the same blocks against the scripted fake
worker, which checks the constraint each block sends). A block whose printed output on the
default model is known (a refusal) says so with `embedded_prints`, a regex its output must match
line by line, in its fake-worker comment."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re

import pytest

from tests.fake_worker import GatewayThread, running_gateway
from tests.test_gateway_docs import DEFAULT_URL, PAGES, blocks

pytestmark = pytest.mark.slow


class EmbeddedGateway(GatewayThread):
    """GatewayThread whose worker is the embedded default, opened and closed in its loop."""

    def __init__(self) -> None:
        super().__init__(None)

    async def _serve(self) -> None:
        from services.embedded import WorkerSettings, open_worker

        self.stop = asyncio.Event()
        self.worker = open_worker(WorkerSettings())
        try:
            async with running_gateway(self.worker) as url:
                self.url = url
                self.ready.set()
                await self.stop.wait()
        finally:
            await self.worker.aclose()


@pytest.fixture(scope="module")
def embedded_url():
    gateway = EmbeddedGateway()
    gateway.thread.start()
    assert gateway.ready.wait(120), "the embedded default did not start"
    try:
        yield gateway.url
    finally:
        gateway.loop.call_soon_threadsafe(gateway.stop.set)
        gateway.thread.join(60)
        gateway.loop.close()


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_run_on_the_embedded_default(embedded_url, page):
    """Issue 11 §4 and its follow-up: the pages' examples "run as written against `infernix
    serve` on its default address" -- on the real default model, not only the fake worker: no
    block raises, and a block documented to be refused by the default prints that refusal."""
    namespace: dict = {}
    for n, (spec, code) in enumerate(blocks(page)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace(DEFAULT_URL, embedded_url), f"{page}[{n}]", "exec"),
                 namespace)  # noqa: S102 - our docs
        expected = spec.get("embedded_prints")
        if expected is not None:
            assert re.search(expected, out.getvalue(), re.MULTILINE), (page, n, out.getvalue())
