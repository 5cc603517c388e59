"""Speculative proposers (grammar drafts, n-gram copy, MTP, DFlash, DFlash2) behind one interface.

Proposers produce drafts (and, for DFlash2, the sparse q over their candidates), never masks: the
target is constrained, drafts are not. The Program's verify stage (program/verify.py) fills K+1
lookahead masks along each row's proposal chain and verifies the drafts. The Engine builds one
proposer at start with `make_proposer(config, runtime, state)` (a plain if/elif on its
configuration) and hands it to the Program, which names no backend.

    proposer.py  the Proposer interface (route, k, reads, attach, after_step; the device
                 route's block_drafts), the draft limit of a row, the host route's `attach`
    grammar.py   the text a constrained row's grammar forces, canonically tokenized; wraps the
                 n-gram or MTP proposer and composes with its drafts in the same round
    ngram.py     prompt-lookup copy from the request's own context (any model); layout.py its
                 copy modulo JSON layout
    mtp.py       the Qwen3.5 MTP module, k steps, aligned after every step
    dflash.py    DFlash / DFlash2 draft models (models/dflash.py) conditioned on target layers
                 (dense or hybrid Qwen3.5 targets); their context cache is paid from the KV budget
    counters.py  the engine's speculation counters
"""

from __future__ import annotations

from services.worker.models.dflash import DraftConfigError, load_dflash
from services.worker.spec.counters import SpecCounters
from services.worker.spec.dflash import DFlashProposer
from services.worker.spec.grammar import GrammarProposer
from services.worker.spec.mtp import MtpProposer
from services.worker.spec.ngram import NgramProposer
from services.worker.spec.proposer import ContextProposer, HostProposer, Proposal, draft_limit
from shared.errors import InvalidRequest, Unsupported

BACKENDS = ("grammar", "ngram", "mtp", "dflash", "dflash2")  # what --speculative names
# The targets whose layers a DFlash draft taps (`hidden_states(..., tap=ids)`): dense, and the
# hybrid Qwen3.5, whose GDN and attention layers alike (its recurrent state and conv windows are
# kept at each round's accepted prefix by the state's commit, as for every verification)
DRAFT_TARGETS = ("DenseDecoder", "Qwen35Model")


def check_backend(backend: str | None, draft_model: str | None,
                  draft_vocab: int | None = None) -> None:
    """Refuse a speculative configuration before any model loads. Raises Unsupported naming the
    field (`speculative` for an unknown backend, `draft_model` for a draft model the backend
    takes none of, or a missing one that it needs, `draft_vocab` beside another backend than
    mtp), InvalidRequest(field="draft_vocab") for a count below 1."""
    if draft_vocab is not None:
        if draft_vocab < 1:
            raise InvalidRequest(f"--draft-vocab must be >= 1, got {draft_vocab}",
                                 field="draft_vocab")
        if backend != "mtp":  # the other backends' drafts would not change: refused, not ignored
            raise Unsupported("--draft-vocab narrows the drafts of --speculative mtp only",
                              field="draft_vocab")
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
    if backend in ("dflash", "dflash2") and type(model).__name__ not in DRAFT_TARGETS:
        raise Unsupported(f"--speculative {backend} runs on dense Llama/Qwen3 and hybrid "
                          f"Qwen3.5 targets; {type(model).__name__} targets are not implemented",
                          field="speculative")


def load_draft(backend: str | None, path: str | None, runtime):
    """The DFlash / DFlash2 draft model of `path` for `runtime`'s target, on its device and
    dtype (None for other backends). Raises InvalidRequest(field="draft_model") for a directory
    that is not a loadable draft checkpoint, Unsupported(field="draft_model") for a draft that
    does not fit the backend or the target."""
    if backend not in ("dflash", "dflash2"):
        return None
    try:
        draft = load_dflash(path, dtype=runtime.dtype, device=runtime.device)
    except (OSError, ValueError) as exc:
        if isinstance(exc, DraftConfigError):
            raise Unsupported(f"draft model {path}: {exc}", field="draft_model") from None
        raise InvalidRequest(f"draft model {path}: {exc}", field="draft_model") from None
    c, t = draft.config, runtime.config
    if c.dflash2 != (backend == "dflash2"):
        raise Unsupported(
            f"{path} is a {'DFlash2' if c.dflash2 else 'DFlash'} draft; use "
            f"--speculative {'dflash2' if c.dflash2 else 'dflash'}",
            field="draft_model",
        )
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


def captures_graphs(backend: str | None) -> bool:
    """Whether the Program may capture CUDA graphs beside `backend`'s proposer: DFlash2's
    selector runs eagerly, so its Program runs without graphs (and without their scratch
    lane)."""
    return backend != "dflash2"


def context_bytes_per_position(draft, dtype) -> int:
    """What a loaded draft's context cache costs per lane position (0 without a draft): the
    Program pays it from the KV budget (program/budget.py)."""
    return 0 if draft is None else draft.cache_bytes_per_position(dtype)


def make_proposer(config, runtime, state, draft=None) -> HostProposer | DFlashProposer | None:
    """The proposer of a checked backend (None: no speculation). `config`: the EngineConfig
    (speculative, num_draft_tokens, draft_model); `state`: the Program's model state (MTP writes
    its own KV there; a DFlash draft's context cache matches its lanes); `draft`: the DFlash /
    DFlash2 draft `load_draft` returned (None: loaded here). Raises what `load_draft` raises,
    Unsupported(field="speculative") for a backend not implemented.

    A constrained row's forced text is drafted by the grammar (spec/grammar.py): alone with
    `grammar`, composed with the n-gram and MTP drafts of the same round with those."""
    backend, k = config.speculative, config.num_draft_tokens
    if backend is None:
        return None
    encode = runtime.tokenizer.encode
    if backend == "grammar":
        return GrammarProposer(encode, k)
    if backend == "ngram":
        ngram = NgramProposer(token_bytes=runtime.domain.token_bytes, encode=encode)
        return GrammarProposer(encode, k, ContextProposer(ngram, k))
    if backend == "mtp":
        return GrammarProposer(encode, k, MtpProposer(runtime.model, state, k, runtime.domain.size,
                                                      config.draft_vocab))
    if backend in ("dflash", "dflash2"):  # drafted on the device in the round's Forward
        if draft is None:
            draft = load_draft(backend, config.draft_model, runtime)
        return DFlashProposer(runtime.model, draft, state.lanes, state.max_len, k,
                              runtime.domain.size, dtype=runtime.dtype, device=runtime.device)
    raise Unsupported(f"speculative backend {backend!r} is not implemented", field="speculative")


__all__ = ["BACKENDS", "DRAFT_TARGETS", "ContextProposer", "DFlashProposer", "GrammarProposer",
           "HostProposer", "MtpProposer", "NgramProposer", "Proposal", "SpecCounters",
           "captures_graphs", "check_backend", "check_model", "context_bytes_per_position",
           "draft_limit", "load_draft", "make_proposer"]
