"""The "Using Infernix" pages run as written against the real embedded default: the gateway and
an in-process worker over the built-in SmolLM2 on the CPU, built by the same settings and
`open_worker` as `infernix serve` with no flags (the session's `gateway_url`,
tests/gateway/conftest.py). Every Python block of each page runs in order
with the official SDK (tests/gateway/test_gateway_docs.py runs the same blocks against the scripted
fake worker, which checks the constraint each block sends). A block whose printed output on the
default model is known (a refusal) says so with `embedded_prints`, a regex its output must match
line by line, in its fake-worker comment."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.gateway.test_gateway_docs import DEFAULT_URL, PAGES, blocks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_run_on_the_embedded_default(gateway_url, page):
    """Issue 11 §4 and its follow-up: the pages' examples "run as written against `infernix
    serve` on its default address" -- on the real default model, not only the fake worker: no
    block raises, and a block documented to be refused by the default prints that refusal."""
    namespace: dict = {}
    for n, (spec, code) in enumerate(blocks(page)):
        out = io.StringIO()
        source = code.replace(DEFAULT_URL, gateway_url)
        with contextlib.redirect_stdout(out):
            exec(compile(source, f"{page}[{n}]", "exec"), namespace)  # noqa: S102 - our docs
        expected = spec.get("embedded_prints")
        if expected is not None:
            assert re.search(expected, out.getvalue(), re.MULTILINE), (page, n, out.getvalue())
