"""Speculative proposers (n-gram copy, MTP, DFlash, DFlash2).

Proposers produce drafts (and, for DFlash2, the sparse q over their candidates), never masks: the
target is constrained, drafts are not. The Program's verify stage (program/verify.py) fills K+1
lookahead masks along each row's proposal chain and verifies the drafts. Chosen by a plain
if/elif on the engine's configuration (`make_drafter`).

    ngram.py    prompt-lookup copy from the request's own context (any model)
    drafter.py  the host-launched route: drafts fixed on the host before the verify forward
"""

from __future__ import annotations

from services.worker.spec.drafter import HostDrafter, SpecCounters
from services.worker.spec.ngram import NgramProposer
from shared.errors import Unsupported

BACKENDS = ("ngram", "mtp", "dflash", "dflash2")  # what --speculative names
IMPLEMENTED = ("ngram",)


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


def make_drafter(backend: str | None, num_draft_tokens: int) -> HostDrafter | None:
    """The drafter of a checked backend (None: no speculation)."""
    if backend is None:
        return None
    if backend == "ngram":
        return HostDrafter(NgramProposer(), num_draft_tokens)
    raise Unsupported(f"speculative backend {backend!r} is not implemented", field="speculative")


__all__ = ["BACKENDS", "HostDrafter", "IMPLEMENTED", "NgramProposer", "SpecCounters",
           "check_backend", "make_drafter"]
