"""`infernix bench spec`: speculative decoding against ordinary decoding, constrained and not, JSON.

Three structured tasks (`extract`: fields of a short document into a JSON Schema; `rewrite`: a
JSON object rewritten with one field changed, under its own schema; `forms`: ten schemas with
long keys and enums, bench/forms.py, at least ten requests), B concurrent greedy requests each.
Per task and mode (unconstrained, constrained) a baseline round without speculation runs first
and records every request's tokens; then, per backend and K, an engine with `--speculative` runs
the same requests:

- `ngram`: the real n-gram copy proposer (real acceptance on a real model), with grammar drafts
  on constrained rows (spec/grammar.py) as served;
- `ngram-alone`: the n-gram copy proposer (layout-aware, spec/layout.py) without grammar drafts;
- `grammar`: grammar drafts alone (`--speculative grammar`: constrained rows only);
- `oracle`: the target's own greedy continuation recorded by the baseline round, so every draft
  is accepted and the round measures the machinery alone (verify forward, K+1 masks,
  acceptance, commit). Random weights accept almost nothing, so this is the honest machinery
  figure on `qwen3-8b-random`;
- `mtp` (on `qwen35-9b-random`, a random Qwen3.5-9B-shaped model with its MTP module): k MTP
  steps per round; random weights accept (almost) nothing, so again the cost per round;
- `dflash`, `dflash2`: a random-weight draft model of the target's width (`draft_layers`
  layers, conditioned on target layers spread from 1 to L-3, block K+1), built as a checkpoint
  directory in a temporary folder and loaded by its names: it accepts (almost) nothing, so the
  figure is the cost of the draft pass and its context per round, not a speed-up.

Reported per run: wall time, output tokens, speed-up against the baseline, whether the outputs
equal the baseline's token for token (greedy), verify rounds, mean accepted drafts per round,
acceptance rate, committed tokens per round, the exposed draft wait (host proposing before the
verify forward: the host-launched route) as seconds and as a fraction of the wall time, and the
CPU mask seconds of the constraint reports. Targets (measured, never asserted): constrained keeps
>= 95% of the unconstrained speed-up; exposed draft wait per step < 5% of the step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.compiles import compile_log
from bench.models import build_runtime
from bench.oracle import OracleProposer
from bench.report import report_header, write_report
from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.runtime import ModelRuntime
from services.worker.spec import ContextProposer, NgramProposer
from shared.contract import OutputConstraint
from shared.generation import (
    ChatMessage,
    Finished,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
)

BACKENDS = ("ngram", "ngram-alone", "grammar", "oracle", "mtp", "dflash", "dflash2")
DEFAULT_BACKENDS = ("ngram", "oracle")
TASKS = ("extract", "rewrite", "forms")

_PEOPLE = [("Maria Lopez", "maria.lopez@example.com", "Valencia", "A-10293", 129.5),
           ("John Carter", "j.carter@example.org", "Leeds", "B-55120", 42.0),
           ("Aiko Tanaka", "aiko.tanaka@example.net", "Osaka", "C-77001", 310.25),
           ("Lars Berg", "lars.berg@example.com", "Bergen", "D-00417", 18.75)]
EXTRACT_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "email": {"type": "string"}, "city": {"type": "string"},
    "order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["name", "email", "city", "order_id", "amount"], "additionalProperties": False}
REWRITE_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "string"}, "customer": {"type": "string"}, "email": {"type": "string"},
    "city": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}},
    "status": {"type": "string"}},
    "required": ["id", "customer", "email", "city", "items", "status"],
    "additionalProperties": False}


def task_prompts(task: str, count: int) -> tuple[list[str], dict | list[dict]]:
    """`count` user messages of one task and the task's schema (`forms`: ten schemas with long
    keys and enums from bench/forms.py, one per message; at least ten messages)."""
    if task == "forms":
        from bench.forms import form_prompts

        return form_prompts(count * -(-10 // count))
    out = []
    for i in range(count):
        name, email, city, order, amount = _PEOPLE[i % len(_PEOPLE)]
        if task == "extract":
            out.append(f"Extract name, email, city, order_id and amount from this message as "
                       f"JSON.\n\nMessage: Hello, this is {name} from {city}. My order {order} "
                       f"for {amount} EUR has not arrived yet. Please write to me at {email}. "
                       f"Thanks, {name}")
        else:
            obj = {"id": order, "customer": name, "email": email, "city": city,
                   "items": ["notebook", "blue pen", "stapler"], "status": "pending"}
            out.append("Rewrite this JSON object exactly, but set status to \"shipped\":\n"
                       + json.dumps(obj))
    return out, EXTRACT_SCHEMA if task == "extract" else REWRITE_SCHEMA


@dataclass(frozen=True)
class SpecBenchOptions:
    tasks: tuple[str, ...] = ("extract", "rewrite")
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    draft_tokens: tuple[int, ...] = (2, 4)  # K values, each >= 1
    batch_size: int = 1  # concurrent requests per round, >= 1
    max_tokens: int = 96  # output tokens per request, >= 2
    cuda_graphs: bool = True  # decode and (n-gram, oracle) verify graphs on CUDA
    draft_layers: int = 2  # layers of the random DFlash / DFlash2 draft, >= 1
    draft_vocab: int | None = None  # MTP rounds: drafts among the first N token ids (None: all)

    def __post_init__(self) -> None:
        if not self.tasks or any(t not in TASKS for t in self.tasks):
            raise ValueError(f"SpecBenchOptions.tasks must be among {TASKS}, got {self.tasks}")
        if not self.backends or any(b not in BACKENDS for b in self.backends):
            raise ValueError(f"SpecBenchOptions.backends must be among {BACKENDS}, got "
                             f"{self.backends}")
        if not self.draft_tokens or any(k < 1 for k in self.draft_tokens):
            raise ValueError(f"SpecBenchOptions.draft_tokens must be >= 1, got {self.draft_tokens}")
        if self.batch_size < 1 or self.max_tokens < 2 or self.draft_layers < 1:
            raise ValueError("SpecBenchOptions: batch_size >= 1, max_tokens >= 2 and "
                             "draft_layers >= 1")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SpecBenchOptions:
        """The options of `infernix bench spec` (bench/cli.py's parser), with or without
        `--acceptance`."""
        return cls(tasks=tuple(args.tasks), backends=tuple(args.backends),
                   draft_tokens=tuple(args.num_draft_tokens), batch_size=args.batch_size,
                   max_tokens=args.max_tokens, cuda_graphs=not args.no_cuda_graphs,
                   draft_layers=args.draft_layers, draft_vocab=args.draft_vocab)


def _requests(runtime: ModelRuntime, prompts: list[str], schema: dict | list[dict] | None,
              max_tokens: int, tag: str) -> list[GenerateRequest]:
    chat = runtime.name == "smollm2"  # a real chat model answers its template
    out = []
    for i, text in enumerate(prompts):
        prompt = (
            PromptInput(messages=(ChatMessage("user", text),)) if chat else PromptInput(text=text)
        )
        one = schema[i] if isinstance(schema, list) else schema
        out.append(GenerateRequest(f"{tag}-{i}", prompt, RequestOptions(
            max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
            constraint=OutputConstraint.json_schema(one) if one else None),
            model=runtime.name))
    return out


async def _finished(client, request: GenerateRequest) -> Finished:
    async for event in client.generate(request):
        if isinstance(event, Finished):
            if event.error is not None:
                raise RuntimeError(f"request {request.request_id} failed: {event.error}")
            return event
    raise RuntimeError(f"request {request.request_id} ended without Finished")


def random_draft(runtime: ModelRuntime, path: str, *, dflash2: bool, layers: int, block: int,
                 seed: int = 0) -> None:
    """Write a random-weight DFlash (or DFlash2) checkpoint for `runtime`'s target (dense or
    Qwen3.5) into directory `path` (bench/random_weights.py `write_random_dflash`)."""
    from bench.random_weights import write_random_dflash

    write_random_dflash(path, runtime.config, mask_token_id=runtime.domain.size - 1,
                        dflash2=dflash2, layers=layers, block=block, seed=seed,
                        dtype=runtime.dtype, device=runtime.device)


async def _round(runtime, opts: SpecBenchOptions, prompts, schema, *, backend: str | None,
                 k: int, oracle: OracleProposer | None, record: dict | None,
                 tag: str, drafts: dict | None = None, wrap=None) -> dict[str, Any]:
    # wrap(engine, drafter) -> proposer: a bench proposer over the round's drafter, installed
    # after the plain warm-up (bench/acceptance.py's known acceptance).
    max_len = 1024
    speculative = None if backend is None else backend \
        if backend in ("grammar", "mtp", "dflash", "dflash2") else "ngram"
    config = EngineConfig(max_batch=opts.batch_size, max_len=max_len, prefill_chunk=1024,
                          cuda_graphs=opts.cuda_graphs, speculative=speculative,
                          num_draft_tokens=k, max_waiting=len(prompts),
                          draft_model=(drafts or {}).get((backend, k)),
                          draft_vocab=opts.draft_vocab if backend == "mtp" else None,
                          # the start-up warm-up, as `serve` runs it on CUDA: no timed round
                          # (the first baseline included) compiles a kernel shape or a graph
                          warmup=runtime.device.type == "cuda")
    client = open_in_process(runtime, config)
    engine = client.engine
    try:
        # Warm-up (compiles the schema, first kernels, decode graphs) outside the timed round.
        drafter, engine.proposer = engine.proposer, None
        await asyncio.gather(*(_finished(client, r) for r in
                               _requests(runtime, prompts, schema, 4, f"w{tag}")))
        if backend == "oracle":
            drafter = ContextProposer(oracle, k)
        elif backend == "ngram-alone":
            drafter = ContextProposer(NgramProposer(
                token_bytes=runtime.domain.token_bytes, encode=runtime.tokenizer.encode), k)
        if wrap is not None:
            drafter = wrap(engine, drafter)
        engine.proposer = drafter
        if drafter is not None:  # a speculated warm-up too: verify graphs are captured lazily
            await asyncio.gather(*(_finished(client, r) for r in
                                   _requests(runtime, prompts, schema, 2 * k + 4, f"v{tag}")))
        if record is not None:
            engine.finish_listeners.append(
                lambda job: record.__setitem__(
                    job.request_id, job.prompt_ids + tuple(job.output_ids)
                )
            )
        before = dict(vars(engine.speculation), model=engine.program.draft_wait_seconds)
        requests = _requests(runtime, prompts, schema, opts.max_tokens, tag)
        captured = _graphs_captured(engine)
        with compile_log(runtime.device.type == "cuda") as (compiled, _):
            start = time.perf_counter()
            finished = await asyncio.gather(*(_finished(client, r) for r in requests))
            wall = time.perf_counter() - start
        after = _graphs_captured(engine)
        captured = {name: after[name] - captured[name] for name in after}
        spec = {name: value - before[name] for name, value in vars(engine.speculation).items()}
        spec["draft_seconds"] += engine.program.draft_wait_seconds - before["model"]
    finally:
        await client.aclose()
    tokens = sum(f.usage.completion_tokens for f in finished)
    reports = [f.constraint or {} for f in finished]
    out = {"wall_s": round(wall, 4), "output_tokens": tokens,
           "tok_s": round(tokens / wall, 2), "texts": [f.content for f in finished],
           "mask_seconds": round(sum(r.get("mask_seconds", 0.0) for r in reports), 6),
           "mask_wall_fraction": round(sum(r.get("mask_seconds", 0.0) for r in reports) / wall, 5),
           "mask_positions": sum(r.get("mask_positions", 0) for r in reports),
           # kernels the timed requests compiled or autotuned (the warm-ups should leave none)
           "compiles": [c["kernel"] for c in compiled],
           "graphs_captured": captured}
    if backend:
        rounds = spec["rounds"]
        out.update(
            {
                "verify_rounds": rounds,
                "drafts": spec["drafts"],
                "accepted": spec["accepted"],
                "mean_accepted": round(spec["accepted"] / rounds, 3) if rounds else 0.0,
                "acceptance_rate": round(spec["accepted"] / spec["drafts"], 4)
                if spec["drafts"]
                else 0.0,
                "tokens_per_round": round(spec["tokens"] / rounds, 3) if rounds else 0.0,
                "draft_wait_exposed_s": round(spec["draft_seconds"], 6),
                "draft_wait_fraction": round(spec["draft_seconds"] / wall, 5),
            }
        )
    return out


def _graphs_captured(engine) -> dict[str, int]:
    """CUDA graphs the engine's Program and its MTP proposer (under any wrappers) hold, per set:
    a timed run that adds some captured them on the request path."""
    program = engine.program
    forward = program.forward
    sets = {"decode": forward.graphs, "verify": forward.verify_graphs,
            "prefill": forward.prefill_graphs, "dflash": program.rounds.graphs}
    out = {name: len(g.captured) if g is not None else 0 for name, g in sets.items()}
    proposer = engine.proposer
    while proposer is not None and not hasattr(proposer, "graph_captures"):
        proposer = getattr(proposer, "wrapped", None)
    out["mtp"] = proposer.graph_captures if proposer is not None else 0
    return out


async def _bench(runtime, opts: SpecBenchOptions, log) -> list[dict]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="infernix-draft-") as tmp:
        drafts = {}
        for backend in opts.backends:
            if backend.startswith("dflash"):
                for k in opts.draft_tokens:
                    import os

                    path = os.path.join(tmp, f"{backend}-{k}")
                    os.makedirs(path)
                    random_draft(runtime, path, dflash2=backend == "dflash2",
                                 layers=opts.draft_layers, block=k + 1)
                    drafts[(backend, k)] = path
        return await _bench_rounds(runtime, opts, log, drafts)


async def _bench_rounds(runtime, opts: SpecBenchOptions, log, drafts: dict) -> list[dict]:
    rows = []
    for task in opts.tasks:
        prompts, schema = task_prompts(task, opts.batch_size)
        for mode, sch in (("unconstrained", None), ("constrained", schema)):
            recorded: dict = {}
            base = await _round(runtime, opts, prompts, sch, backend=None, k=1, oracle=None,
                                record=recorded, tag=f"{task}-{mode}-base")
            oracle = OracleProposer()
            for sequence in recorded.values():
                oracle.record(sequence)
            log(f"{task} {mode} baseline: {base['tok_s']} tok/s")
            runs = []
            for backend in opts.backends:
                for k in opts.draft_tokens:
                    run = await _round(runtime, opts, prompts, sch, backend=backend, k=k,
                                       oracle=oracle, record=None, drafts=drafts,
                                       tag=f"{task}-{mode}-{backend}{k}")
                    run.update(backend=backend, k=k,
                               speedup=round(base["wall_s"] / run["wall_s"], 3),
                               outputs_equal=run["texts"] == base["texts"])
                    log(f"{task} {mode} {backend} K={k}: x{run['speedup']}, accepted "
                        f"{run['mean_accepted']}/round, equal={run['outputs_equal']}")
                    runs.append(run)
            rows.append({"task": task, "mode": mode, "batch_size": opts.batch_size,
                         "baseline": base, "runs": runs})
    return rows


def _targets(rows: list[dict]) -> dict[str, Any]:
    """Constrained speed-up / unconstrained speed-up per task, backend and K (target >= 0.95),
    and the exposed draft wait as a fraction of the wall time per run (target < 0.05)."""
    keep, wait = {}, {}
    for r in rows:
        for run in r["runs"]:
            wait[f"{r['task']}/{r['mode']}/{run['backend']}/K={run['k']}"] = run[
                "draft_wait_fraction"
            ]
    for c_row in (r for r in rows if r["mode"] == "constrained"):
        u_row = next((r for r in rows if r["task"] == c_row["task"]
                      and r["mode"] == "unconstrained"), None)
        for c, u in zip(c_row["runs"], u_row["runs"] if u_row else []):
            keep[f"{c_row['task']}/{c['backend']}/K={c['k']}"] = round(
                c["speedup"] / u["speedup"], 3
            )
    return {"constrained_over_unconstrained_speedup_ge_0.95": keep,
            "draft_wait_fraction_lt_0.05": wait}


def _runtime(model: str, device: str) -> ModelRuntime:
    """The decode bench's models; `qwen35-9b-random` with its MTP module (bf16 on CUDA;
    structure only)."""
    if model != "qwen35-9b-random":
        return build_runtime(model, device)
    import torch

    from bench.random_weights import random_qwen35_runtime

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return random_qwen35_runtime(dtype=dtype, device=device, mtp=True)


def run(args: argparse.Namespace) -> int:
    opts = SpecBenchOptions.from_args(args)

    def log(line: str) -> None:
        print(f"[bench spec] {line}", file=sys.stderr, flush=True)

    from shared.logging import configure_logging

    configure_logging(args.log_level)
    started = time.perf_counter()
    runtime = _runtime(args.model, args.device)
    report: dict[str, Any] = {
        **report_header("spec", args, runtime),
        "options": {"tasks": list(opts.tasks), "backends": list(opts.backends),
                    "draft_tokens": list(opts.draft_tokens), "batch_size": opts.batch_size,
                    "max_tokens": opts.max_tokens, "cuda_graphs": opts.cuda_graphs,
                    "draft_layers": opts.draft_layers, "draft_vocab": opts.draft_vocab,
                    "greedy": True, "route": "host-launched (drafts on the host before the "
                                               "verify forward, a CUDA graph per padded batch "
                                               "size on CUDA, acceptance after it)"},
    }
    rows = asyncio.run(_bench(runtime, opts, log))
    report["results"] = rows
    report["targets"] = _targets(rows)
    report["total_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.out)
    return 0
