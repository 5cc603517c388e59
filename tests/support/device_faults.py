"""The device-fault scenarios, with real processes: the same code runs on the lent GPU (real
faults: tests/e2e/test_gpu_faults.py) and on the CPU as its rehearsal (stand-in faults of the
same types: tests/e2e/test_device_faults_cpu.py).

One `FaultStack` per run, started side by side: a worker whose device fails on demand
(tests/support/fault_worker.py `--fault-file`) and a healthy one behind a real gateway, a worker
with a small KV pool, and a worker with the out-of-memory handshake (`--oom-dir`; on CUDA a larger
model, so that a long prefill needs device memory of its own). Every wait is bounded (the bounds
only end a run that would otherwise hang; nothing is timed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from services.worker.remote import GrpcWorkerClient
from shared.contract import OutputConstraint
from shared.errors import InfernixError, InvalidRequest, Overloaded
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    TextDelta,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.tiny_worker import WorkerProcess

MODEL = "smollm2"  # the tiny workers' served name
# A language without an end: a request runs to its token limit unless something stops it.
ENDLESS = OutputConstraint.grammar("root ::= [a-z ] root")
READY_S = 420.0  # a cold start on CUDA compiles every kernel of the warm-up
WAIT_S = 120.0


@dataclass(frozen=True)
class Shape:
    """The sizes of one device's run."""

    lanes: int = 4
    max_len: int = 2048  # the fault workers' lanes (long streams run while faults hit)
    kv_max_len: int = 256  # the KV worker's lanes
    kv_lanes: int = 2
    oom_lanes: int = 3  # two decoding streams and the long prefill beside them
    oom_hidden: int = 32  # the OOM worker's model width
    oom_max_len: int = 1024
    oom_prefill_chunk: int = 512


# On CUDA the OOM worker's long prefill needs a few hundred MB at once (its MLP activations of
# 4,000 tokens at width 2,048: [4096, 8192] float32 = 128 MB), far above any hole that the caching
# allocator's partly used segments keep after a release; so it must come from the driver.
CUDA_SHAPE = Shape(oom_hidden=2048, oom_max_len=4608, oom_prefill_chunk=4096)
CPU_SHAPE = Shape()


class FaultStack:
    """The processes of one run (module docstring); `tmp` holds the fault files and logs."""

    def __init__(self, device: str, tmp: Path, shape: Shape) -> None:
        self.device, self.tmp, self.shape = device, tmp, shape
        self.fault_file = tmp / "fault"
        self.oom_dir = tmp / "oom"
        self.oom_dir.mkdir(exist_ok=True)
        # The default kernel cache: a machine that ran the GPU tests before starts warm.
        common = ("--device", device, "--compile-isolation", "thread")
        launcher = "tests.support.fault_worker"
        self.faulty = WorkerProcess(*common, "--lanes", str(shape.lanes), "--max-len",
                                    str(shape.max_len), name="faulty", module=launcher,
                                    launcher_flags=("--fault-file", str(self.fault_file)))
        self.healthy = WorkerProcess(*common, "--lanes", str(shape.lanes), "--max-len",
                                     str(shape.max_len), name="healthy")
        self.gateway = GatewayProcess(self.faulty.address, self.healthy.address)
        self.kv = WorkerProcess(*common, "--lanes", str(shape.kv_lanes), "--max-len",
                                str(shape.kv_max_len), "--kv-cache-tokens",
                                str(shape.kv_lanes * shape.kv_max_len), "--max-waiting", "2",
                                name="kv")
        self.oom = WorkerProcess(*common, "--lanes", str(shape.oom_lanes), "--max-len",
                                 str(shape.oom_max_len),
                                 "--prefill-chunk", str(shape.oom_prefill_chunk), name="oom",
                                 module=launcher,
                                 launcher_flags=("--oom-dir", str(self.oom_dir), "--hidden-size",
                                                 str(shape.oom_hidden)))
        self.workers = [self.faulty, self.healthy, self.kv, self.oom]

    def start(self) -> None:
        for process in (*self.workers, self.gateway):  # side by side: imports and warm-ups overlap
            process.start()

    async def ready(self) -> None:
        await asyncio.gather(*(until_status(w, "ok", READY_S) for w in self.workers))
        await self.gateway.until_workers_healthy(2, timeout=WAIT_S)

    def kill(self) -> None:
        for process in (self.gateway, *self.workers):
            process.kill()


@contextlib.contextmanager
def running_stack(device: str, path: Path, shape):
    """A started, ready FaultStack (the modules' one fixture body), killed on exit."""
    built = FaultStack(device, path, shape)
    try:
        built.start()
        asyncio.run(built.ready())
        yield built
    finally:
        built.kill()

    def logs(self) -> str:
        """The tail of every process's log (for an assertion message)."""
        parts = []
        for process in (*self.workers, self.gateway):
            text = process.log.read_text(errors="replace") if process.log.exists() else ""
            parts.append(f"--- {process.log.name}\n{text[-2500:]}")
        return "\n".join(parts)


def client(worker: WorkerProcess) -> GrpcWorkerClient:
    return GrpcWorkerClient("127.0.0.1", worker.port, timeout_s=10.0)


async def health(worker: WorkerProcess) -> dict:
    grpc = client(worker)
    try:
        return await grpc.health()
    finally:
        await grpc.aclose()


async def until_status(worker: WorkerProcess, status: str, timeout: float) -> dict:
    """The worker's health once its status is `status` (AssertionError with its log if the
    process exits or the bound passes)."""
    deadline = time.monotonic() + timeout
    last: dict | str = "no answer"
    while True:
        if worker.proc is not None and worker.proc.poll() is not None:
            raise AssertionError(f"{worker.log.name} exited with {worker.proc.returncode}:\n"
                                 f"{worker.log.read_text(errors='replace')[-4000:]}")
        try:
            last = await health(worker)
            if last.get("status") == status:
                return last
        except (ConnectionError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker.log.name} did not report status {status!r} within "
                                 f"{timeout} s; last health: {last}\n"
                                 f"{worker.log.read_text(errors='replace')[-4000:]}")
        await asyncio.sleep(0.2)


def request(rid: str, text: str, max_tokens: int, *, endless: bool = False) -> GenerateRequest:
    options = RequestOptions(max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
                             constraint=ENDLESS if endless else None)
    return GenerateRequest(rid, PromptInput(text=text), options, model=MODEL)


class Stream:
    """One request's events as they arrive: `first_text` is set at its first text delta; `done`
    ends with its Finished, or with the typed error raised before its first event."""

    def __init__(self, grpc: GrpcWorkerClient, req: GenerateRequest) -> None:
        self.request = req
        self.deltas: list[str] = []
        self.first_text = asyncio.Event()
        self.task = asyncio.ensure_future(self._run(grpc))

    async def _run(self, grpc: GrpcWorkerClient) -> Finished | InfernixError:
        try:
            async for event in grpc.generate(self.request):
                if isinstance(event, TextDelta):
                    self.deltas.append(event.text)
                    self.first_text.set()
                elif isinstance(event, Finished):
                    return event
        except InfernixError as exc:
            return exc
        finally:
            self.first_text.set()  # nobody waits for text that will not come
        raise AssertionError(f"{self.request.request_id}: the stream ended without Finished")

    async def done(self, timeout: float = WAIT_S) -> Finished | InfernixError:
        return await asyncio.wait_for(self.task, timeout)


def error_type(outcome: Finished | InfernixError) -> str | None:
    """The typed error a request ended with (None: it ended normally)."""
    if isinstance(outcome, InfernixError):
        return outcome.type_name
    if outcome.finish_reason is FinishReason.ERROR:
        return (outcome.error or {}).get("type", "<untyped>")
    return None


async def prompt_of(grpc: GrpcWorkerClient, tokens: int, tag: str) -> tuple[str, int]:
    """A raw prompt of at most `tokens` tokens (as the worker counts them), as long as words
    allow; returns (text, its token count)."""
    def text(n: int) -> str:
        return f"{tag}: " + " ".join(f"w{(i * 7919) % 10007}" for i in range(n))

    low, high = 1, tokens
    while low < high:  # the most words whose prompt fits
        mid = (low + high + 1) // 2
        if await grpc.count_tokens(PromptInput(text=text(mid)), MODEL) <= tokens:
            low = mid
        else:
            high = mid - 1
    return text(low), await grpc.count_tokens(PromptInput(text=text(low)), MODEL)


# ---------------------------------------------------------------- a lost device


async def _gateway_requests(gateway: GatewayProcess, n: int) -> list[str]:
    """`n` requests through the gateway at once, half streaming; the failures, described."""
    async def one(session: aiohttp.ClientSession, i: int) -> str | None:
        stream = i % 2 == 0
        body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "stream": stream,
                "messages": [{"role": "user", "content": f"after the fault {i}"}]}
        async with session.post(gateway.url + "/v1/chat/completions", json=body) as reply:
            if reply.status != 200:
                return f"request {i}: HTTP {reply.status}: {await reply.text()}"
            if not stream:
                answer = await reply.json()
                reason = answer["choices"][0]["finish_reason"]
                return None if reason in ("stop", "length") else f"request {i}: {answer}"
            text = await reply.text()
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            reasons = [c["finish_reason"] for e in events if e != "[DONE]"
                       for c in json.loads(e).get("choices", []) if c.get("finish_reason")]
            if events[-1:] != ["[DONE]"] or reasons[-1:] not in (["stop"], ["length"]) \
                    or any("error" in json.loads(e) for e in events if e != "[DONE]"):
                return f"stream {i} did not end normally: {text[-600:]}"
            return None

    timeout = aiohttp.ClientTimeout(total=WAIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = await asyncio.gather(*(one(session, i) for i in range(n)))
    return [r for r in results if r is not None]


async def lost_device(stack: FaultStack) -> None:
    """The faulty worker's device fails inside a step while two streams decode there: every
    live request ends typed (ServiceUnavailable, a terminal event on each stream), the process
    lives, its health says unavailable and stays so (the device is lost: the Program cannot be
    rebuilt), and the gateway, over it and a healthy worker, serves every new request."""
    before = await _gateway_requests(stack.gateway, 4)
    assert before == [], f"the stack failed before the fault: {before}\n{stack.logs()}"
    grpc = client(stack.faulty)
    try:
        room = stack.shape.max_len - 64
        streams = [Stream(grpc, request(f"inflight{i}", f"stream {i}", room, endless=True))
                   for i in range(2)]
        for s in streams:
            await asyncio.wait_for(s.first_text.wait(), WAIT_S)
        assert all(s.deltas for s in streams), \
            f"a stream ended before the fault: {[await s.done() for s in streams]}"
        stack.fault_file.touch()
        trigger = Stream(grpc, request("trigger", "the step that faults", 8))
        outcomes = {s.request.request_id: await s.done() for s in (*streams, trigger)}
    finally:
        await grpc.aclose()
    for rid, outcome in outcomes.items():
        assert error_type(outcome) == "ServiceUnavailable", \
            f"{rid} ended {outcome!r}, not ServiceUnavailable\n{stack.logs()}"
    report = await until_status(stack.faulty, "unavailable", WAIT_S)
    assert "device" in report.get("unavailable", ""), report
    await asyncio.sleep(3.0)  # the rebuild had its chance: the device stays lost
    report = await health(stack.faulty)
    assert report["status"] == "unavailable", f"the lost device came back: {report}"
    assert stack.faulty.proc.poll() is None, "the faulty worker's process died"
    deadline = time.monotonic() + WAIT_S
    while (await asyncio.to_thread(stack.gateway.healthz) or {}).get("worker", {}).get(
            "healthy") != 1:
        assert time.monotonic() < deadline, \
            f"the gateway never took the faulty worker out: {stack.gateway.healthz()}"
        await asyncio.sleep(0.2)
    failures = await _gateway_requests(stack.gateway, 12)
    assert failures == [], f"requests failed after the fault was detected: {failures}"


# ---------------------------------------------------------------- the KV pool


async def kv_pool(stack: FaultStack) -> None:
    """A prompt longer than a lane (every lane's full length is backed by the KV pool) is
    refused typed at admission, before any event; six prompts that each fill a lane, sent at
    once to two lanes with two waiting places, are each either refused typed before any event
    (Overloaded) or decoded to the end of their lane: never evicted mid-decode, never ended
    without a terminal event."""
    max_len = stack.shape.kv_max_len
    grpc = client(stack.kv)
    try:
        long_text, long_n = await prompt_of(grpc, max_len + 40, "too long")
        assert long_n > max_len, (long_n, max_len)
        refused = await Stream(grpc, request("toolong", long_text, 4)).done()
        assert isinstance(refused, InvalidRequest) and refused.field == "prompt", refused
        prompts = [await prompt_of(grpc, max_len - 40 - 3 * i, f"lane filler {i}")
                   for i in range(6)]
        streams = [(Stream(grpc, request(f"fill{i}", text, max_len - n + 1, endless=True)),
                    max_len - n + 1) for i, (text, n) in enumerate(prompts)]  # all at once
        outcomes = [(await s.done(), n) for s, n in streams]
        health_after = await health(stack.kv)
    finally:
        await grpc.aclose()
    completed = 0
    for (outcome, n), (s, _) in zip(outcomes, streams):
        rid = s.request.request_id
        if isinstance(outcome, Overloaded):
            assert not s.deltas, f"{rid} was refused after it had streamed"
            continue
        assert isinstance(outcome, Finished), f"{rid}: {outcome!r}"
        assert outcome.finish_reason is FinishReason.LENGTH and outcome.error is None, \
            f"{rid} did not decode to its lane's end: {outcome}"
        assert outcome.usage.completion_tokens == n, (rid, outcome.usage, n)
        completed += 1
    assert completed >= stack.shape.kv_lanes, f"only {completed} of 6 were served: {outcomes}"
    assert health_after["status"] == "ok", health_after


# ---------------------------------------------------------------- out of memory


async def out_of_memory(stack: FaultStack, hog: Callable[[], object],
                        free: Callable[[object], None]) -> None:
    """Another process takes all free device memory while two streams decode on the OOM
    worker, whose next prefill then really runs out: the requests of that step end typed
    (ServiceUnavailable naming the memory, a terminal event on each stream), the process
    serves on with health ok, and once the memory is free again the same requests succeed
    (a greedy request's output equal to its output before the fault)."""
    shape, oom = stack.shape, stack.oom_dir
    grpc = client(stack.oom)
    held = None
    try:
        short_text, _ = await prompt_of(grpc, 48, "reference")
        # Twice: the second finds the prompt's blocks in the prefix cache, as the request after
        # the fault may (the same numerical route, so the same greedy output, either way).
        references = [await Stream(grpc, request(f"ref{i}", short_text, 16)).done()
                      for i in range(2)]
        assert all(error_type(r) is None for r in references), f"the reference failed: " \
            f"{references}"
        long_text, long_n = await prompt_of(grpc, shape.oom_prefill_chunk - 96, "a long prompt")
        streams = [Stream(grpc, request(f"decoding{i}", f"stream {i}", shape.oom_max_len - 64,
                                        endless=True)) for i in range(2)]
        for s in streams:
            await asyncio.wait_for(s.first_text.wait(), WAIT_S)
        (oom / "release").touch()
        victim = Stream(grpc, request("victim", long_text, 8))
        deadline = time.monotonic() + WAIT_S
        while not (oom / "released").exists():  # the worker's next eager forward released
            assert time.monotonic() < deadline, "the worker never ran the release"
            assert not victim.task.done(), f"the victim ended first: {victim.task.result()}"
            await asyncio.sleep(0.01)
        held = hog()
        (oom / "hogged").touch()
        outcome = await victim.done()
        assert error_type(outcome) == "ServiceUnavailable" and not victim.deltas, \
            f"the {long_n}-token prefill did not fail typed: {outcome!r}\n{stack.logs()}"
        message = outcome.message if isinstance(outcome, InfernixError) else \
            outcome.error["message"]
        assert "out of memory" in message, message
        for s in streams:
            ended = await s.done()
            assert error_type(ended) in (None, "ServiceUnavailable"), \
                f"{s.request.request_id} ended {ended!r}"
        report = await health(stack.oom)
        assert report["status"] == "ok", f"an out-of-memory step took the worker out: {report}"
        assert stack.oom.proc.poll() is None, "the OOM worker's process died"
    finally:
        (oom / "hogged").unlink(missing_ok=True)
        if held is not None:
            free(held)
        await grpc.aclose()
    grpc = client(stack.oom)
    try:
        again = await Stream(grpc, request("ref-again", short_text, 16)).done()
        long_again = await Stream(grpc, request("victim-again", long_text, 8)).done()
    finally:
        await grpc.aclose()
    assert error_type(long_again) is None, f"the long prompt failed once memory was free: " \
        f"{long_again!r}"
    assert error_type(again) is None and again.content in {r.content for r in references}, \
        f"after the fault the reference prompt gave {again!r}; before: {references!r}"
