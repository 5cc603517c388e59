"""The start-up warm-up (program/warmup.py): it visits every prefill width and batch-size class
a step can run, every decode size, the sampler's variants; health is not ready until it ends.

Issue: "No compiles on the request path: every kernel shape the server can meet (prefill lengths,
batch sizes, the GDN chunk kernels' autotuning, graphs) is compiled, bucketed or cached on disk
at start-up; the start-up time this adds is stated; `/healthz` is ready only after it".
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import aiohttp
import pytest

from services.worker.program import Program
from services.worker.program import warmup as warmup_module
from services.worker.program.buckets import plan_widths, prefill_widths
from services.worker.program.graphs import graph_sizes
from services.worker.program.warmup import WarmupReport, warm_up
from tests.support.fake_worker import running_gateway
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    text_request,
    tiny_runtime,
)


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


def test_the_warm_up_visits_every_width_and_batch_size_a_step_can_run(runtime):
    """Every (rows, padded width) a prefill step of the Forward can run from a lane's start, for
    each batch-size class, is among the forwards the warm-up ran (seen through a fake forward);
    eager decode at every class; the sampler at every class, greedy and tempered, masked or not."""
    max_batch, max_len, chunk = 5, 300, 150
    program = Program(runtime, max_batch=max_batch, max_len=max_len)
    program.forward.bucketed = True
    seen: set[tuple[int, int]] = set()
    bounds: dict[tuple[int, int], set[int]] = {}

    def fake(tokens, positions, lanes, kv_len, fed):
        rows, width = tokens.shape
        assert int(positions.max()) < kv_len <= max_len and len(set(lanes.tolist())) == rows
        seen.add((rows, width))
        bounds.setdefault((rows, width), set()).add(kv_len)

    report = warm_up(program, chunk, forward=fake)
    classes = graph_sizes(max_batch)
    assert classes == (1, 2, 4, 5)
    for rows in classes:
        # a step holds the widest row plus at least one token of each other row
        for widest in range(1, chunk - rows + 2):
            width = program.forward._padded(widest)
            assert (rows, width) in seen, (rows, widest, width)
    # a row near the lane's end runs alone, as the pieces of `plan_widths`: each one visited
    for start in range(max_len - chunk, max_len):
        for length in range(1, min(chunk, max_len - start) + 1):
            for _, width in plan_widths(start, length, max_len, program.forward.widths):
                assert (1, width) in seen, (start, length, width)
    assert len(bounds[(1, 1)]) > 1  # small forwards also at each context bound (splits)
    assert {s for k, s, *_ in report.shapes if k == "decode"} == set(classes)
    samples = {(rows, t, masked) for k, rows, t, masked, *_ in report.shapes if k == "sample"}
    assert samples == {(r, t, m) for r in classes for t in (0.0, 1.0) for m in (False, True)}
    top_k = {s[4] for s in report.shapes if s[0] == "sample"}
    assert {1 << i for i in range(11)} <= top_k  # each candidate block of the top-k kernels
    assert {s[5] for s in report.shapes if s[0] == "sample"} == {False, True}  # penalties
    # fla's chunked kernels compile per batch size: every row count at a chunked width
    assert {rows for rows, width in seen if width > 32} == set(range(1, max_batch + 1))
    assert report.prefill == sum(len(b) for b in bounds.values())
    assert report.to_dict()["seconds"] >= 0


def test_the_warm_up_runs_acceptance_at_every_batch_size_class(runtime):
    """A speculative Program's warm-up runs the acceptance kernels (verify.py `Verifier.warm`)
    per batch-size class, greedy and sampled, without and with a mask, at K drafts a row, so a
    request's first verify round compiles nothing on CUDA."""
    program = Program(runtime, max_batch=3, max_len=64, max_drafts=3)
    seen = set()
    inner = program.rounds.verifier._accept

    def accept(z, params, drafts, num, states, **kw):
        seen.add((drafts.shape, kw["candidate_width"], kw["mask"] is not None))
        return inner(z, params, drafts, num, states, **kw)

    program.rounds.verifier._accept = accept
    report = warm_up(program, 16, forward=lambda *a: None)
    classes = graph_sizes(3)
    assert report.acceptance == len(classes) * 2 * 2
    assert report.commits == len(classes)  # a partial commit per class (a hybrid's replay)
    assert seen == {((rows, 3), width, masked) for rows in classes for width in (1, None)
                    for masked in (False, True)}


@pytest.mark.asyncio
async def test_health_is_not_ready_until_the_warm_up_ends(runtime, monkeypatch):
    """While the warm-up runs, the engine's health says "warming", the worker is not ready and
    the gateway's /healthz and /readyz answer 503; a request sent meanwhile waits and is served
    after it; then health is ok and reports the warm-up's counts and seconds."""
    release = threading.Event()
    entered = threading.Event()

    def slow_warm_up(program, prefill_chunk, forward=None):
        entered.set()
        release.wait(30)
        return WarmupReport(prefill=3, decode=2, sampling=1, seconds=0.5)

    monkeypatch.setattr(warmup_module, "warm_up", slow_warm_up)  # what warm_up_logged runs
    client = open_client(runtime, max_batch=2, max_len=64, warmup=True)
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        health = await client.health()
        assert health["status"] == "warming" and health["ready"] is False
        async with running_gateway(client) as url, aiohttp.ClientSession() as http:
            for path in ("/healthz", "/readyz"):
                async with http.get(url + path) as r:
                    assert r.status == 503, path
            pending = asyncio.ensure_future(collect(client, text_request(
                "early", "hello", greedy(3), runtime.name)))
            await asyncio.sleep(0.2)
            assert not pending.done()  # nothing runs before the warm-up ends
            release.set()
            _, fin = await asyncio.wait_for(pending, 30)
            assert fin.error is None and fin.usage.completion_tokens == 3
            async with http.get(url + "/healthz") as r:
                assert r.status == 200
        health = await client.health()
        assert health["status"] == "ok" and health["ready"] is True
        assert health["warmup"]["prefill"] == 3 and health["warmup"]["seconds"] == 0.5
        assert client.engine.metrics.warmup_seconds._value.get() == 0.5
    finally:
        release.set()
        await client.aclose()


@pytest.mark.asyncio
async def test_the_cpu_engine_warms_up_only_when_asked(runtime):
    """The warm-up is off by default (a served CUDA worker turns it on, test below); an engine
    asked for it runs the real shapes through its model before serving (the forwards counted)."""
    hooked_runtime, model = hooked(runtime)
    client = open_client(hooked_runtime, max_batch=2, max_len=48, prefill_chunk=40, warmup=True)
    try:
        _, fin = await collect(client, text_request("r", "warm", greedy(4), runtime.name))
        report = client.engine.warmup
        assert report is not None and report.prefill > 0 and report.decode > 0
        assert model.calls >= report.prefill + report.decode
        assert fin.error is None and fin.usage.completion_tokens == 4
    finally:
        await client.aclose()
    default = open_client(runtime, max_batch=1, max_len=32)
    try:
        assert default.engine.warmup is None and (await default.health())["status"] == "ok"
    finally:
        await default.aclose()


def test_prefill_widths_padding_stays_bounded_for_a_long_lane():
    """A prompt chunk near the lane's end is never padded past max_len: it splits into
    forwards of warmed widths that stay inside the lane (buckets.py `plan_widths`)."""
    widths = prefill_widths(256, 256)
    assert plan_widths(100, 50, 256, widths) == [(50, 64)]
    assert plan_widths(200, 50, 256, widths) == [(18, 18), (32, 32)]


def test_a_served_worker_warms_up_on_cuda_only(monkeypatch):
    """`serve` / `worker serve` (services/embedded.py): the warm-up on CUDA unless --no-warmup,
    never on the CPU; the kernel cache directory only on CUDA."""
    from services import embedded
    from services.worker import client as client_module

    seen = {}
    monkeypatch.setattr(client_module, "open_in_process",
                        lambda runtime, config, **kw: seen.setdefault("config", config))
    stub = SimpleNamespace(frontend=SimpleNamespace(domain=None))
    monkeypatch.setattr("services.worker.runtime.load_runtime", lambda *a, **kw: stub)
    monkeypatch.setattr("services.grammar.client.build_companion_indices", lambda domain: 0.0)
    monkeypatch.setattr(embedded, "use_kernel_cache", lambda path: seen.setdefault("cache", path))
    embedded.open_worker(embedded.WorkerSettings(device="cpu"))
    assert seen.pop("config").warmup is False and "cache" not in seen
    embedded.open_worker(embedded.WorkerSettings(device="cuda", kernel_cache="/k"))
    assert seen.pop("config").warmup is True and seen.pop("cache") == "/k"
    embedded.open_worker(embedded.WorkerSettings(device="cuda", warmup=False))
    assert seen.pop("config").warmup is False


def test_the_kernel_cache_points_triton_at_the_directory(tmp_path, monkeypatch):
    """Triton's cache (binaries; autotuning results with TRITON_CACHE_AUTOTUNING, where fla-core
    keeps its own too) goes to the setting's directory; an operator's TRITON_CACHE_DIR wins."""
    from services.embedded import use_kernel_cache

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    target = tmp_path / "kernels"
    assert use_kernel_cache(str(target)) == str(target) and target.is_dir()
    import os

    assert os.environ["TRITON_CACHE_DIR"] == str(target)
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "own"))
    assert use_kernel_cache(str(target)) == str(tmp_path / "own")


def test_the_worker_health_check_fails_while_warming(monkeypatch, capsys):
    """`infernix worker health` (the compose health check) exits 1 while the worker warms up, so
    the gateway that depends on it waits; 0 once it serves."""
    from services import cli
    from services.worker import remote

    status = {"status": "warming"}

    class Client:
        def __init__(self, *args, **kwargs) -> None:
            pass

        async def health(self) -> dict:
            return dict(status)

        async def aclose(self) -> None:
            pass

    monkeypatch.setattr(remote, "GrpcWorkerClient", Client)
    args = cli.build_parser().parse_args(["worker", "health", "--address", "127.0.0.1:1"])
    assert cli.run_worker_health(args) == 1
    status["status"] = "ok"
    assert cli.run_worker_health(args) == 0
