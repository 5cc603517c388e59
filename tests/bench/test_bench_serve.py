"""`infernix bench serve` (bench/serve.py) against the embedded server (gateway + in-process
worker + grammar service, SmolLM2's Frontend and vocabulary with tiny random weights so a step
costs milliseconds), on a tiny budget.

Issue: "`infernix bench serve`: a client-side load benchmark against a running server ... a
concurrency sweep with a mix (raw, chat, JSON Schema, tools), TTFT/TPOT/ITL p50/p99 and
throughput, JSON output."
"""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from aiohttp import web

from services.cli import build_parser
from tests.conftest import free_port
from tests.support.tiny_worker import tiny_smollm2_runtime


@pytest_asyncio.fixture
async def server(monkeypatch):
    import services.worker.runtime as runtime_module
    from services.embedded import WorkerSettings, open_worker
    from services.gateway.app import create_app

    monkeypatch.setattr(runtime_module, "load_runtime", tiny_smollm2_runtime)
    worker = open_worker(WorkerSettings(lanes=2, max_len=512))
    runner = web.AppRunner(create_app(worker))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await worker.aclose()


def _args(url: str, *extra: str):
    return build_parser().parse_args(["bench", "serve", "--url", url, "--concurrency", "1", "2",
                                      "--requests", "4", "--max-tokens", "24", *extra])


@pytest.mark.asyncio
async def test_sweep_reports_every_level_and_kind(server, tmp_path):
    from bench.serve import KINDS, bench

    report = await bench(_args(server))
    json.dumps(report)  # the report is JSON
    assert report["bench"] == "serve" and report["model"] and report["warmup_errors"] == []
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for lv in report["levels"]:
        assert lv["requests"] == lv["ok"] == 4 and lv["errors"] == 0, lv["error_samples"]
        assert set(lv["by_kind"]) == set(KINDS)
        assert all(k["ok"] == 1 for k in lv["by_kind"].values())  # 4 requests cycle the 4 kinds
        assert 4 <= lv["output_tokens"] <= 4 * 24 and lv["output_tokens_per_s"] > 0
        assert lv["without_output_chunk"] == 0
        for metric in ("ttft_ms", "e2e_ms"):
            s = lv[metric]
            assert s["n"] == 4 and 0 < s["p50"] <= s["p99"], (metric, s)
        assert lv["ttft_ms"]["p99"] <= lv["e2e_ms"]["p99"]
        assert lv["itl_ms"]["n"] >= 1 and lv["tpot_ms"]["n"] >= 1
        assert lv["prompt_tokens"] > 0


@pytest.mark.asyncio
async def test_failed_requests_are_counted_not_raised(server):
    """A model the server does not serve: every request is an error sample, no exception."""
    from bench.serve import bench

    report = await bench(_args(server, "--model", "no-such-model", "--warmup", "0",
                               "--mix", "raw", "chat"))
    for lv in report["levels"]:
        assert lv["ok"] == 0 and lv["errors"] == 4
        assert any(e.startswith("HTTP 4") for e in lv["error_samples"]), lv["error_samples"]
