"""Speculative proposers (grammar drafts, n-gram copy, MTP, DFlash, DFlash2).

Proposers produce drafts (and, for DFlash2, the sparse q over their candidates), never masks: the
target is constrained, drafts are not. The Program's verify stage (program/verify.py) fills K+1
lookahead masks along each row's proposal chain and verifies the drafts. Chosen by a plain
if/elif on the engine's configuration (`make_drafter`).

    grammar.py  the text a constrained row's grammar forces, canonically tokenized; composed
                with the n-gram or MTP drafts of the same row (any model)
    ngram.py    prompt-lookup copy from the request's own context (any model)
    mtp.py      the Qwen3.5 MTP module, k steps, aligned after every step
    dflash.py   DFlash / DFlash2 draft models (models/dflash.py) conditioned on target layers
    oracle.py   the target's own recorded continuation (benchmarks and tests only)
    drafter.py  drafts per decode row (host proposers) or their limit (DFlash drafts on the
                device in the round's Forward phase); the engine's speculation counters
"""

from __future__ import annotations

from services.worker.spec.drafter import HostDrafter, Proposal, SpecCounters
from services.worker.spec.grammar import GrammarProposer, chain_other, context_other
from services.worker.spec.ngram import NgramProposer
from shared.errors import Unsupported

BACKENDS = ("grammar", "ngram", "mtp", "dflash", "dflash2")  # what --speculative names


def check_backend(backend: str | None, draft_model: str | None) -> None:
    """Refuse a speculative configuration before any model loads. Raises Unsupported naming the
    field (`speculative` for an unknown backend, `draft_model` for a draft model the backend
    takes none of, or a missing one that it needs)."""
    if backend is None:
        if draft_model is not None:
            raise Unsupported("--draft-model needs --speculative dflash or dflash2",
                              field="draft_model")
        return
    if backend not in BACKENDS:
        raise Unsupported(f"speculative backend {backend!r} is unknown (expected one of "
                          f"{', '.join(BACKENDS)})", field="speculative")
    if backend in ("grammar", "ngram", "mtp") and draft_model is not None:
        raise Unsupported(f"the {backend} backend takes no draft model", field="draft_model")
    if backend in ("dflash", "dflash2") and draft_model is None:
        raise Unsupported(f"--speculative {backend} needs --draft-model DIR", field="draft_model")


def check_model(backend: str | None, model) -> None:
    """Refuse a backend the served model cannot run: Unsupported(field="speculative")."""
    if backend == "mtp" and getattr(model, "mtp", None) is None:
        raise Unsupported("--speculative mtp needs a model with an MTP module (a Qwen3.5 "
                          "checkpoint with mtp.* weights)", field="speculative")
    if backend in ("dflash", "dflash2") and type(model).__name__ != "DenseDecoder":
        raise Unsupported(f"--speculative {backend} runs on dense Llama/Qwen3 targets; "
                          f"{type(model).__name__} targets are not implemented",
                          field="speculative")


def load_draft(backend: str | None, path: str | None, runtime):
    """The DFlash / DFlash2 draft model of `path` for `runtime`'s target, on its device and
    dtype (None for other backends). Raises InvalidRequest(field="draft_model") for a directory
    that is not a loadable draft checkpoint, Unsupported(field="draft_model") for a draft that
    does not fit the backend or the target."""
    if backend not in ("dflash", "dflash2"):
        return None
    from services.worker.models.dflash import DraftConfigError, load_dflash
    from shared.errors import InvalidRequest

    try:
        draft = load_dflash(path, dtype=runtime.dtype, device=runtime.device)
    except (OSError, ValueError) as exc:
        if isinstance(exc, DraftConfigError):
            raise Unsupported(f"draft model {path}: {exc}", field="draft_model") from None
        raise InvalidRequest(f"draft model {path}: {exc}", field="draft_model") from None
    c, t = draft.config, runtime.config
    if c.dflash2 != (backend == "dflash2"):
        raise Unsupported(f"{path} is a {'DFlash2' if c.dflash2 else 'DFlash'} draft; use "
                          f"--speculative {'dflash2' if c.dflash2 else 'dflash'}", field="draft_model")
    problems = []
    if c.hidden_size != t.hidden_size:
        problems.append(f"hidden_size {c.hidden_size} != the target's {t.hidden_size}")
    if max(c.target_layer_ids) >= t.num_layers or min(c.target_layer_ids) < 0:
        problems.append(f"target_layer_ids {list(c.target_layer_ids)} outside the target's "
                        f"{t.num_layers} layers")
    if not 0 <= c.mask_token_id < t.vocab_size:
        problems.append(f"mask_token_id {c.mask_token_id} outside the target's vocabulary")
    if c.dflash2 and c.vocab_size != t.vocab_size:
        problems.append(f"vocab_size {c.vocab_size} != the target's {t.vocab_size}")
    if problems:
        raise Unsupported(f"draft model {path} does not fit the target: {'; '.join(problems)}",
                          field="draft_model")
    return draft


def make_drafter(backend: str | None, num_draft_tokens: int, program) -> HostDrafter | None:
    """The drafter of a checked backend (None: no speculation); MTP drafts come from the
    Program's MTP proposer (filled after every step). A constrained row's forced text is drafted
    by the grammar (spec/grammar.py) with n-gram and MTP, and alone with `grammar`."""
    if backend is None:
        return None
    encode = program.runtime.tokenizer.encode
    if backend == "grammar":
        return HostDrafter(GrammarProposer(encode).propose, num_draft_tokens)
    if backend == "ngram":
        other = context_other(NgramProposer(token_bytes=program.runtime.domain.token_bytes,
                                            encode=encode))
        return HostDrafter(GrammarProposer(encode, other).propose, num_draft_tokens)
    if backend == "mtp":
        other = chain_other(program.proposer.propose)
        return HostDrafter(GrammarProposer(encode, other).propose, num_draft_tokens)
    if backend in ("dflash", "dflash2"):  # drafted on the device in the round's Forward
        return HostDrafter(None, min(num_draft_tokens, program.proposer.k), device=True)
    raise Unsupported(f"speculative backend {backend!r} is not implemented", field="speculative")


__all__ = ["BACKENDS", "GrammarProposer", "HostDrafter", "Proposal", "NgramProposer",
           "SpecCounters", "check_backend", "check_model", "load_draft", "make_drafter"]
