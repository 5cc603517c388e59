"""JsonNameConstraint: no generated JSON object repeats a member name, with exact masks.

A context-free grammar cannot exclude the names an object used earlier, so wherever a schema
admits undeclared names (additionalProperties, patternProperties, unevaluatedProperties,
propertyNames, any JSON value, json_object mode, a non-strict tool's arguments) it would let a
name repeat, and count the copies as members a parser keeps once. This companion shares every
transaction of the session's matcher (services/worker/output/named_matcher.py): it follows the
JSON text the matcher accepts (json_text.py, one state per accepted token, so a rollback of n
tokens drops n states) through the output's frame (json_spans.py: content JSON, the arguments of
Hermes calls, the JSON-valued parameters of XML calls) and, in each mask the matcher fills, clears

1. every token whose bytes would complete a name its object already used (names compared after
   unescaping: `"\\u0061"` is `"a"`), and
2. every token after which the grammar has no continuation left but used names: a token that
   ends inside a name, or where a name is next, while the name could still become a used one. The
   grammar is probed (json_probe.py: single-byte tokens through the matcher, rolled back, each
   answer kept by the grammar state it was asked in). Where the name language is open (any
   string) no probe runs: infinitely many fresh names follow every state.

Dead ends deeper than the next name cannot come from names: a minimum member count that a finite
name set could not fill with distinct names is refused when the schema compiles (the count is
lifted only where undeclared names are any string: schema/algebra.py `free_count_check`).

API (`JsonNameIndex.of(domain)` is built once per vocabulary):

    names = JsonNameConstraint(JsonNameIndex.of(domain), start=None)  # or the thinking close id
    matcher.fill_mask(out, i); names.apply(out[i], matcher)  # every mask the matcher fills
    matcher.accept_token(t);   names.accept(t)               # every token it accepts
    matcher.rollback(n);       names.rollback(n)             # every rollback, same n

`apply` looks only at tokens that can touch a used name (indexed by what their bytes spell
around their quotes, commas and escapes: json_index.py) and only while some open object has used
a name, so it costs nothing before the first name and microseconds after it.
"""

from __future__ import annotations

import numpy as np
import torch

from services.grammar.json_free import content_names, hermes_names, xml_json_params
from services.grammar.json_index import JsonNameIndex
from services.grammar.json_probe import PROBE_BUDGET, Key, NameProbe, control, significant
from services.grammar.json_spans import ContentFrame, HermesFrame, XmlFrame
from services.grammar.json_text import (
    KEY,
    KEYX,
    STR,
    STR_ESC,
    Duplicate,
    any_used,
    near_used,
)
from shared.frontends.token_domain import TokenDomain

_NONE = np.zeros(0, dtype=np.int64)


class JsonNameConstraint:
    """The name-uniqueness companion of one request's matcher (see the module docstring).

    `start`: None when the output is the JSON text itself; else the control token id after which
    it starts (a thinking framing's close token: the reasoning before it is not JSON). `frame`:
    where the JSON lies in the output instead (json_spans.py; default ContentFrame(start)).
    `probe`: False where every name the grammar admits beyond its declared ones may be any
    string (no patternProperties, no propertyNames): infinitely many fresh names then follow
    every state, so a probe would always answer yes and only repeats are cleared."""

    def __init__(self, index: JsonNameIndex, start: int | None = None, *,
                 probe: bool = True, frame=None) -> None:
        self.index = index
        self.frame = ContentFrame(start) if frame is None else frame
        self.start = getattr(self.frame, "start", start)
        self._prober = NameProbe(self.frame, index.domain) if probe else None
        self._states: list[tuple] = [self.frame.initial]  # (where, json) after each token
        self._keys: list[Key] | None = [Key()] if probe else None  # the digests, alike

    @property
    def probe(self) -> bool:
        return self._prober is not None

    @property
    def probes(self) -> int:
        """Probe searches run (the report's and the tests' view of the cost)."""
        return 0 if self._prober is None else self._prober.probes

    @property
    def gave_up(self) -> int:
        """Probes that ran out of PROBE_BUDGET (the token was kept)."""
        return 0 if self._prober is None else self._prober.gave_up

    @property
    def accepted(self) -> int:
        """Tokens accepted and not rolled back."""
        return len(self._states) - 1

    @property
    def state(self) -> tuple:
        """The JSON reader's state (json_text.py; `WAITING` outside every JSON span)."""
        return self._states[-1][1]

    @property
    def where(self) -> object:
        """The frame's own position (json_spans.py)."""
        return self._states[-1][0]

    def accept(self, token_id: int) -> None:
        """Follow one token the matcher accepted (its mask came from `apply`, so it repeats no
        name; a repeat read anyway leaves the state as it was)."""
        prev = self._states[-1]
        sig = bytearray() if self._keys is not None else None
        try:
            state = self._advance(prev, token_id, sig)
        except Duplicate:
            state = prev
        self._states.append(state)
        if self._keys is not None:
            self._keys.append(self._keys[-1].extended(bytes(sig)))

    def accept_bytes(self, data: bytes) -> None:
        """Follow bytes the matcher accepted outside any token (a continuation prefix; like the
        matcher's, not undoable by rollback)."""
        sig = bytearray() if self._keys is not None else None
        try:
            self._states[-1] = self._read(self._states[-1], data, sig)
        except Duplicate:
            return
        if self._keys is not None:
            self._keys[-1] = self._keys[-1].extended(bytes(sig))

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (the matcher's rollback of the same `n`)."""
        if not 0 <= n <= self.accepted:
            raise ValueError(f"cannot roll back {n} of {self.accepted} tokens")
        if n:
            del self._states[-n:]
            if self._keys is not None:
                del self._keys[-n:]

    def apply(self, row: torch.Tensor | np.ndarray, matcher) -> int:
        """Clear in `row` ([ceil(V/32)] int32, `matcher`'s mask at this state) every set bit of a
        token that would repeat a name, or after which only used names could follow; returns how
        many were cleared. `matcher` (services.grammar.engines.engine.Matcher) is probed and left
        as it was."""
        state = self._states[-1]
        if not any_used(state[1]):
            return 0
        cleared = 0
        words = (row.numpy() if isinstance(row, torch.Tensor) else row).view(np.uint32)
        # words: [ceil(V/32)] uint32, the same memory as `row`
        prober = self._prober
        for t in self._legal(state[1], words):
            word, bit = t >> 5, t & 31
            value = int(words[word])
            try:
                if prober is None:
                    keep = True
                    self._advance(state, t, None)
                else:
                    sig = bytearray()
                    after = self._advance(state, t, sig)
                    keep = not near_used(after[1]) or \
                        prober.probe(matcher, t, after, self._keys[-1].extended(bytes(sig)))
            except Duplicate:
                keep = False
            if not keep:
                cleared += 1
                words[word] = value & ~(1 << bit)
        return cleared

    def _legal(self, state: tuple, words: np.ndarray) -> list[int]:
        # The candidates (see JsonNameIndex) for this JSON state whose bit is set in `words`, in
        # id order. Inside a string only a token with a quote can leave it; whitespace matters
        # only where a name is next; escapes only inside a name that may become a used one (or
        # in a name opened by the token, which then holds a `,` or starts where a name is next).
        index = self.index
        mode, done, _, stack = state
        parts = [index.quoted_commas if mode in (STR, STR_ESC, KEY) else index.commas]
        if mode == KEYX:
            parts += [index.spaces, index.escapes]
        elif mode == KEY and near_used(state):
            parts.append(index.escapes)
        used = frozenset().union(*(s for s in stack if s))
        empty = _NONE
        if mode == KEYX:
            between, after = index.between, index.after_quote
        elif mode in (STR, STR_ESC, KEY):
            between, after = index.in_string
        else:
            between, after = index.between_comma, index.after_quote_comma
        for name in used:
            parts.append(between.get(name, empty))
            parts += [after.get(name[:k], empty) for k in range(len(name) + 1)]
        if mode == KEY and stack[-1]:
            for name in stack[-1]:
                if name.startswith(done):
                    rest = name[len(done):]
                    parts.append(index.before_quote.get(rest, empty))
                    parts += [index.exact.get(rest[:k], empty) for k in range(1, len(rest) + 1)]
        ids = np.concatenate(parts)
        ids = ids[ids < 32 * len(words)]
        legal = (words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1
        return np.unique(ids[legal.astype(bool)]).tolist()

    def _advance(self, state: tuple, token_id: int, sig: bytearray | None) -> tuple:
        # The state after one token; `sig` (when given) collects what it adds to the digest.
        framed = self.frame.token(state, token_id)
        if framed is not None or not self.index.domain.is_ordinary(token_id):
            if sig is not None:
                sig += control(token_id)
            return state if framed is None else framed
        return self._read(state, self.index.domain.token_bytes[token_id], sig)

    def _read(self, state: tuple, data: bytes, sig: bytearray | None) -> tuple:
        frame = self.frame
        if sig is None and frame.fast:
            return frame.feed(state, data)
        step = frame.step
        for byte in data:
            if sig is not None:
                sig += significant(state, byte)
            state = step(state, byte)
        return state


__all__ = ["JsonNameConstraint", "JsonNameIndex", "KEY", "KEYX", "PROBE_BUDGET",
           "json_names_for", "tool_json_names_for"]


# ---------------------------------------------------------------- which outputs get one

def json_names_for(constraint, domain: TokenDomain,
                   framing: str | None = None) -> JsonNameConstraint | None:
    """The companion of a content constraint (shared.contract.OutputConstraint) whose JSON may
    hold undeclared member names: json_object, or a json_schema with an object (or any value)
    admitting names it does not declare; None for every other source (no cost for them).
    `framing`: the compile framing (a thinking framing makes the JSON start after its close
    token). Raises what `check_schema` raises for an invalid schema."""
    from shared.contract import OutputConstraint

    if not isinstance(constraint, OutputConstraint):
        return None
    free, probe = content_names(constraint)
    if not free:
        return None
    return JsonNameConstraint(JsonNameIndex.of(domain), _start_id(framing, domain), probe=probe)


def tool_json_names_for(spec, domain: TokenDomain, framing: str) -> JsonNameConstraint | None:
    """The companion of a tool grammar (services.grammar.tools.hermes.ToolSpec compiled under
    `framing`) whose JSON may hold undeclared member names: the arguments of a Hermes call (a
    non-strict tool's are any object; a strict or enforced schema's nested open objects), the
    JSON-valued parameters of an XML call, and the JSON content of a JSON-or-calls union. None
    when no JSON the grammar writes admits an undeclared name, or no call can be made and no
    content is JSON."""
    from shared.contract import ToolMode
    from shared.frontends.formats import HERMES, QWEN_XML
    from shared.frontends.frontend import split_framing

    _, inner = split_framing(framing)
    calls = spec.choice.mode is not ToolMode.NONE
    union = spec.content is not None and spec.choice.mode is ToolMode.AUTO
    free = probe = False
    if union or (spec.content is not None and not calls):
        free, probe = content_names(spec.content)
    if inner == QWEN_XML.framing:
        params = xml_json_params(spec) if calls else {}
        if params:
            f, p = params.pop(None)
            free, probe = free or f, probe or p
        if not free:
            return None
        frame = XmlFrame(params, domain.special_id(QWEN_XML.call_open),
                         domain.special_id(QWEN_XML.call_open.replace("<", "</", 1)),
                         union=union, start=_start_id(framing, domain))
    elif inner == HERMES.framing:
        if calls:
            f, p = hermes_names(spec)
            free, probe = free or f, probe or p
        if not free:
            return None
        frame = HermesFrame(union=union, start=_start_id(framing, domain))
    else:
        return None
    return JsonNameConstraint(JsonNameIndex.of(domain), probe=probe, frame=frame)


def _start_id(framing: str | None, domain: TokenDomain) -> int | None:
    from shared.frontends.frontend import split_framing
    from shared.frontends.thinking import SPECS

    if framing is None:
        return None
    thinking, _ = split_framing(framing)
    return None if thinking is None else domain.special_id(SPECS[thinking].close)
