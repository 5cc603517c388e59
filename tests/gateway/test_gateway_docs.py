"""The "Using Infernix" pages (issue 11 §4) run as written: every Python block of each page,
in order, with the official SDK, against a real gateway (the scripted fake worker plays the
model; an HTML comment before a block gives its script and the constraint the block must
reach the worker with). The pages also name every documented field the gateway accepts without
using, or refuses, so what they promise is what known.py does."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import anthropic
import openai
import pytest

from services.gateway import known
from shared.contract import ConstraintKind
from tests.support.fake_worker import FakeWorker, GatewayThread, Script, ScriptedCall

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["using-openai-chat.md", "using-openai-responses.md", "using-anthropic-messages.md"]
_BLOCK = re.compile(r"(?:<!-- fake-worker: (?P<script>.*?) -->\n)?```python\n(?P<code>.*?)```",
                    re.DOTALL)
DEFAULT_URL = "http://127.0.0.1:8000"


def blocks(page: str) -> list[tuple[dict, str]]:
    text = (DOCS / page).read_text()
    return [(json.loads(m["script"]) if m["script"] else {}, m["code"])
            for m in _BLOCK.finditer(text)]


def script(spec: dict) -> Script:
    return Script(text=tuple(spec.get("text", ())), reasoning=tuple(spec.get("reasoning", ())),
                  texts=tuple(tuple(t) for t in spec.get("texts", ())),
                  calls=tuple(ScriptedCall(i, n, (a,)) for i, n, a in spec.get("calls", ())),
                  stop_sequence=spec.get("stop_sequence"))


@pytest.fixture(scope="module")
def gateway():
    with GatewayThread(FakeWorker()) as gw:
        yield gw


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_run(gateway, page):
    """Issue 11 §4: "a short 'Using Infernix' page per protocol ... with runnable SDK examples
    that a test executes"; each constrained example reaches the worker with its constraint."""
    found = blocks(page)
    assert len(found) >= 5, page
    namespace: dict = {}
    try:
        _run_blocks(gateway, page, found, namespace)
    finally:  # the page's clients, as a reader would close them; else their sockets are
        # collected, and warned about, in some later test
        for value in namespace.values():
            if isinstance(value, (openai.OpenAI, anthropic.Anthropic)):
                value.close()


def _run_blocks(gateway, page: str, found: list[tuple[dict, str]], namespace: dict) -> None:
    for n, (spec, code) in enumerate(found):
        gateway.worker.reset(script(spec))
        source = code.replace(DEFAULT_URL, gateway.url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, f"{page}[{n}]", "exec"), namespace)  # noqa: S102 - our docs
        expect = spec.get("expect")
        if expect is None:
            continue
        assert gateway.worker.requests, (page, n)
        request = gateway.worker.requests[0]
        if expect == "tools":
            assert request.prompt.tools, (page, n)
        else:
            assert request.options.constraint.kind is ConstraintKind(expect), (page, n)


@pytest.mark.parametrize("page, shapes", [
    ("using-openai-chat.md", [known.CHAT, known.COMPLETIONS, known.CHAT_MESSAGE["assistant"]]),
    ("using-openai-responses.md", [known.RESPONSES, known.RESPONSES_TEXT]),
    ("using-anthropic-messages.md", [known.MESSAGES, known.MESSAGES_TOOL,
                                     known.MESSAGES_TOOL_RESULT, known.MESSAGES_OUTPUT_CONFIG]),
])
def test_the_pages_name_what_is_accepted_and_refused(page, shapes):
    """Every field a protocol object accepts without using, or refuses unless at its no-op
    value, is named on its page."""
    text = (DOCS / page).read_text()
    for shape in shapes:
        for name in sorted(shape.inert | set(shape.neutral)):
            if name == "async_":
                continue  # the SDK's model_dump spelling of `async`, not a documented field
            assert re.search(rf"[`.]{re.escape(name)}\b", text), (page, shape.name, name)
