"""The decode pipeline (EngineConfig.pipeline; on CUDA by default): chaining step n+1 before step
n's commit, so the commit's host work overlaps the device's forward.

A sampled decode step n is held uncommitted (`hold_or_commit`); the next engine step
(`advance`) launches step n+1 first, with each row's sampled token at the next position, and only
then commits step n (preview -> Program commit -> confirm -> publish -> finish, unchanged). Step
n+1 then samples only the rows that step n's commit left exactly where the launch assumed (still
resident, not cancelled, the sampled token committed as the newest output, nothing forced after
it); the others are left out of it, which leaves no trace: their uncommitted KV writes lie past
the committed frontier (models/state.py). A step is chained only when nothing else waits for the
batch: no admission, no prefill, no row at the lane's end; otherwise the held step commits first
and the engine step runs as before.

A hybrid model's next forward reads the recurrent state step n leaves, so step n's device state
is committed ahead of its preview (`Program.commit_ahead`); step n+1 writes the other slot, so a
row left out of it keeps that state, but a row whose step n then aborts (a failed preview:
nothing of the round commits) holds a token its ledger does not, and resumes by Replay (the
scheduler pauses it).

A prefill step overlaps the held step too (`holding`, `commit_held`): where the next engine step
is a prefill step (rows joining the batch), the held decode step stays uncommitted through
admission and scheduling, the prefill forward is launched, and only then is the held step
committed (Engine._run_step), so its host work runs while the device prefills. The prefill rows
are other requests than the held step's, on other lanes: nothing the prefill reads is written by
that commit (a held step that fed a prompt's last token commits first: until then its request
still counts as prefilling). Admission's thinking-budget closes skip the held step's requests
(their ledgers are a step behind; the commit path forces a close that step makes due). Not
where a preemption may pause a request (it takes committed requests only) or where the next step
would be a decode step (a request admitted wholly from the prefix cache): the held step commits
first.

Without a proposer only: a proposer aligns with every committed step (its `after_step` reads
step n's results before anything of step n+1 is drafted).
"""

from __future__ import annotations

from services.worker.engine.postprocess import Postprocessor
from services.worker.engine.scheduler import Scheduler
from services.worker.integrity import IntegrityError, step_failure
from services.worker.program import BatchRow, PendingBatch, Program, RowOutcome, StepBatch
from services.worker.request import RequestState
from shared.logging import get_logger

log = get_logger(__name__)


class Pipeline:
    """Holds, chains, commits and drains decode steps (see the module docstring). `enabled`:
    whether sampled decode steps are held at all (off: every step commits at once)."""

    def __init__(self, program: Program, scheduler: Scheduler, post: Postprocessor, *,
                 enabled: bool) -> None:
        self.program = program
        self.scheduler = scheduler
        self.post = post
        self.enabled = enabled
        self.chained_steps = 0  # steps launched before the previous step's commit
        self.overlapped_prefills = 0  # prefill steps launched before the held step's commit
        self._held: PendingBatch | None = None  # a sampled decode step not committed yet

    def advance(self) -> bool:
        """Move the held step on: chain the next step onto it (True: that was this engine
        step) or commit it (False: the engine step goes on unpipelined). False when nothing
        is held."""
        held, self._held = self._held, None
        if held is None:
            return False
        held = _live(held)  # rows of requests retired meanwhile are gone
        if self._can_chain(held):
            self._chain(held)
            return True
        if self._can_overlap(held):
            self._held = held  # committed once the prefill step's forward is launched
            return False
        self.commit(held)
        return False

    @property
    def holding(self) -> bool:
        """Whether a decode step is held uncommitted across this engine step's admission and
        scheduling (for a prefill step to launch first)."""
        return self._held is not None

    def held_requests(self) -> set[int]:
        """The ids of the held step's requests (their ledgers are a step behind)."""
        return set() if self._held is None else {id(r.request) for r in self._held.batch.rows}

    def commit_held(self, *, overlapped: bool = False) -> None:
        """Commit the held step now: after a prefill step's launch (`overlapped`), or before
        any other step."""
        held, self._held = self._held, None
        if held is not None:
            self.overlapped_prefills += overlapped
            self.commit(_live(held))

    def hold_or_commit(self, pending: PendingBatch) -> None:
        """Hold a sampled decode step for the next engine step to chain onto; commit any other."""
        if self.enabled and pending.batch.rows and pending.batch.is_decode:
            self._held = pending
        else:
            self.commit(pending)

    def commit(self, pending: PendingBatch) -> None:
        """The one commit path (postprocess.py); on the CPU its events go out at once (a CPU
        forward is synchronous: holding them gains nothing)."""
        self.post.commit(pending)
        if not self.program.cuda:
            self.post.flush()

    def drain(self) -> None:
        """At stop: the held step is committed and published (before the rest is cancelled)."""
        held, self._held = self._held, None
        if held is not None:
            self.commit(_live(held))

    def drop(self) -> None:
        """After an engine failure: the held step is forgotten (its requests fail)."""
        self._held = None

    def _can_chain(self, held: PendingBatch) -> bool:
        rows = held.batch.rows
        if not rows or not held.batch.is_decode:
            return False
        if any(r.outcome is not RowOutcome.TOKENS or len(r.tokens) != 1 for r in held.results):
            return False
        sched = self.scheduler
        if sched.waiting and (self.program.free_lanes or sched.preempt_after_s is not None):
            return False  # an admission (or a preemption) comes first
        if len(sched.resident) != len(rows):
            return False  # a resident row is prefilling
        limit = self.program.max_len
        return all(r.start + 2 <= limit for r in rows)

    def _can_overlap(self, held: PendingBatch) -> bool:
        # A prefill step can run before the held commit: rows prefilling or waiting for a free
        # lane, and no preemption that could pause one of the held step's requests.
        if not held.batch.rows:
            return False
        if any(r.request.in_prefill for r in held.batch.rows):
            return False  # a held prompt's last token: its commit ends that row's prefill
        sched = self.scheduler
        if sched.waiting and sched.preempt_after_s is not None:
            return False
        return any(j.in_prefill for j in sched.resident) or \
            bool(sched.waiting and self.program.free_lanes)

    def _chain(self, held: PendingBatch) -> None:
        program, post = self.program, self.post
        batch = StepBatch(tuple(BatchRow(row.request, res.tokens, row.start + 1, True)
                                for row, res in zip(held.batch.rows, held.results)))
        self.chained_steps += 1
        program.commit_ahead(held)  # a hybrid model's next forward reads step n's state
        try:
            launched = program.launch(batch)
        except IntegrityError:
            raise  # the Engine's unavailable boundary
        except Exception as exc:  # step n still commits; its rows then fail
            log.exception("program_step_failed")
            self.commit(held)
            live = tuple(r for r in batch.rows if r.request.state is RequestState.RESIDENT)
            post.fail_batch(StepBatch(live), step_failure(exc))
            post.flush()
            return
        self.commit(held)
        post.flush()  # step n's events go out while step n+1's forward runs
        keep = [i for i, row in enumerate(batch.rows) if _continues(row)]
        if program.recurrent:
            for row in batch.rows:  # step n aborted after its state was committed ahead: the
                job = row.request  # recurrent state holds a token the ledger does not; Replay
                if job.state is RequestState.RESIDENT and not job.cancel_requested \
                        and job.num_cached != row.start:
                    self.scheduler.pause(job, program)
        try:
            pending = program.finish(launched, keep)
        except IntegrityError:
            raise
        except Exception as exc:
            log.exception("program_step_failed")
            post.fail_batch(StepBatch(tuple(batch.rows[i] for i in keep)), step_failure(exc))
            post.flush()
            return
        self.hold_or_commit(pending)


def _live(pending: PendingBatch) -> PendingBatch:
    """The rows of a held step whose requests are still resident (a retired request's row is
    dropped with its result)."""
    rows = pending.batch.rows
    keep = [i for i, row in enumerate(rows) if row.request.state is RequestState.RESIDENT]
    if len(keep) == len(rows):
        return pending
    return PendingBatch(StepBatch(tuple(rows[i] for i in keep)),
                        tuple(pending.results[i] for i in keep))


def _continues(row: BatchRow) -> bool:
    """Whether a chained row's request is where the launch assumed after the held commit: still
    resident and live, its lane at row.start, row.tokens[0] its newest committed output token."""
    job = row.request
    return (job.state is RequestState.RESIDENT and not job.cancel_requested and not job.in_prefill
            and job.num_cached == row.start and bool(job.output_ids)
            and job.output_ids[-1] == row.tokens[0])
