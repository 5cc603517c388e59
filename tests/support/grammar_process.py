"""A real grammar service process (`infernix grammar serve`) for tests, and worker-side clients.

The service runs as `python -m services.cli grammar serve` on a free loopback port with the real
SmolLM2 vocabulary, Redis, its Prometheus port and whatever flags a test adds; it can be
SIGKILLed, SIGTERMed and started again on the same ports.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, kill_process, stop_process

ROOT = Path(__file__).resolve().parents[2]


def optional_properties(n: int, tag: str = "") -> dict:
    """An object of `n` optional string properties (2,000 of them: 102 KB of JSON), the shape of
    the issue's slow schemas; `tag` makes a different key."""
    return {"type": "object", "properties": {
        f"field{tag}_{i:04d}": {"type": "string", "maxLength": 64} for i in range(n)}}


# The slow schemas (thousands of properties) emit grammars past the conversion's own size
# limit, and llguidance compiles JSON content lazily in milliseconds; these tests lift the limit and
# compile JSON on xgrammar, so the compile deadline and memory budget are what stops them.
UNBOUNDED_GRAMMARS = {"INFERNIX_MAX_GRAMMAR_BYTES": str(10**9), "INFERNIX_JSON_ENGINE": "xgrammar"}


class GrammarProcess:
    def __init__(self, redis_url: str | None, *flags: str, model: str = "smollm2",
                 env: dict[str, str] | None = None) -> None:
        self.redis_url = redis_url
        self.env = UNBOUNDED_GRAMMARS if env is None else env  # {}: the product's defaults
        self.flags = flags
        self.model = model
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = Path(tempfile.mkdtemp(prefix="infernix-grammar-")) / "grammar.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "services.cli", "grammar", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port), "--models", self.model,
                   "--metrics-port", str(self.metrics_port), *self.flags]
        if self.redis_url:
            command += ["--redis-url", self.redis_url]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                         env={**{k: v for k, v in os.environ.items()
                                                 if k not in UNBOUNDED_GRAMMARS}, **self.env})

    async def wait_healthy(self, timeout: float = 180.0) -> dict:
        from services.grammar.health import ask

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"grammar service exited with {self.proc.returncode}:\n"
                                     f"{self.log.read_text(errors='replace')[-3000:]}")
            try:
                return await ask(self.address, 1.0)
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise AssertionError("grammar service did not become healthy") from None
                await asyncio.sleep(0.2)

    async def ensure_running(self) -> None:
        """Start the service again if a test stopped it; wait until it is healthy."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        await self.wait_healthy()

    async def health(self) -> dict:
        from services.grammar.health import ask

        return await ask(self.address, 3.0)

    async def until(self, predicate, timeout: float = 60.0) -> dict:
        """Poll Health until `predicate(health)` holds; the last reply."""
        deadline = time.monotonic() + timeout
        while True:
            health = await self.health()
            if predicate(health):
                return health
            if time.monotonic() > deadline:
                raise AssertionError(f"health never reached the condition: {health}")
            await asyncio.sleep(0.05)

    def tree_rss_bytes(self) -> int:
        """Resident memory of the service and its compile children now (Linux /proc)."""
        assert self.proc is not None
        total, pending = 0, [self.proc.pid]
        while pending:
            pid = pending.pop()
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                total += 1024 * int(next(line.split()[1] for line in status.splitlines()
                                         if line.startswith("VmRSS:")))
                for task in Path(f"/proc/{pid}/task").iterdir():
                    pending += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, StopIteration):
                continue  # a child that just ended
        return total

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the service's /metrics (0 when absent)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as reply:
            text = reply.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    return sample.value
        return 0.0

    def kill(self) -> None:
        kill_process(self.proc)

    def stop(self) -> None:
        stop_process(self.proc)


def worker_client(service: GrammarProcess, redis_url: str | None, **config):
    """A worker's GrpcGrammarClient: read-only caches on the SmolLM2 vocabulary, fast retries."""
    from services.grammar.cache.grammar_cache import CacheConfig, ModelCaches
    from services.grammar.client import GrpcGrammarClient
    from shared.frontends import get_domain

    retry_s = config.pop("retry_s", 0.2)
    fallback = config.pop("fallback", True)
    caches = ModelCaches.open({service.model: get_domain(service.model)}, redis_url=redis_url,
                              config=CacheConfig(read_only=True, **config))
    return GrpcGrammarClient("127.0.0.1", service.port, caches, retry_s=retry_s,
                             probe_timeout_s=0.5, fallback=fallback)
