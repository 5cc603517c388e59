"""`infernix serve` as an operator meets it: `--served-model-name` (several aliases, as vLLM
users expect), a busy port refused in one line before the model loads, a banner that lists every
endpoint, and help text that says what the server does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from services.cli import build_parser
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_busy_port_is_one_line_and_exit_2_before_loading():
    """"a busy port gives a 25-line traceback after the model has loaded (one line, exit 2,
    before loading)"."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "services.cli", "serve", "--port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        elapsed = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"infernix: --port {port}: ") and "in use" in lines[0]
    assert "loading" not in done.stderr and elapsed < 30


def test_serve_help_says_the_prefix_cache_serves_hybrid_models():
    """The help no longer claims that hybrid models run without the prefix cache (they use it)."""
    serve = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
                 and "serve" in a.choices).choices["serve"]
    text = serve.format_help()
    assert "run without it" not in text and "--served-model-name NAME [NAME ...]" in text


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as reply:
        return json.loads(reply.read())


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.slow
def test_served_model_names_are_the_names_clients_use(tmp_path):
    """`--served-model-name a b` (or INFERNIX_SERVED_MODEL_NAME=a,b): /v1/models lists the
    aliases, a request may name any of them and its reply names what it asked for, the model's
    own name is no longer served; the banner names the aliases and every endpoint."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "serve", "--port", str(port), "--lanes", "1",
             "--max-len", "256", "--served-model-name", "tiny", "tiny-chat"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                _get(base + "/healthz")
                break
            except OSError:
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "serve did not become healthy"
                time.sleep(0.5)
        human = [ln for ln in log_path.read_text().splitlines() if ln.startswith("infernix: ")]
        assert human[-1] == (f"infernix: serving tiny, tiny-chat on {base} (OpenAI "
                             "/v1/chat/completions, /v1/responses, /v1/completions, /v1/models; "
                             "Anthropic /v1/messages)"), human
        assert [m["id"] for m in _get(base + "/v1/models")["data"]] == ["tiny", "tiny-chat"]
        ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        status, reply = _post(base + "/v1/chat/completions", {**ask, "model": "tiny-chat"})
        assert status == 200 and reply["model"] == "tiny-chat", reply
        status, reply = _post(base + "/v1/completions",
                              {"model": "tiny", "prompt": "Hello", "max_tokens": 2})
        assert status == 200 and reply["model"] == "tiny", reply
        status, reply = _post(base + "/v1/chat/completions", {**ask, "model": "smollm2"})
        assert status == 404 and reply["error"]["param"] == "model", reply
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
