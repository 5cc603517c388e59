"""Shared fixtures: a real redis-server process on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_process(proc: subprocess.Popen | None) -> None:
    """SIGKILL a service process the test started (if it still runs) and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def stop_process(proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """SIGTERM (the graceful stop under test), then SIGKILL if it outlives `timeout`."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen | None
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs it)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir, "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def redis_server():
    """A fresh redis-server for one test; `stop()` / `start()` simulate an outage."""
    workdir = tempfile.mkdtemp(prefix="infernix-redis-")
    server = RedisServer(free_port(), None, workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def pytest_collection_finish(session):
    """The files whose interpreter cases this session runs share one interpreted child pytest
    (tests/support/kernel_backends.py), started now in the background."""
    from tests.support import kernel_backends

    kernel_backends.SESSION_FILES[:] = sorted({str(item.path.resolve()) for item in session.items
                                              if item.name.endswith("_under_interpreter")})
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's basetemp is popen-gwN in a common one
        base = session.config._tmp_path_factory.getbasetemp().parent  # pruned by pytest
        kernel_backends.SHARED_DIR[:] = [base]
    if kernel_backends.SESSION_FILES and not session.config.option.collectonly:
        kernel_backends.start_session_run()


def pytest_sessionfinish(session, exitstatus):
    from tests.support import kernel_backends

    kernel_backends.end_session_run(exitstatus == pytest.ExitCode.INTERRUPTED)


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly on machines without CUDA."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
