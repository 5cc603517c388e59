"""Speculative proposers (n-gram copy, MTP, DFlash, DFlash2).

Proposers produce drafts (and, for DFlash2, the sparse q over their candidates), never masks: the
target is constrained, drafts are not. The Program's verify stage (program/verify.py) fills K+1
lookahead masks along each row's proposal chain and verifies the drafts. Chosen by a plain
if/elif on the engine's configuration (`make_drafter`).

    ngram.py    prompt-lookup copy from the request's own context (any model)
    mtp.py      the Qwen3.5 MTP module, k steps, aligned after every step
    oracle.py   the target's own recorded continuation (benchmarks and tests only)
    drafter.py  the host-launched route: drafts fixed on the host before the verify forward
"""

from __future__ import annotations

from services.worker.spec.drafter import HostDrafter, SpecCounters
from services.worker.spec.ngram import NgramProposer
from shared.errors import Unsupported

BACKENDS = ("ngram", "mtp", "dflash", "dflash2")  # what --speculative names
IMPLEMENTED = ("ngram", "mtp")


def check_backend(backend: str | None, draft_model: str | None) -> None:
    """Refuse a speculative backend this build does not run. Raises Unsupported naming the field
    (`speculative` for an unknown or unimplemented backend, `draft_model` for a draft model the
    backend takes none of)."""
    if backend is None:
        if draft_model is not None:
            raise Unsupported("--draft-model needs --speculative dflash or dflash2",
                              field="draft_model")
        return
    if backend not in BACKENDS:
        raise Unsupported(f"speculative backend {backend!r} is unknown (expected one of "
                          f"{', '.join(BACKENDS)})", field="speculative")
    if backend not in IMPLEMENTED:
        raise Unsupported(f"speculative backend {backend!r} is not implemented in this build "
                          f"(implemented: {', '.join(IMPLEMENTED)})", field="speculative")
    if backend == "ngram" and draft_model is not None:
        raise Unsupported("the ngram backend takes no draft model", field="draft_model")


def check_model(backend: str | None, model) -> None:
    """Refuse a backend the served model cannot run: Unsupported(field="speculative")."""
    if backend == "mtp" and getattr(model, "mtp", None) is None:
        raise Unsupported("--speculative mtp needs a model with an MTP module (a Qwen3.5 "
                          "checkpoint with mtp.* weights)", field="speculative")


def make_drafter(backend: str | None, num_draft_tokens: int, program) -> HostDrafter | None:
    """The drafter of a checked backend (None: no speculation); MTP drafts come from the
    Program's MTP proposer (filled after every step)."""
    if backend is None:
        return None
    if backend == "ngram":
        return HostDrafter.from_context(NgramProposer(), num_draft_tokens)
    if backend == "mtp":
        return HostDrafter(program.mtp.propose, num_draft_tokens)
    raise Unsupported(f"speculative backend {backend!r} is not implemented", field="speculative")


__all__ = ["BACKENDS", "HostDrafter", "IMPLEMENTED", "NgramProposer", "SpecCounters",
           "check_backend", "check_model", "make_drafter"]
