"""Grammar drafts: the text a constrained row's grammar forces, proposed as drafts.

Where the grammar forces the next bytes (an object key, `": "`, the layout's newline and
indentation, the rest of an enum value, a closing bracket), ordinary decoding pays one forward per
token for text that is already decided. The walk (`forced_drafts`) reads those bytes from a probe of
the row's committed matcher (output/probe.py), across rules, and tokenizes them canonically with
the target's own tokenizer (the Frontend's), so the drafts are the split the model itself most
likely produces. Two rules keep them honest:

- the last token of a forced run that free text follows is never drafted: a canonical split of
  the forced text alone may differ from the model's split across the boundary (`"` + `Maria` vs
  `"Maria`), so the model's own choice there is kept. Where the forced text ends the output (only
  EOS may follow) or the next position allows exactly one token, nothing follows the run that the
  token could merge with, and it is drafted;
- drafts stay proposals: every one is checked by the probe (a draft the grammar refuses ends the
  walk) and the target verifies them in the ordinary verify round, so the output distribution is
  unchanged and greedy output stays token-identical to plain decoding.

`compose` fills a round: grammar drafts where the grammar forces text, the row's other proposer
(n-gram copy, MTP) the positions in between, at most k in all. An unconstrained row gets the other
proposer's drafts unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.worker.spec.proposer import ForwardsHostMembers, HostProposer
from shared.logging import get_logger

log = get_logger(__name__)

Encode = Callable[[str], list[int]]


def complete_utf8(data: bytes) -> tuple[bytes, bytes]:
    """(head, tail): `data` split before an unfinished UTF-8 character at its end (tail b"" when
    it ends on a character boundary)."""
    end = len(data)
    i = end - 1
    while i >= 0 and end - i <= 4 and data[i] & 0xC0 == 0x80:
        i -= 1
    if i < 0 or end - i > 4:
        return data, b""
    lead = data[i]
    need = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else \
        4 if lead >> 3 == 30 else 1
    return (data, b"") if end - i >= need else (data[:i], data[i:])


def canonical_tokens(encode: Encode, data: bytes) -> tuple[list[int], bytes]:
    """The target tokenizer's tokens of `data`'s complete characters and the bytes left out (an
    unfinished character at the end). ([], data) when `data` does not start on a character."""
    head, tail = complete_utf8(data)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return [], data
    return (encode(text) if text else []), tail


def forced_drafts(probe, encode: Encode, k: int) -> list[int]:
    """Up to k drafts the grammar forces from the probe's state, accepted into the probe (the
    caller's probe rolls them back). See the module docstring for the boundary rule."""
    drafts: list[int] = []
    while len(drafts) < k and not probe.terminated:
        forced = probe.forced_bytes()
        if forced:
            tokens, tail = canonical_tokens(encode, forced)
            taken = 0
            for t in tokens[:k - len(drafts)]:
                if not probe.accept(t):
                    break
                taken += 1
            drafts += tokens[:taken]
            if taken < len(tokens):
                # cut by k (forced text follows in the canonical split) or refused (a tool
                # grammar's name rule): the tokens taken keep their canonical boundaries
                return drafts
            if tail:  # an unfinished character follows, which the last token could merge with
                return _drop_last(probe, drafts, taken)
        single = _single_next(probe)
        if single is None:  # free text follows: the model splits the boundary itself
            return _drop_last(probe, drafts, len(tokens) if forced else 0)
        if single < 0:  # only EOS may follow: the forced text ends the output
            return drafts
        if not probe.accept(single):
            return drafts
        drafts.append(single)
    return drafts


def _single_next(probe) -> int | None:
    """The one legal next token, -1 when only EOS ids are legal (more than one), None when the
    next position is free. Asked only where the output may end: elsewhere free text follows."""
    if probe.terminated:
        return -1
    if not probe.may_end:
        return None
    eos = probe.domain.eos_ids
    ids = probe.legal_ids(len(eos) + 1)
    if len(ids) == 1:
        return ids[0]
    return -1 if all(i in eos for i in ids) else None


def _drop_last(probe, drafts: list[int], run: int) -> list[int]:
    """The drafts without the last token of the forced run (of `run` tokens) that ends them."""
    if run:
        probe.rollback(1)
        return drafts[:-1]
    return drafts


def compose(probe, encode: Encode, k: int,
            other: Callable[[Sequence[int], int], list[int]] | None) -> list[int]:
    """At most k drafts for a constrained row: the grammar's forced drafts, and between forced
    runs `other(drafts_so_far, n)`'s (at most n drafts continuing the committed output and
    drafts_so_far; None: grammar drafts only). Another proposer's draft that the grammar refuses
    stays a proposal (drafts are never constrained) and ends the round: the target rejects it
    and nothing after it is reachable; where the grammar forces text again after one of the
    other's drafts, the grammar drafts it."""
    drafts: list[int] = []
    while len(drafts) < k:
        grown = len(drafts)
        drafts += forced_drafts(probe, encode, k - len(drafts))
        if other is None or len(drafts) >= k or probe.terminated:
            break
        for t in other(tuple(drafts), k - len(drafts)):
            drafts.append(t)
            if not probe.accept(t):
                return drafts  # the target rejects it; nothing after it is reachable
            if probe.terminated or probe.forced_bytes():
                break
        if len(drafts) == grown:
            break
    return drafts


class GrammarProposer(ForwardsHostMembers, HostProposer):
    """The host-route proposer of grammar drafts (spec/proposer.py), `k` per row and round.
    `encode`: the target's tokenizer (the Frontend's). `inner`: the row's other host proposer
    (n-gram copy, MTP) or None; its `reads` and `after_step` are the wrapper's, its drafts fill
    the positions between forced runs (`compose`), and an unconstrained row gets its drafts
    alone."""

    def __init__(self, encode: Encode, k: int, inner: HostProposer | None = None) -> None:
        super().__init__(k)
        self.encode = encode
        self.inner = inner
        self.reads = None if inner is None else inner.reads

    def propose(self, job, n: int):
        session, inner = job.session, self.inner
        if not session.constrained or session.finished:
            return inner.propose(job, n) if inner is not None else []
        other = None if inner is None else lambda drafts, m: inner.propose_after(job, drafts, m)
        try:
            with session.probe() as probe:
                return compose(probe, self.encode, n, other)
        except Exception:  # a matcher that raised: no drafts; the row's next mask fill reports it
            log.warning("grammar_drafts_failed", request_id=job.request_id, exc_info=True)
            return []

    def after_step(self, pending, hidden) -> float:
        return 0.0 if self.inner is None else self.inner.after_step(pending, hidden)

