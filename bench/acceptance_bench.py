"""`infernix bench spec --acceptance P ...` (its options in bench/cli.py): speculative decoding at
known acceptance rates (bench/acceptance.py), JSON.

Per batch size B, task and mode (unconstrained, JSON Schema constrained) a plain greedy round runs
first and records every request's tokens (the replay, and the reference of greedy equality); then
per backend, K (MTP, the oracle) or DFlash block (K = block - 1) and p, a speculative round whose
backend runs its real draft passes while its drafts are the replay corrupted at rate 1 - p.

Reported per run, beside bench/spec.py's fields (wall time, tokens, verify rounds, exposed draft
wait as seconds and as a share of the wall time, mask seconds): p, the measured acceptance rate
(`measured_p`), the mean accepted per round against p + ... + p^K, the cost of a round in plain
steps (tokens per round over the speed-up: the speed-up is tokens per round over round cost),
the exposed draft wait less the replay's own host time (`backend_draft_wait_fraction`, what the
targets read), greedy equality with the plain round per request, and the agreement of the real
acceptance with the planned leading run (1.0 where verify and decode are one numerical route).
`targets` holds the speculation targets, each with its value and whether it is met (measured,
never asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

import torch

from bench.acceptance import KnownAcceptance, Replay, summary
from bench.spec import SpecBenchOptions, _round, _runtime, random_draft, task_prompts

BACKENDS = ("oracle", "mtp", "dflash", "dflash2")


def _ks(backend: str, opts: SpecBenchOptions, blocks) -> list[int]:
    return [b - 1 for b in blocks] if backend.startswith("dflash") else list(opts.draft_tokens)


async def bench_acceptance(runtime, opts: SpecBenchOptions, *, ps, batch_sizes, blocks, modes,
                           seed: int = 0, log=lambda line: None) -> list[dict]:
    """One row per (B, task, mode): its plain baseline and its runs (see the module docstring)."""
    if not ps or any(not 0.0 <= p <= 1.0 for p in ps):
        raise ValueError(f"--acceptance rates must be in [0, 1], got {ps}")
    if any(b not in BACKENDS for b in opts.backends):
        raise ValueError(f"--acceptance runs the backends {BACKENDS}, got {opts.backends}")
    if any(b < 2 for b in blocks) or any(b < 1 for b in batch_sizes) or not modes:
        raise ValueError("--blocks >= 2, --batch-sizes >= 1 and at least one mode")
    with tempfile.TemporaryDirectory(prefix="infernix-draft-") as tmp:
        drafts = {}
        for backend in (b for b in opts.backends if b.startswith("dflash")):
            for block in blocks:
                path = os.path.join(tmp, f"{backend}-{block}")
                os.makedirs(path)
                random_draft(runtime, path, dflash2=backend == "dflash2",
                             layers=opts.draft_layers, block=block)
                drafts[(backend, block - 1)] = path
        # One plain round first, discarded: the process's one-time work (first kernels, the
        # allocator) would otherwise land in the first timed baseline.
        prompts, _ = task_prompts(opts.tasks[0], batch_sizes[0])
        await _round(runtime, replace(opts, batch_size=batch_sizes[0]), prompts, None,
                     backend=None, k=1, oracle=None, record=None, tag="process-warm-up")
        rows = []
        for b in batch_sizes:
            o = replace(opts, batch_size=b)
            for task in opts.tasks:
                prompts, schema = task_prompts(task, b)
                for mode in modes:
                    rows.append(await _row(runtime, o, prompts, schema if mode == "constrained"
                                           else None, task, mode, ps, blocks, drafts, seed, log))
    return rows


async def _row(runtime, o, prompts, schema, task, mode, ps, blocks, drafts, seed, log) -> dict:
    recorded: dict = {}
    tag = f"{task}-{mode}-B{o.batch_size}"
    base = await _round(runtime, o, prompts, schema, backend=None, k=1, oracle=None,
                        record=recorded, tag=f"{tag}-base")
    replay = Replay()
    for sequence in recorded.values():
        replay.record(sequence)
    log(f"{tag} plain: {base['tok_s']} tok/s")
    runs = []
    for backend in o.backends:
        for k in _ks(backend, o, blocks):
            for p in ps:
                made: list[KnownAcceptance] = []

                def wrap(engine, drafter, p=p, k=k, backend=backend, made=made):
                    inner = None if backend == "oracle" else drafter
                    w = KnownAcceptance(inner, replay, p, k=k, vocab_size=runtime.domain.size,
                                        lanes=engine.program.max_batch,
                                        device=torch.device(runtime.device), seed=seed)
                    engine.program.use(w)  # the Program's after_step and device drafts too
                    made.append(w)
                    return w

                run_tag = f"{tag}-{backend}{k}-p{p}"
                run = await _round(runtime, o, prompts, schema, backend=backend, k=k, oracle=None,
                                   record=None, drafts=drafts, tag=run_tag, wrap=wrap)
                w = made[-1]
                timed = [w.stats[rid] for rid in w.stats if rid.startswith(f"{run_tag}-")]
                speedup = base["wall_s"] / run["wall_s"]
                equal = [a == b for a, b in zip(run["texts"], base["texts"])]
                run.update(backend=backend, k=w.k, block=k + 1 if backend.startswith("dflash")
                           else None, speedup=round(speedup, 3), outputs_equal=all(equal),
                           equal_requests=equal,
                           equal_fraction=round(sum(equal) / len(equal), 4),
                           round_cost_plain_steps=round(run["tokens_per_round"] / speedup, 3)
                           if run["verify_rounds"] else None,
                           known_acceptance=summary(timed, p, w.k))
                # The exposed draft wait without the replay's own host time: the backend's.
                own = run["known_acceptance"]["replay_seconds"]
                run["backend_draft_wait_fraction"] = round(
                    max(0.0, run["draft_wait_exposed_s"] - own) / run["wall_s"], 5)
                log(f"{run_tag}: x{run['speedup']}, accepted {run['mean_accepted']}/round "
                    f"(p={p}: {run['known_acceptance']['expected_mean_accepted']}), measured p "
                    f"{run['known_acceptance']['measured_p']}, wait "
                    f"{run['draft_wait_fraction']}, equal {run['equal_fraction']}")
                runs.append(run)
    return {"task": task, "mode": mode, "batch_size": o.batch_size, "baseline": base,
            "runs": runs}


def _met(value, ok: bool) -> dict:
    return {"value": value, "met": ok}


def targets(rows: list[dict]) -> dict[str, dict]:
    """The speculation targets on the rows measured (a target with no row is absent): MTP K=3
    p=0.8 B=1 >= 2.2x and a round <= 1.3 plain steps; DFlash block 8 p=0.8 >= 2.5x; constrained
    keeps >= 95% of the unconstrained speed-up; exposed draft wait < 3% of the wall time; MTP K=1
    p=0 a round <= 1.15 plain steps; greedy equality in every request."""
    out: dict[str, dict] = {}
    for r in rows:
        where = f"{r['task']}/{r['mode']}/B={r['batch_size']}"
        for run in r["runs"]:
            name = f"{run['backend']}/K={run['k']}/p={run['known_acceptance']['p']}"
            key = f"{where}/{name}"
            p, k, b, cost = run["known_acceptance"]["p"], run["k"], r["batch_size"], \
                run["round_cost_plain_steps"]
            if run["backend"] == "mtp" and k == 3 and p == 0.8 and b == 1:
                out[f"speedup_ge_2.2/{key}"] = _met(run["speedup"], run["speedup"] >= 2.2)
                out[f"round_cost_le_1.3/{key}"] = _met(cost, cost is not None and cost <= 1.3)
            if run["backend"] == "mtp" and k == 1 and p == 0.0:
                out[f"round_cost_le_1.15/{key}"] = _met(cost, cost is not None and cost <= 1.15)
            if run["backend"] == "dflash" and run["block"] == 8 and p == 0.8:
                out[f"speedup_ge_2.5/{key}"] = _met(run["speedup"], run["speedup"] >= 2.5)
            wait = run["backend_draft_wait_fraction"]
            out[f"draft_wait_lt_0.03/{key}"] = _met(wait, wait < 0.03)
            out[f"greedy_equal/{key}"] = _met(run["equal_fraction"], run["outputs_equal"])
            if r["mode"] == "constrained":
                u = next((x for x in rows if x["task"] == r["task"] and x["mode"] ==
                          "unconstrained" and x["batch_size"] == b), None)
                twin = next((x for x in (u or {}).get("runs", []) if x["backend"] ==
                             run["backend"] and x["k"] == k and x["known_acceptance"]["p"] == p),
                            None)
                if twin is not None:
                    keep = round(run["speedup"] / twin["speedup"], 3)
                    out[f"constrained_keep_ge_0.95/{r['task']}/B={b}/{name}"] = _met(keep,
                                                                                   keep >= 0.95)
    return out


def run(args: argparse.Namespace) -> int:
    """`infernix bench spec --acceptance ...` (bench/cli.py)."""
    from bench.report import report_header, write_report
    from shared.logging import configure_logging

    opts = SpecBenchOptions.from_args(args)
    batch_sizes = tuple(args.batch_sizes or [args.batch_size])

    def log(line: str) -> None:
        print(f"[bench spec] {line}", file=sys.stderr, flush=True)

    configure_logging(args.log_level)
    started = time.perf_counter()
    runtime = _runtime(args.model, args.device)
    report: dict[str, Any] = {
        **report_header("spec", args, runtime),
        "options": {"tasks": list(opts.tasks), "backends": list(opts.backends),
                    "draft_tokens": list(opts.draft_tokens), "blocks": list(args.blocks),
                    "acceptance": list(args.acceptance), "batch_sizes": list(batch_sizes),
                    "modes": list(args.modes), "max_tokens": opts.max_tokens,
                    "cuda_graphs": opts.cuda_graphs, "draft_layers": opts.draft_layers,
                    "draft_vocab": opts.draft_vocab,
                    "seed": args.seed, "greedy": True,
                    "known_acceptance": "drafts = the plain greedy continuation, each corrupted "
                    "with probability 1 - p; the backend's draft passes run, their ids dropped"},
    }
    rows = asyncio.run(bench_acceptance(runtime, opts, ps=tuple(args.acceptance),
                                        batch_sizes=batch_sizes, blocks=tuple(args.blocks),
                                        modes=tuple(args.modes), seed=args.seed, log=log))
    report["results"] = rows
    report["targets"] = targets(rows)
    report["total_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.out)
    return 0
