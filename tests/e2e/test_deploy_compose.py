"""docker-compose.yml cannot rot: its services start as local processes with the commands and
environment parsed from the file, and requests go through them (issue 4 §3).

CI has no Docker engine, so each service runs as the process its `command` names, with its
`environment`; service host names are rewritten to 127.0.0.1 and ports to free ones, and the worker
runs on the CPU. Also checked here: a schema compiled once through the grammar service is a Redis
hit for a second worker process (issue 4 §5), every service's metrics answer on the port the file
gives it, and the health checks import nothing heavy (issue 12 §8).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "population": {"type": "integer", "minimum": 0}},
          "required": ["city", "population"], "additionalProperties": False}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


class Stack:
    """The compose services as local processes; `rewrite` maps service:port to loopback ports."""

    def __init__(self) -> None:
        self.compose = _compose()["services"]
        self.ports = {name: free_port() for name in self.compose}
        self.extra_ports: dict[str, int] = {}
        self.metrics_ports: dict[str, int] = {}  # process name -> its free metrics port
        self.procs: dict[str, subprocess.Popen] = {}
        self.workdir = tempfile.mkdtemp(prefix="infernix-compose-")

    def rewrite(self, value: str) -> str:
        for name, port in {**self.ports, **self.extra_ports}.items():
            base = name.split("#")[0]
            for default in ("6379", "50051", "50052", "8000"):
                value = value.replace(f"{base}:{default}", f"127.0.0.1:{port}") \
                    if name == base else value
        return value

    def env(self, service: str, port: int, name: str) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in (self.compose[service].get("environment") or {}).items():
            env[key] = self.rewrite(str(value))
        env["INFERNIX_HOST"] = "127.0.0.1"
        env["INFERNIX_PORT"] = str(port)
        if "INFERNIX_METRICS_PORT" in env:  # one loopback for every process: free ports
            self.metrics_ports[name] = free_port()
            env["INFERNIX_METRICS_PORT"] = str(self.metrics_ports[name])
        if service == "worker":
            env["INFERNIX_DEVICE"] = "cpu"  # CI has no GPU; everything else as in the file
            env["INFERNIX_LANES"] = "2"
            env["INFERNIX_MAX_LEN"] = "1024"
        return env

    def start(self, service: str, *, name: str | None = None, port: int | None = None) -> None:
        name = name or service
        port = port or self.ports[service]
        command = list(self.compose[service]["command"])
        if service == "redis":
            command = [shutil.which("redis-server") or "redis-server", *command[1:],
                       "--port", str(port), "--bind", "127.0.0.1", "--dir", self.workdir]
            env = dict(os.environ)
        else:
            assert command[0] == "infernix", command
            command = [sys.executable, "-m", "services.cli", *command[1:]]
            env = self.env(service, port, name)
        with open(Path(self.workdir) / f"{name}.log", "wb") as log:  # the child keeps its own copy
            self.procs[name] = subprocess.Popen(command, env=env, cwd=ROOT,
                                                stdout=subprocess.DEVNULL, stderr=log)

    def wait_healthy(self, service: str, *, port: int | None = None, timeout: float = 180) -> None:
        """Run the service's own health check command (addresses rewritten)."""
        port = port or self.ports[service]
        test = self.compose[service]["healthcheck"]["test"][1:]
        if test[0] == "redis-cli":
            test = [shutil.which("redis-cli") or "redis-cli", "-p", str(port), *test[1:]]
        elif test[0] == "infernix":
            test = [sys.executable, "-m", "services.cli", *test[1:]]
            test = [t.replace("127.0.0.1:50051", f"127.0.0.1:{port}")
                    .replace("127.0.0.1:50052", f"127.0.0.1:{port}") for t in test]
        else:
            test = [sys.executable if t == "python" else
                    t.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                    .replace("127.0.0.1:50051", f"127.0.0.1:{port}") for t in test]
        deadline = time.monotonic() + timeout
        while True:
            if subprocess.run(test, capture_output=True).returncode == 0:
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    log = (Path(self.workdir) / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n{log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{service} did not become healthy")
            time.sleep(0.5)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    try:
        s.start("redis")
        s.wait_healthy("redis")
        # The processes start side by side (their model loads overlap); the health checks keep the
        # file's dependency order. worker2 is the second worker of the Redis-hit check; the gateway
        # knows only the file's worker.
        s.extra_ports["worker2"] = free_port()
        s.start("grammar")
        s.start("worker")
        s.start("worker", name="worker2", port=s.extra_ports["worker2"])
        s.start("gateway")
        s.wait_healthy("grammar")
        s.wait_healthy("worker")
        s.wait_healthy("worker", port=s.extra_ports["worker2"])
        s.wait_healthy("gateway")
        yield s
    finally:
        s.stop()


def _metric(port: int, name: str, **labels: str) -> float | None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_compose_file_declares_the_four_services_with_health_checks() -> None:
    """Issue 12 §8: 'expose every service's metrics in the compose file'; the grammar health
    check is the light module (no xgrammar import)."""
    services = _compose()["services"]
    assert set(services) == {"redis", "grammar", "worker", "gateway"}
    assert all("healthcheck" in s for s in services.values())
    for name in ("grammar", "worker"):
        port = services[name]["environment"]["INFERNIX_METRICS_PORT"]
        assert int(port) > 0 and port in services[name]["expose"]
    assert services["grammar"]["healthcheck"]["test"][1:4] == ["python", "-m",
                                                                "services.grammar.health"]
    worker = services["worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert any(v.endswith(":ro") for v in worker["volumes"])
    for service in services.values():  # every setting is an INFERNIX_* variable
        assert all(k.startswith("INFERNIX_") for k in (service.get("environment") or {}))


# What a service needs beyond its drain to end: cancelling the rest with their terminal events,
# closing its server, leaving the interpreter.
STOP_MARGIN_S = 10.0


def _seconds(text: str) -> float:
    """A compose duration ("45s", "1m30s", "500ms")."""
    import re

    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    assert parts and "".join(n + u for n, u in parts) == str(text), text
    return sum(float(n) * units[u] for n, u in parts)


def _drain_of(service: dict, monkeypatch) -> float:
    """How long the service's command drains on SIGTERM, read from the code: the command line
    parsed by the CLI's own parser under the service's environment (a command without a drain
    setting stops at once)."""
    from services.cli import build_parser

    with monkeypatch.context() as m:
        for key, value in (service.get("environment") or {}).items():
            m.setenv(key, str(value))
        for key in [k for k in os.environ if k.startswith("INFERNIX_")
                    and k not in (service.get("environment") or {})]:
            m.delenv(key)
        args = build_parser().parse_args(service["command"][1:])
    return float(getattr(args, "drain_seconds", 0.0) or 0.0)


def test_every_service_may_finish_its_drain_before_docker_kills_it(monkeypatch) -> None:
    """Issue: "`docker compose stop` loses the gateway's streams. The gateway drains for 30 s on
    SIGTERM, but its compose service has no `stop_grace_period` (Docker's default is 10 s) ...
    A test reads `docker-compose.yml` and checks that every service's grace period exceeds its
    drain." Docker sends SIGKILL once the grace period (default 10 s) ends."""
    services = _compose()["services"]
    checked = []
    for name, service in services.items():
        if service.get("command", [""])[0] != "infernix":
            continue  # redis: no drain (nothing saved: --save "")
        drain = _drain_of(service, monkeypatch)
        grace = _seconds(service.get("stop_grace_period", "10s"))
        assert grace >= drain + STOP_MARGIN_S, (name, grace, drain)
        checked.append((name, drain))
    drains = dict(checked)
    assert set(drains) == {"grammar", "worker", "gateway"}
    assert drains["worker"] > 0 and drains["gateway"] > 0  # both drain; the grammar service not


def test_requests_flow_through_the_compose_services(stack: Stack) -> None:
    """The openai SDK against the gateway: plain chat, and a JSON Schema response validated with
    jsonschema; then a second worker process finds the schema's grammar in Redis."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{stack.ports['gateway']}/v1", api_key="unused",
                    max_retries=0, timeout=300)
    plain = client.chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert plain.choices[0].message.content
    structured = client.chat.completions.create(
        model="smollm2", max_tokens=120, temperature=0,
        messages=[{"role": "user", "content": "Give a city and its population as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}})
    choice = structured.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)

    # A second worker process on the same grammar service and Redis: the schema is a Redis hit.
    second = stack.extra_ports["worker2"]
    from services.worker.remote import GrpcWorkerClient
    from shared.contract import OutputConstraint
    from shared.generation import (
        ChatMessage,
        GenerateRequest,
        PromptInput,
        RequestOptions,
        SamplingParams,
    )

    async def ask() -> dict:
        worker = GrpcWorkerClient("127.0.0.1", second)
        try:
            request = GenerateRequest(
                "second-worker", PromptInput(messages=(ChatMessage("user", "City as JSON."),)),
                RequestOptions(max_tokens=4, sampling=SamplingParams(temperature=0),
                               constraint=OutputConstraint.json_schema(SCHEMA)))
            events = [e async for e in worker.generate(request)]
            return events[-1].constraint
        finally:
            await worker.aclose()

    report = asyncio.run(ask())
    # The grammar service compiled the schema once; the second worker got it from the service:
    # its blob when the store policy keeps it, else the verdict, and then compiled it itself
    # (faster than loading it: docs/benchmarks.md, "Grammar store policy").
    grammar_metrics = stack.metrics_ports["grammar"]
    assert _metric(grammar_metrics, "infernix_grammar_compiles_total", model="smollm2",
                   outcome="built") == 1
    assert _metric(grammar_metrics, "infernix_grammar_compiles_total", model="smollm2",
                   outcome="l1") >= 1
    assert (report["cache"], report["built"]) in (("service", False), (None, True)), report

    # The workers' grammar-side fault counters are on their own /metrics (none fired here).
    for name in ("worker", "worker2"):
        port = stack.metrics_ports[name]
        assert _metric(port, "infernix_grammar_service_up") == 1
        assert _metric(port, "infernix_grammar_redis_fallbacks_total") == 0
        assert _metric(port, "infernix_grammar_service_failures_total") == 0


def test_every_health_check_of_the_file_imports_nothing_heavy() -> None:
    """Issue 12 §8: 'the compose health checks answer in well under their 5 s timeout (today the
    check imports xgrammar: 3.3 s idle, 8-18 s under load)'. Each of the file's Python health
    checks (grammar, worker, gateway), run as the file says against a closed port, fails cleanly
    and loads neither xgrammar, torch, numpy nor transformers."""
    closed = f"127.0.0.1:{free_port()}"
    checked = []
    for name, service in _compose()["services"].items():
        test = service["healthcheck"]["test"][1:]
        if test[0] not in ("python", "infernix"):
            continue  # redis-cli
        argv = [t.replace("127.0.0.1:50051", closed).replace("127.0.0.1:50052", closed)
                .replace("127.0.0.1:8000", closed) for t in test]
        if argv[0] == "infernix":
            run = f"sys.argv = {['infernix', *argv[1:]]!r}; runpy.run_module('services.cli', " \
                  "run_name='__main__')"
        elif argv[1] == "-m":
            run = f"sys.argv = {argv[2:]!r}; runpy.run_module({argv[2]!r}, run_name='__main__')"
        else:
            run = argv[2]
        code = (f"import sys, runpy\ntry:\n    {run}\nexcept BaseException as e:\n"
                "    print('failed', type(e).__name__)\n"
                "print(sorted(m for m in ('xgrammar', 'torch', 'numpy', 'transformers') "
                "if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        lines = out.stdout.strip().splitlines()
        assert lines and lines[-1] == "[]", (name, out.stdout, out.stderr)
        assert any(line.startswith("failed") for line in lines), (name, out.stdout)
        checked.append(name)
    assert sorted(checked) == ["gateway", "grammar", "worker"]
