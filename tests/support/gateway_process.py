"""`infernix gateway serve` as a real process over given workers, for end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


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

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
