"""The worker's health: its report (status, capacity, occupancy, warm-up, prefix cache,
speculation) and the unavailable boundary that an integrity failure takes it through.

`status` is "ok", "warming" (the start-up warm-up runs: not ready), "unavailable" (recovering from
an integrity failure) or "stopped"; the gateway's pool and the compose health check read it.
"""

from __future__ import annotations

from services.worker.integrity import IntegrityError
from shared.errors import ServiceUnavailable
from shared.generation import FinishReason
from shared.logging import get_logger

log = get_logger(__name__)


def engine_health(engine) -> dict:
    """`engine`'s health as a JSON-ready dict (read from any thread; values may be a step old)."""
    program, scheduler = engine.program, engine.scheduler
    stats = program.blocks.stats
    status = "ok" if engine.running else "stopped"
    if engine.running and engine.warming:
        status = "warming"
    if engine.running and engine.unavailable is not None:
        status = "unavailable"
    report = {"status": status, "model": engine.runtime.name}
    if engine.unavailable:
        report["unavailable"] = engine.unavailable
    report.update({
        "device": str(program.device), "max_batch": program.max_batch,
        "max_len": program.max_len, "resident": len(scheduler.resident),
        "waiting": len(scheduler.waiting), "preparing": engine.admission.preparing,
        "steps": engine.steps,
    })
    if engine.warmup is not None:
        report["warmup"] = engine.warmup.to_dict()
    report["prefix_cache"] = {"enabled": program.prefix_cache,
                              "hit_rate": round(stats.hit_rate, 4),
                              "hit_tokens": stats.hit_tokens, "evictions": stats.evictions,
                              "state_snapshots": stats.snapshots}
    if engine.proposer:
        report["speculative"] = engine.config.speculative
        report["speculation"] = engine.speculation.to_dict(program.draft_wait_seconds)
    return report


def unavailable_boundary(engine, exc: IntegrityError) -> None:
    """The design document's unavailable boundary: after an integrity failure (a Program
    commit that could not complete, a matcher that could not roll back, a broken batch
    membership) nothing of the Program's state is trusted. New requests are refused
    (ServiceUnavailable: a gateway's pool routes elsewhere) and health says "unavailable";
    every live request fails typed with what it had published; then the Program is built
    anew (lanes, KV pool, prefix cache) and the engine serves again. A rebuild that fails
    leaves it unavailable."""
    log.error("engine_integrity_failure", error=str(exc))
    engine.unavailable = str(exc)
    engine.pipeline.drop()
    _fail_live(engine, exc)

    try:
        engine.program.close()
        engine.build()
    except Exception:
        log.exception("engine_recovery_failed")
        return
    engine.unavailable = None
    log.info("engine_recovered")


def refuse_while_unavailable(engine) -> None:
    """After a rebuild that failed, nothing may run on the old Program (on a lost device every
    forward fails again; on a device that still computes, its state is not trusted): requests
    that were already in the inbox when the boundary closed submissions fail typed, as the live
    ones did."""
    _fail_live(engine, engine.unavailable)


def _fail_live(engine, what) -> None:
    error = ServiceUnavailable(f"the worker lost its integrity and is recovering: {what}",
                               service="worker", retry_after_s=5.0)
    for job in engine.scheduler.live():  # (the inbox's requests go to the new Program)
        job.lane = None  # the lanes go with the old Program
        engine.post.finish(job, FinishReason.ERROR, error)
    engine.post.flush()
