"""End to end: `infernix serve` (the README's first command) as a real process with the built-in
model on the CPU, driven by the official `openai` and `anthropic` SDKs (issue 4 §5).

Design document: "A constrained output that completes normally belongs to the declared language or
schema subset"; "Every strict tool's final arguments_json satisfies its argument schema"; protocol
errors "add the original field path".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-infernix"
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = dict(os.environ, INFERNIX_PORT=str(port), INFERNIX_API_KEYS=KEY, INFERNIX_LANES="4",
               INFERNIX_MAX_LEN="1024")
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"infernix-serve-{port}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None, "infernix serve exited early"
        assert time.monotonic() < deadline, "infernix serve did not become healthy"
        time.sleep(0.5)
    # "infernix serve prints one human line when it is ready ... beside its JSON logs, and shows
    # progress while it loads the model."
    human = [ln for ln in log_path.read_text().splitlines() if ln.startswith("infernix: ")]
    assert human == ["infernix: loading smollm2 on cpu ...",
                     f"infernix: serving smollm2 on {base} (OpenAI /v1/chat/completions, "
                     "/v1/responses, /v1/completions, /v1/models; Anthropic /v1/messages)"], human
    try:
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients():
    """Each test's SDK clients are closed after it: an unclosed client's socket would be
    collected, and warned about, in whatever test runs later."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _openai(base: str, key: str = KEY) -> openai.OpenAI:
    _OPEN.append(openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300))
    return _OPEN[-1]


def test_plain_chat_and_models(server: str) -> None:
    client = _openai(server)
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    reply = client.chat.completions.create(
        model="smollm2", max_tokens=12, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens <= 12


def test_json_schema_response_is_valid(server: str) -> None:
    reply = _openai(server).chat.completions.create(
        model="smollm2", max_tokens=80, temperature=0,
        messages=[{"role": "user", "content": "Invent a person with a name and an age, as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_strict_tool_call_streams_argument_deltas(server: str) -> None:
    """Streaming `tool_calls[].function.arguments` deltas reassemble to valid strict arguments."""
    tools = [{"type": "function", "function": {"name": "get_weather", "strict": True,
                                               "description": "Weather for a city",
                                               "parameters": WEATHER}}]
    stream = _openai(server).chat.completions.create(
        model="smollm2", max_tokens=80, temperature=0, stream=True, tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    names, arguments, finish = [], "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            if call.function.name:
                names.append(call.function.name)
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and finish == "tool_calls"
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_anthropic_messages_with_tool_and_schema_error(server: str) -> None:
    client = anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=300)
    _OPEN.append(client)
    message = client.messages.create(
        model="smollm2", max_tokens=120, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER,
                "strict": True}],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    blocks = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and [b.name for b in blocks] == ["get_weather"]
    jsonschema.validate(blocks[0].input, WEATHER)
    bad = dict(WEATHER, properties={**WEATHER["properties"],
                                    "when": {"type": "string", "format": "idn-email"}})
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="smollm2", max_tokens=10,
                               tools=[{"name": "w", "input_schema": bad, "strict": True}],
                               messages=[{"role": "user", "content": "hi"}])
    assert "tools[0].input_schema/properties/when/format" in str(err.value)


def test_errors_name_the_field_and_keys_are_enforced(server: str) -> None:
    client = _openai(server)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="smollm2", max_tokens=5, messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {
                "type": "object",
                "properties": {"link": {"type": "string", "format": "uri-template"}}}}})
    assert err.value.param == "response_format.json_schema.schema/properties/link/format"
    with pytest.raises(openai.AuthenticationError):
        _openai(server, key="wrong").chat.completions.create(
            model="smollm2", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_metrics_cover_gateway_worker_and_grammar_cache(server: str) -> None:
    """Prometheus metrics on one /metrics in embedded mode, labels from fixed enums only."""
    request = urllib.request.Request(
        server + "/metrics", headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    for name in (
        "infernix_gateway_requests_total",
        "infernix_worker_requests_total",
        "infernix_worker_lanes_in_use",
        "infernix_worker_queue_depth",
        "infernix_worker_ttft_seconds",
        "infernix_worker_time_per_token_seconds",
        "infernix_worker_mask_cpu_seconds_total",
        "infernix_grammar_compiles_total",
        "infernix_grammar_cold_compiles_in_flight",
        "infernix_grammar_redis_fallbacks_total",
    ):
        assert name in text, name
    assert 'infernix_worker_requests_total{constraint="json_schema",outcome="stop"}' in text
    assert 'infernix_worker_requests_total{constraint="tools",outcome="tool_calls"}' in text
    assert "Paris" not in text and "properties" not in text  # never request or schema text


def test_first_sigterm_finishes_streams_then_exits() -> None:
    """Issue 4: "the first SIGTERM stops accepting, finishes or cancels in-flight streams with a
    proper terminal event, then exits"."""
    import threading

    port = free_port()
    env = dict(os.environ, INFERNIX_PORT=str(port), INFERNIX_LANES="2", INFERNIX_MAX_LEN="512")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.5)
        client = _openai(base, key="unused")
        stream = client.chat.completions.create(
            model="smollm2", max_tokens=60, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Write a long story about the sea."}])
        chunks = iter(stream)
        first = next(chunks)
        assert first.choices
        threading.Timer(0.1, proc.send_signal, (signal.SIGTERM,)).start()
        rest = list(chunks)  # the stream still ends with its terminal chunk
        finish = [
            c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason
        ]
        assert finish and finish[-1] in ("stop", "length")
        assert proc.wait(timeout=60) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(base + "/healthz", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
