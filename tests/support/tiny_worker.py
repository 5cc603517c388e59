"""`infernix worker serve` with small random weights, for tests with real worker processes.

`python -m tests.support.tiny_worker ARGS...` runs the real command line (`services.cli
main(["worker", "serve", *ARGS])`: its settings, grammar client, metrics port, gRPC service and
drain) with one change: the built-in model's weights are a 2-layer random-weight decoder over the
SmolLM2 vocabulary and Frontend (chat template, tokenizer, tool formats), so the grammar service
compiles for the same vocabulary and a step costs milliseconds on a CPU. Structure only, never a
quality claim: the output text is noise, constrained output is still exactly in its language.
"""

from __future__ import annotations

import sys
from dataclasses import replace


def tiny_smollm2_runtime(model=None, *, device="cpu", dtype=None, hidden_size=32, num_heads=2,
                         num_kv_heads=1, max_position_embeddings=4096):
    """A `load_runtime` stand-in: random weights over the SmolLM2 vocabulary and Frontend
    (float32 whatever `dtype` asks; the shape arguments default to the tiny one)."""
    import torch

    from bench.random_weights import random_runtime
    from services.worker.runtime import DEFAULT_MODEL
    from shared.frontends import get_frontend

    frontend = get_frontend(DEFAULT_MODEL)
    runtime = random_runtime(frontend.domain, name=DEFAULT_MODEL, hidden_size=hidden_size,
                             num_heads=num_heads, num_kv_heads=num_kv_heads,
                             max_position_embeddings=max_position_embeddings, seed=7,
                             dtype=torch.float32, device=device)
    return replace(runtime, frontend=frontend)


def main(argv: list[str]) -> int:
    import services.worker.runtime as runtime_module
    from services.cli import main as cli_main

    runtime_module.load_runtime = tiny_smollm2_runtime  # open_worker looks it up when it runs
    return cli_main(["worker", "serve", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


class WorkerProcess:
    """A tiny worker (this module as `python -m tests.support.tiny_worker`) on a fixed loopback
    port, with its metrics port; it can be SIGKILLed and started again on the same ports."""

    def __init__(self, *flags: str, name: str = "worker", env: dict | None = None,
                 module: str = "tests.support.tiny_worker", launcher_flags: tuple = ()) -> None:
        import tempfile
        from pathlib import Path

        from tests.conftest import free_port

        self.flags = flags
        self.env = env or {}
        self.module = module  # the launcher: this module, or another with the same command line
        self.launcher_flags = launcher_flags  # the launcher's own flags, before the worker's
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc = None
        self.log = Path(tempfile.mkdtemp(prefix=f"infernix-{name}-")) / f"{name}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        import os
        import subprocess
        from pathlib import Path

        command = [
            sys.executable,
            "-m",
            self.module,
            *self.launcher_flags,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            *self.flags,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[2],
                                         stdout=subprocess.DEVNULL, stderr=log,
                                         env={**os.environ, "INFERNIX_LOG_LEVEL": "WARNING",
                                              **self.env})

    async def wait_healthy(self, timeout: float = 180.0) -> dict:
        """Its Health once it answers (raises AssertionError with the log if it exits)."""
        import asyncio
        import time

        from services.worker.remote import GrpcWorkerClient

        deadline = time.monotonic() + timeout
        client = GrpcWorkerClient("127.0.0.1", self.port, timeout_s=2.0)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"worker exited with {self.proc.returncode}:\n"
                                         f"{self.log.read_text(errors='replace')[-3000:]}")
                try:
                    return await client.health()
                except (ConnectionError, OSError):
                    if time.monotonic() > deadline:
                        raise AssertionError("the worker did not become healthy") from None
                    await asyncio.sleep(0.2)
        finally:
            await client.aclose()

    def kill(self) -> None:
        from tests.conftest import kill_process

        kill_process(self.proc)

    def stop(self) -> None:
        from tests.conftest import stop_process

        stop_process(self.proc)
