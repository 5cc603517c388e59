"""The constraint report of one request: what the grammar cost and in which state the output ended.

`GenerationResult.constraint` in the design document. It is present only when a matcher is enabled
and records the *committed* state: `complete` (the language may end now), `terminated` (EOS was
accepted); a continuation prefix takes part in both. Complete content cut by the output limit shows
complete=True, terminated=False and the finish reason stays the length limit.

The counters are work already paid: a rolled-back lookahead still counts its mask positions and
its time. Times are `time.perf_counter` seconds spent on the worker thread. The same `to_dict()`
shape goes into HTTP aggregate results, SSE terminal events, `request_done` logs and benchmark JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

BRANCHES = ("undecided", "content", "tools")
CACHE_HITS = (None, "l1", "redis", "service")  # "service": the grammar service sent the blob


@dataclass(frozen=True)
class ConstraintReport:
    """A snapshot of one request's constraint state and costs (see the module docstring)."""

    branch: str  # "undecided" | "content" | "tools": which output branch the matcher is in
    complete: bool  # the committed content (prefix + suffix) may end now
    terminated: bool  # EOS was accepted: a normal constrained completion
    cache: str | None  # "l1" | "redis" | None (no cache hit: built or waited for a build)
    built: bool  # this request's lookup ran the cold compile
    waited: bool  # this request waited for another request's compile of the same key
    compile_ms: float  # >= 0, the compile time the grammar service reported (0 on a hit)
    mask_positions: int  # >= 0, mask rows actually computed (Ready and DeadEnd, lookahead included)
    mask_upload_bytes: int  # >= 0, mask H2D bytes of successful commits (counted by the Program)
    prepare_seconds: float  # matcher creation and continuation-prefix acceptance
    mask_seconds: float  # mask fills and the temporary draft accepts of lookahead
    rollback_seconds: float  # lookahead rollbacks to the baseline
    accept_seconds: float  # matcher accepts of output and forced-control previews
    discard_seconds: float  # rollbacks of discarded or failed previews
    draft_wait_exposed_seconds: float  # draft-ready waits this request saw (not additive)
    verify_rounds: int  # >= 0, committed speculative rounds that verified at least one draft
    draft_tokens: int  # >= 0, drafts those rounds proposed (never constrained)
    accepted_drafts: int  # >= 0, drafts committed; mean accepted length = accepted / rounds

    def __post_init__(self) -> None:
        if self.branch not in BRANCHES:
            raise ValueError(f"branch must be one of {BRANCHES}, got {self.branch!r}")
        if self.cache not in CACHE_HITS:
            raise ValueError(f"cache must be one of {CACHE_HITS}, got {self.cache!r}")
        for name in ("compile_ms", "mask_positions", "mask_upload_bytes", "prepare_seconds",
                     "mask_seconds", "rollback_seconds", "accept_seconds", "discard_seconds",
                     "draft_wait_exposed_seconds", "verify_rounds", "draft_tokens",
                     "accepted_drafts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dictionary with the field names above (every value is a scalar:
        `asdict`'s deep copy would copy nothing)."""
        return {name: getattr(self, name) for name in _REPORT_FIELDS}


@dataclass
class ConstraintCounters:
    """The mutable counters an OutputSession keeps; `snapshot` freezes them into a report."""

    cache: str | None = None
    built: bool = False
    waited: bool = False
    compile_ms: float = 0.0
    mask_positions: int = 0
    mask_upload_bytes: int = 0
    prepare_seconds: float = 0.0
    mask_seconds: float = 0.0
    rollback_seconds: float = 0.0
    accept_seconds: float = 0.0
    discard_seconds: float = 0.0
    draft_wait_exposed_seconds: float = 0.0
    verify_rounds: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0

    def add_upload_bytes(self, n: int) -> None:
        """Mask H2D bytes of a successful commit (counted by the commit path)."""
        self.mask_upload_bytes += n

    def add_draft_wait(self, seconds: float) -> None:
        """A draft-ready wait the request experienced (counted by the Engine)."""
        self.draft_wait_exposed_seconds += seconds

    def add_verify_round(self, drafts: int, accepted: int) -> None:
        """A committed verification round: `drafts` proposed, `accepted` of them committed."""
        self.verify_rounds += 1
        self.draft_tokens += drafts
        self.accepted_drafts += accepted

    def snapshot(self, *, branch: str, complete: bool, terminated: bool) -> ConstraintReport:
        return ConstraintReport(branch=branch, complete=complete, terminated=terminated,
                                **{name: getattr(self, name) for name in _COUNTER_FIELDS})


_REPORT_FIELDS = tuple(f.name for f in fields(ConstraintReport))
_COUNTER_FIELDS = tuple(f.name for f in fields(ConstraintCounters))
