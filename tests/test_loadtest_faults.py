"""Issue 12, the load test under faults: the compose stack as real processes (redis-server, the
grammar service, two workers, the gateway; gRPC and HTTP on loopback) serves the load-test mix
(loadtest/scenarios.py through loadtest/run.py: plain, JSON Schema, regex, choice and tool
constraints, streaming and not, chat, Responses, Anthropic messages and completions) while Redis,
the grammar service and one worker are SIGKILLed and started again.

"Done when: ... a load test in the suite (bounded in time) runs a mixed workload while Redis, the
grammar service and one worker are killed and restarted, and counts 0 lost requests (every request
ends with a response or a terminal event, and every failure is typed)."

The workers are `infernix worker serve` with small random weights over the SmolLM2 vocabulary
(tests/tiny_worker.py), so a step costs milliseconds on a CPU; everything else is the product's
own command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import free_port
from tests.grammar_process import GrammarProcess
from tests.tiny_worker import WorkerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtest"))
from run import one_request, run_mix, summarize  # noqa: E402
from scenarios import Scenario  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


class GatewayProcess:
    """`infernix gateway serve` over the given workers on a free loopback port."""

    def __init__(self, *workers: str) -> None:
        self.port = free_port()
        self.workers = workers
        self.log = Path(tempfile.mkdtemp(prefix="infernix-gateway-")) / "gateway.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "services.cli", "gateway", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port)]
        for worker in self.workers:
            command += ["--worker", worker]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                         env={**os.environ, "INFERNIX_LOG_LEVEL": "INFO"})

    def healthz(self) -> dict | None:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as reply:
                return json.loads(reply.read())
        except OSError:
            return None

    def get(self, path: str) -> tuple[int, dict]:
        """(status, JSON body) of a GET, error statuses included."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    async def until_workers_healthy(self, n: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            health = await asyncio.to_thread(self.healthz)
            if health is not None and (health.get("worker") or {}).get("healthy") == n:
                return
            assert time.monotonic() < deadline, f"the gateway never saw {n} workers: {health}"
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _metric(port: int, name: str) -> float:
    """The sum of a metric's samples on a service's /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


async def _until(predicate, timeout: float = 120.0) -> None:
    """Wait for a condition of the processes (not a timing assertion: the bound only ends a
    test that would otherwise hang)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, "the condition was not reached"
        await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_a_mixed_load_loses_nothing_while_redis_grammar_and_a_worker_are_killed(
        redis_server):
    # Compiles in threads: the children of process isolation (tests/test_grammar_reliability.py)
    # would triple the processes starting on two cores; what is tested here is what the client
    # sees while processes die and come back.
    isolation = ("--compile-isolation", "thread")
    grammar = GrammarProcess(redis_server.url, *isolation)
    worker_flags = ("--grammar", grammar.address, "--redis-url", redis_server.url, "--lanes", "4",
                    "--max-len", "2048", "--grammar-retry-s", "0.5", *isolation)
    workers = [WorkerProcess(*worker_flags, name=f"worker{i}") for i in (1, 2)]
    gateway = GatewayProcess(*(w.address for w in workers))
    processes = [grammar, *workers, gateway]
    began = time.perf_counter()
    phases: dict[str, float] = {}

    def mark(phase: str) -> None:
        phases[phase] = round(time.perf_counter() - began, 1)

    try:
        for process in processes:  # side by side: their imports and loads overlap
            process.start()
        await grammar.wait_healthy()
        await asyncio.gather(*(w.wait_healthy() for w in workers))
        await gateway.until_workers_healthy(2)
        mark("started")

        stop = asyncio.Event()
        load = asyncio.ensure_future(run_mix(gateway.url, stop=stop, concurrency=4, seed=12,
                                             max_tokens=12, timeout_s=45))
        killed, survivor = workers
        await asyncio.sleep(2.0)  # the mix warms the caches
        redis_server.stop()  # SIGKILL
        await asyncio.sleep(1.5)
        grammar.kill()
        await asyncio.sleep(1.5)
        killed.kill()
        await asyncio.sleep(1.5)
        # The survivor saw the outage (its probe, or a compile, marked the service down).
        await _until(lambda: _metric(survivor.metrics_port, "infernix_grammar_service_up") == 0)
        # A grammar nobody compiled before, while Redis, the grammar service and the other
        # worker are down: the survivor builds it in process and answers.
        fresh = Scenario("fresh_regex", 1, "/v1/chat/completions", {
            "model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "Go."}],
            "structured_outputs": {"regex": "outage-[0-9]{2}"}})
        async with aiohttp.ClientSession() as session:
            during = await one_request(session, gateway.url, fresh, 120)
        # Liveness stays 200 and says degraded; readiness names what is missing.
        await _until(lambda: set(gateway.get("/readyz")[1].get("missing", ())) >=
                     {"grammar_service", "redis", "worker"})
        live, ready = gateway.get("/healthz"), gateway.get("/readyz")
        redis_server.start()
        grammar.start()
        killed.start()
        mark("restarting")
        await asyncio.gather(grammar.wait_healthy(), killed.wait_healthy())
        await gateway.until_workers_healthy(2)
        await _until(lambda: _metric(survivor.metrics_port, "infernix_grammar_service_up") == 1)
        mark("back")
        await asyncio.sleep(2.0)  # the mix runs on the recovered stack
        stop.set()
        outcomes = await asyncio.wait_for(load, 60)
        mark("done")
        fallbacks = _metric(survivor.metrics_port, "infernix_grammar_service_fallbacks_total")
    finally:
        for process in reversed(processes):
            process.stop()
    summary = summarize(outcomes)
    print(json.dumps({"phases_s": phases, **summary}, indent=2))
    assert summary["lost"] == 0 and summary["untyped"] == 0, summary["bad"]
    assert summary["ok"] >= 20, summary
    assert set(summary["by_scenario"]) >= {"chat", "chat_stream", "json_schema", "chat_regex",
                                           "responses_json_stream", "anthropic_tool"}, summary
    # New grammars of the outage (a fresh regex almost every chat_regex request, and the one sent
    # above) were compiled in process by the survivor.
    assert during.outcome == "ok", during
    assert live[0] == 200 and live[1]["degraded"] is True, live
    assert ready[0] == 200 and ready[1]["status"] == "ready", ready  # degraded, but it serves
    assert fallbacks >= 1, fallbacks
