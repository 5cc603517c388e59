"""The decode step's host commit path alone (preview -> Program commit -> confirm -> publish ->
finish, and the Outbox flush): microseconds per row at B concurrent greedy requests, unconstrained
and with a JSON Schema, on the CPU with the SmolLM2 Frontend (its real tokenizer and vocabulary)
and streaming consumers attached the way the gateway attaches them (`client.generate`: one
RequestStream per request on the event loop, every event read).

Only the commit is timed (`Pipeline.commit` of decode steps, which on the CPU is the
Postprocessor's commit and its flush); the forward is not. By default the model is a small
random-weight decoder over the SmolLM2 vocabulary (the commit path does not depend on the weights,
only on the tokens; `--real-model` runs SmolLM2-135M itself). A second, profiled pass of every
case attributes the commit's time to where it goes (cProfile's own time per function, grouped by
module: `CATEGORIES`); the profiler inflates small calls, so its shares are a guide and the
unprofiled figure is the measurement.

`--before DIR` runs every case also against the source tree DIR (e.g. an export of the base
commit), alternating with this tree case by case so both see the same machine load:

    python -m bench.commit_path --batch-sizes 1 8 32 64 --before /tmp/base --out report.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

# (category, substrings of a profiled function's file or name), first match wins
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("program_commit", ("services/worker/program/",)),
    ("matcher_accept", ("services/grammar/", "xgrammar", "llguidance", "named_matcher")),
    ("session_transactions", ("services/worker/output/session.py",
                              "services/worker/output/preview.py", "worker/request.py")),
    ("detokenize_phases", ("shared/frontends/",)),
    ("stop_strings", ("stop_strings.py",)),
    ("publication", ("services/worker/output/publication.py",)),
    ("events_outbox", ("engine/stream.py", "shared/generation.py", "asyncio", "dataclasses")),
    ("metrics", ("prometheus", "shared/metrics")),
    ("logging", ("structlog", "shared/logging", "logging/")),
    ("postprocess", ("engine/postprocess.py", "engine/pipeline.py")),
)


# The figure a run is judged by: the worker thread's CPU time in the commit (the flush left out),
# per row, median over the full-batch steps
HEADLINE = "commit_cpu_us_per_row_median"


def _ours(filename: str, name: str) -> bool:
    """The bench's own timing calls, which the profiled pass also sees."""
    return filename.endswith("commit_path.py") or "thread_time" in name or "perf_counter" in name


def _category(filename: str, name: str) -> str:
    where = f"{filename}:{name}"
    for category, keys in CATEGORIES:
        if any(k in where for k in keys):
            return category
    return "builtins" if filename == "~" else "other"


class _Timer:
    """Wraps Pipeline.commit: every decode step's commit, as wall time and as the worker
    thread's own CPU time (`time.thread_time`: what the commit costs the thread, without the
    time it waits for the GIL or for a core of a loaded machine), with the Outbox flush's share
    of each; with `profile`, a cProfile of those commits only (on the worker thread)."""

    def __init__(self, profile: bool) -> None:
        self.steps: list[tuple[int, float, float, float, float]] = []  # rows, wall, cpu, flush
        self._flush = [0.0, 0.0]  # of the running commit: the flush's wall and cpu seconds
        self.profiler = cProfile.Profile() if profile else None

    def install(self):
        from services.worker.engine.pipeline import Pipeline
        from services.worker.engine.postprocess import Postprocessor

        original, original_flush = Pipeline.commit, Postprocessor.flush
        timer = self

        def flush(post):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return original_flush(post)
            finally:
                timer._flush[0] += time.perf_counter() - wall
                timer._flush[1] += time.thread_time() - cpu

        def commit(pipeline, pending):
            if not pending.batch.is_decode:
                return original(pipeline, pending)
            rows = len(pending.batch.rows)
            timer._flush = [0.0, 0.0]
            if timer.profiler is not None:
                timer.profiler.enable()
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(pipeline, pending)
            finally:
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                if timer.profiler is not None:
                    timer.profiler.disable()
                timer.steps.append((rows, wall, cpu, *timer._flush))

        Pipeline.commit, Postprocessor.flush = commit, flush

        def restore():
            Pipeline.commit, Postprocessor.flush = original, original_flush

        return restore

    @property
    def rows(self) -> int:
        return sum(s[0] for s in self.steps)

    def summary(self) -> dict[str, Any]:
        """Microseconds per row: the mean over all decode steps, and the median over the steps
        with the full batch (a loaded machine's stalls move the mean, rarely the median), of the
        commit without the flush, of the flush, and of both, in wall and thread CPU time."""
        full = max(s[0] for s in self.steps)
        out: dict[str, Any] = {"decode_steps": len(self.steps), "rows": self.rows,
                               "full_batch_steps": sum(s[0] == full for s in self.steps)}
        for name, pick in (("commit", lambda s: (s[1] - s[3], s[2] - s[4])),
                           ("flush", lambda s: (s[3], s[4])),
                           ("total", lambda s: (s[1], s[2]))):
            for k, clock in enumerate(("wall", "cpu")):
                mean = sum(pick(s)[k] for s in self.steps) / self.rows
                med = statistics.median(pick(s)[k] / s[0] for s in self.steps if s[0] == full)
                out[f"{name}_{clock}_us_per_row"] = round(1e6 * mean, 2)
                out[f"{name}_{clock}_us_per_row_median"] = round(1e6 * med, 2)
        return out

    def breakdown(self) -> dict[str, float]:
        """Microseconds per row by category (cProfile's own time)."""
        stats = pstats.Stats(self.profiler)
        out: dict[str, float] = {}
        for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():
            if _ours(filename, name):
                continue
            cat = _category(filename, name)
            out[cat] = out.get(cat, 0.0) + tottime
        return {k: round(1e6 * v / self.rows, 2)
                for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    def top(self, n: int = 40) -> list[dict[str, Any]]:
        stats = pstats.Stats(self.profiler)
        rows = sorted(((k, v) for k, v in stats.stats.items() if not _ours(k[0], k[2])),
                      key=lambda kv: -kv[1][2])[:n]
        return [{"function": f"{os.path.relpath(f) if f != '~' else ''}:{line}({name})",
                 "calls_per_row": round(nc / self.rows, 2),
                 "own_us_per_row": round(1e6 * tt / self.rows, 2),
                 "cum_us_per_row": round(1e6 * ct / self.rows, 2)}
                for (f, line, name), (_, nc, tt, ct, _) in rows]


def _runtime(real: bool):
    import torch

    from bench.random_weights import random_runtime
    from services.worker.runtime import load_runtime

    runtime = load_runtime("smollm2", device="cpu", dtype=torch.float32)
    if real:
        return runtime
    tiny = random_runtime(runtime.domain, name=runtime.name, hidden_size=32, num_layers=1,
                          num_heads=2, num_kv_heads=1, max_position_embeddings=4096)
    from dataclasses import replace

    return replace(runtime, model=tiny.model, config=tiny.config)


async def _round(client, runtime, b: int, tokens: int, schema, tag: str, stop: tuple[str, ...]):
    from bench.models import prompt_texts
    from shared.contract import OutputConstraint
    from shared.generation import (
        Finished,
        GenerateRequest,
        PromptInput,
        RequestOptions,
        SamplingParams,
    )

    async def consume(request):
        events = 0
        async for event in client.generate(request):  # the gateway's way: every event read
            events += 1
            if isinstance(event, Finished):
                if event.error is not None:
                    raise RuntimeError(f"{request.request_id}: {event.error}")
                return events, event.usage.completion_tokens
        raise RuntimeError("no Finished event")

    requests = [GenerateRequest(
        f"{tag}-{i}", PromptInput(text=p),
        RequestOptions(max_tokens=tokens, sampling=SamplingParams(temperature=0.0),
                       constraint=OutputConstraint.json_schema(schema) if schema else None,
                       stop=stop),
        model=runtime.name) for i, p in enumerate(prompt_texts(runtime, b, 16))]
    cpu = time.thread_time()  # the event loop's thread: the consumers' side of every event
    done = await asyncio.gather(*(consume(r) for r in requests))
    return sum(e for e, _ in done), sum(n for _, n in done), time.thread_time() - cpu


async def _case(b: int, mode: str, tokens: int, real: bool, profile: bool) -> dict[str, Any]:
    from bench.stats import schemas
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig

    runtime = _runtime(real)
    schema = schemas()[0] if mode == "json_schema" else None
    stop = ("\n\n\n",) if mode == "stop_string" else ()
    client = open_in_process(runtime, EngineConfig(max_batch=b, max_len=64 + tokens,
                                                   pipeline=False, prefix_cache=False))
    try:
        if schema is not None:
            from shared.contract import OutputConstraint

            await client.engine.grammar.compile(OutputConstraint.json_schema(schema),
                                                model=runtime.name)
        await _round(client, runtime, b, 8, schema, "warm", stop)  # untimed
        out: dict[str, Any] = {}
        for label, prof in (("timed", False), ("profiled", True)) if profile else \
                (("timed", False),):
            timer = _Timer(prof)
            restore = timer.install()
            try:
                events, produced, loop_cpu = await _round(client, runtime, b, tokens, schema,
                                                          label, stop)
            finally:
                restore()
            if label == "timed":
                out.update(timer.summary(), output_tokens=produced, events=events,
                           loop_cpu_us_per_event=round(1e6 * loop_cpu / events, 2))
            else:
                out["profiled_us_per_row"] = round(
                    1e6 * sum(st[1] for st in timer.steps) / timer.rows, 2)
                out["breakdown_us_per_row"] = timer.breakdown()
                out["top_functions"] = timer.top()
        return out
    finally:
        await client.aclose()


def _child(args: argparse.Namespace) -> None:
    result = asyncio.run(_case(args.case_b, args.case_mode, args.max_tokens, args.real_model,
                               not args.no_profile))
    print("RESULT " + json.dumps(result))


def _run_case(tree: str, b: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One case in a fresh process whose imports come from `tree` (another tree gets a copy of
    this module, so both trees run the same bench)."""
    mine = os.path.abspath(__file__)
    theirs = os.path.join(os.path.abspath(tree), "bench", "commit_path.py")
    if theirs != mine:
        shutil.copyfile(mine, theirs)
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [sys.executable, "-c", "import sys; sys.argv[0] = 'commit_path'; "
           "from bench.commit_path import main; main()",
           "--case-b", str(b), "--case-mode", mode, "--max-tokens", str(args.max_tokens)]
    cmd += ["--real-model"] if args.real_model else []
    cmd += ["--no-profile"] if args.no_profile else []
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"case B={b} {mode} in {tree} failed:\n{proc.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.commit_path", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--modes", nargs="+", default=["unconstrained", "json_schema"],
                   choices=["unconstrained", "stop_string", "json_schema"])
    p.add_argument("--max-tokens", type=int, default=48, help="output tokens per request")
    p.add_argument("--real-model", action="store_true", help="SmolLM2-135M's own weights")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled pass")
    p.add_argument("--before", metavar="DIR", help="also run every case against this tree")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each case per tree, alternating (the least disturbed is kept)")
    p.add_argument("--out", help="write the JSON report here too")
    p.add_argument("--case-b", type=int, help=argparse.SUPPRESS)
    p.add_argument("--case-mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case_b is not None:
        _child(args)
        return
    from bench.report import host, write_report

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"after": here} if not args.before else {"before": args.before, "after": here}
    cases = []
    for b in args.batch_sizes:
        for mode in args.modes:
            entry: dict[str, Any] = {"batch": b, "mode": mode}
            runs: dict[str, list] = {label: [] for label in trees}
            for _ in range(args.repeat):  # the trees alternate: both see the same load
                for label, tree in trees.items():
                    run = _run_case(tree, b, mode, args)
                    runs[label].append(run)
                    print(f"B={b} {mode} {label}: commit cpu {run[HEADLINE]} us/row, "
                          f"total wall {run['total_wall_us_per_row']} us/row",
                          file=sys.stderr, flush=True)
            for label, its in runs.items():  # the least disturbed run
                entry[label] = min(its, key=lambda r: r[HEADLINE])
                if len(its) > 1:
                    entry[label]["all_runs_" + HEADLINE] = [r[HEADLINE] for r in its]
            if "before" in entry:
                entry["speedup"] = {
                    key: round(entry["before"][key] / entry["after"][key], 2)
                    for key in (HEADLINE, "commit_wall_us_per_row_median",
                                "total_wall_us_per_row")}
            cases.append(entry)
    report = {"bench": "commit_path", "command": "python -m bench.commit_path " + " ".join(
        sys.argv[1:] if argv is None else argv), "host": {**host("torch", "xgrammar"),
                                                         "cpu_count": os.cpu_count(),
                                                         "load_avg": os.getloadavg()},
              "model": "smollm2" if args.real_model else "smollm2 vocabulary, tiny random decoder",
              "trees": trees, "max_tokens": args.max_tokens, "repeat": args.repeat,
              "headline": HEADLINE, "cases": cases}
    write_report(report, args.out)


if __name__ == "__main__":
    main()
