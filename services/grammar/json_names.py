"""JsonNameConstraint: no generated JSON object repeats a member name, with exact masks.

A context-free grammar cannot exclude the names an object used earlier, so wherever a schema
admits undeclared names (additionalProperties, patternProperties, unevaluatedProperties,
propertyNames, any JSON value, json_object mode) it would let a name repeat, and count the
copies as members a parser keeps once. This companion shares every transaction of the session's
matcher (services/worker/output/named_matcher.py): it follows the JSON text the matcher accepts
(json_text.py, one state per accepted token, so a rollback of n tokens drops n states) and, in
each mask the matcher fills, clears

1. every token whose bytes would complete a name its object already used (names compared after
   unescaping: `"\\u0061"` is `"a"`), and
2. every token after which the grammar has no continuation left but used names: a token that
   ends inside a name, or where a name is next, while the name could still become a used one. The
   grammar is probed: from the state after the token, a walk over single-byte tokens through the
   matcher (accept, then roll back) looks for a byte that completes an unused name or leaves the
   used names behind; the grammar guarantees a completion from there. Where the name language is
   open (any string) the first byte tried answers; a finite one (propertyNames enum, a pattern of
   finitely many names) is searched to the end.

Dead ends deeper than the next name cannot come from names: a minimum member count that a finite
name set could not fill with distinct names is refused when the schema compiles (the count is
lifted only where undeclared names are any string: schema/algebra.py `free_count_check`).

API (`JsonNameIndex.of(domain)` is built once per vocabulary):

    names = JsonNameConstraint(JsonNameIndex.of(domain), start=None)  # or the thinking close id
    matcher.fill_mask(out, i); names.apply(out[i], matcher)  # every mask the matcher fills
    matcher.accept_token(t);   names.accept(t)               # every token it accepts
    matcher.rollback(n);       names.rollback(n)             # every rollback, same n

`apply` looks only at tokens that can touch a used name (indexed by what their bytes spell
around their quotes, commas and escapes) and only while some open object has used a name, so it
costs nothing before the first name and microseconds after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from services.grammar.json_text import (
    KEY,
    KEYX,
    START,
    STR,
    STR_ESC,
    WAITING,
    Duplicate,
    any_used,
    feed,
    near_used,
    step,
)
from shared.frontends.token_domain import TokenDomain

# Accepts one probe may try before it gives up and keeps the token (a name language with very
# many spellings of the used names; never reached by the schemas the corpus holds).
PROBE_BUDGET = 4096
_WS_BYTES = b" \n\t\r"
# The bytes a probe tries first inside a name: the quote that closes it, then a few name
# characters (for an open name language one of them answers at once); then every byte the
# grammar takes, from one mask fill.
_QUICK = b'"q_0Z~'
_NONE = np.zeros(0, dtype=np.int64)



@dataclass(frozen=True, eq=False)
class JsonNameIndex:
    """The tokens of a vocabulary that can touch a member name, by what they spell (int64 id
    arrays).

    `exact[b]`: tokens spelling exactly `b` (they extend a name by `b`); `before_quote[b]`:
    tokens whose bytes before their first `"` are `b` (they close a name whose rest is `b`);
    `between[b]`: tokens holding `"b"` (a name opened and closed inside the token);
    `after_quote[b]`: tokens whose bytes after their last `"` are `b` (they open a name that
    has read `b`); `between_comma` and `after_quote_comma`: the same holding a `,` (outside the
    state where a name is next, a token opens a name only through a `,` of its own; inside a
    string it must close that string first: `in_string` holds the tokens of both with a quote
    more than the name needs); `commas`:
    tokens ending in `,` and whitespace, after which a name is next;
    `quoted_commas`: those of them holding a `"` (the only ones that can leave a string);
    `spaces`: whitespace-only tokens; `escapes`: tokens holding `\\` (names spelled with
    escapes). A token that touches a used name is in one of these under the reader's state;
    `apply` simulates the legal ones exactly."""

    domain: TokenDomain
    exact: dict[bytes, np.ndarray]
    before_quote: dict[bytes, np.ndarray]
    between: dict[bytes, np.ndarray]
    after_quote: dict[bytes, np.ndarray]
    between_comma: dict[bytes, np.ndarray]
    after_quote_comma: dict[bytes, np.ndarray]
    in_string: tuple[dict[bytes, np.ndarray], dict[bytes, np.ndarray]]
    commas: np.ndarray
    quoted_commas: np.ndarray
    spaces: np.ndarray
    escapes: np.ndarray

    @staticmethod
    def of(domain: TokenDomain) -> "JsonNameIndex":
        """The index of `domain` (built once per vocabulary: about a second for the 248k Qwen3.5
        tokens)."""
        return _index(domain)


@lru_cache(maxsize=8)
def _index(domain: TokenDomain) -> JsonNameIndex:
    exact: dict[bytes, list[int]] = {}
    before: dict[bytes, list[int]] = {}
    between: dict[bytes, list[int]] = {}
    after: dict[bytes, list[int]] = {}
    between_c: dict[bytes, list[int]] = {}
    after_c: dict[bytes, list[int]] = {}
    between_s: dict[bytes, list[int]] = {}
    after_s: dict[bytes, list[int]] = {}
    commas: list[int] = []
    quoted: list[int] = []
    spaces: list[int] = []
    escapes: list[int] = []
    for t, data in enumerate(domain.token_bytes):
        if not data or not domain.is_ordinary(t):
            continue
        exact.setdefault(data, []).append(t)
        if b"\\" in data:
            escapes.append(t)
        stripped = data.rstrip(_WS_BYTES)
        if not stripped:
            spaces.append(t)
        elif stripped.endswith(b","):
            commas.append(t)
            if b'"' in data:
                quoted.append(t)
        if b'"' not in data:
            continue
        parts = data.split(b'"')
        before.setdefault(parts[0], []).append(t)
        after.setdefault(parts[-1], []).append(t)
        for inner in set(parts[1:-1]):
            between.setdefault(inner, []).append(t)
        if b"," in data:
            after_c.setdefault(parts[-1], []).append(t)
            for inner in set(parts[1:-1]):
                between_c.setdefault(inner, []).append(t)
            if len(parts) >= 3:  # two quotes: close the string, open a name
                after_s.setdefault(parts[-1], []).append(t)
            for inner in set(parts[2:-1]):  # three: close, then a whole name
                between_s.setdefault(inner, []).append(t)

    def ids(v: list[int]) -> np.ndarray:
        return np.array(v, dtype=np.int64)

    def arrays(d: dict[bytes, list[int]]) -> dict[bytes, np.ndarray]:
        return {k: ids(v) for k, v in d.items()}

    return JsonNameIndex(domain, arrays(exact), arrays(before), arrays(between), arrays(after),
                         arrays(between_c), arrays(after_c), (arrays(between_s), arrays(after_s)),
                         ids(commas), ids(quoted), ids(spaces), ids(escapes))


class JsonNameConstraint:
    """The name-uniqueness companion of one request's matcher (see the module docstring).

    `start`: None when the output is the JSON text itself; else the control token id after which
    it starts (a thinking framing's close token: the reasoning before it is not JSON). `probe`:
    False where every name the grammar admits beyond its declared ones may be any string (no
    patternProperties, no propertyNames): infinitely many fresh names then follow every state,
    so a probe would always answer yes and only repeats are cleared."""

    def __init__(self, index: JsonNameIndex, start: int | None = None, *,
                 probe: bool = True) -> None:
        self.index = index
        self.start = start
        self.probe = probe
        self._states: list[tuple] = [START if start is None else WAITING]
        self.probes = 0  # probe walks run (the report's and the tests' view of the cost)
        self.gave_up = 0  # probes that ran out of PROBE_BUDGET (the token was kept)
        self._scratch: np.ndarray | None = None  # [1, ceil(V/32)] int32 for a probe's fills

    @property
    def accepted(self) -> int:
        """Tokens accepted and not rolled back."""
        return len(self._states) - 1

    @property
    def state(self) -> tuple:
        return self._states[-1]

    def accept(self, token_id: int) -> None:
        """Follow one token the matcher accepted (its mask came from `apply`, so it repeats no
        name; a repeat read anyway leaves the state as it was)."""
        try:
            state = self._advance(self._states[-1], token_id)
        except Duplicate:
            state = self._states[-1]
        self._states.append(state)

    def accept_bytes(self, data: bytes) -> None:
        """Follow bytes the matcher accepted outside any token (a continuation prefix; like the
        matcher's, not undoable by rollback)."""
        try:
            self._states[-1] = feed(self._states[-1], data)
        except Duplicate:
            pass

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (the matcher's rollback of the same `n`)."""
        if not 0 <= n <= self.accepted:
            raise ValueError(f"cannot roll back {n} of {self.accepted} tokens")
        if n:
            del self._states[-n:]

    def apply(self, row: torch.Tensor | np.ndarray, matcher) -> int:
        """Clear in `row` ([ceil(V/32)] int32, `matcher`'s mask at this state) every set bit of a
        token that would repeat a name, or after which only used names could follow; returns how
        many were cleared. `matcher` (services.grammar.engines.engine.Matcher) is probed and left
        as it was."""
        state = self._states[-1]
        if not any_used(state):
            return 0
        cleared = 0
        memo: dict[tuple, bool] = {}
        words = (row.numpy() if isinstance(row, torch.Tensor) else row).view(np.uint32)
        # words: [ceil(V/32)] uint32, the same memory as `row`
        for t in self._legal(state, words):
            word, bit = t >> 5, t & 31
            value = int(words[word])
            try:
                after = self._advance(state, t)
                keep = not (self.probe and near_used(after)) or \
                    self._probe(matcher, t, after, memo)
            except Duplicate:
                keep = False
            if not keep:
                cleared += 1
                words[word] = value & ~(1 << bit)
        return cleared

    def _legal(self, state: tuple, words: np.ndarray) -> list[int]:
        # The candidates (see JsonNameIndex) for this state whose bit is set in `words`, in id
        # order. Inside a string only a token with a quote can leave it; whitespace matters only
        # where a name is next; escapes only inside a name that may become a used one (or in
        # a name opened by the token, which then holds a `,` or starts where a name is next).
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

    def _probe(self, matcher, token: int, after: tuple, memo: dict) -> bool:
        """Whether, once `token` is accepted, the grammar can go on without repeating a name.
        `memo`: this mask's answers by the state after the token (the tokens of one mask start
        from one grammar state, and the whitespace between them is layout, which never changes
        the names that may follow: the emitted grammars write it as a rule of its own)."""
        if after in memo:
            return memo[after]
        self.probes += 1
        if not matcher.accept_token(token):
            return False
        budget = [PROBE_BUDGET]
        try:
            found = self._search(matcher, after, budget)
        finally:
            matcher.rollback(1)
        if budget[0] <= 0:
            self.gave_up += 1
            found = True
        memo[after] = found
        return found

    def _search(self, matcher, state: tuple, budget: list[int]) -> bool:
        # Depth-first over single bytes the grammar accepts, while the text could still become a
        # used name; True at the first state that cannot (or once the budget is spent).
        if not near_used(state) or budget[0] <= 0:
            return True
        if state[0] == KEYX:  # the quote, else the first whitespace the grammar takes (layout)
            for byte in b'"' + _WS_BYTES:
                found = self._branch(matcher, state, byte, budget)
                if found is not None:
                    return found
            return False
        tried = set(_QUICK)
        for byte in _QUICK:  # an open name language answers here
            if self._branch(matcher, state, byte, budget):
                return True
        for byte in self._legal_bytes(matcher, budget):
            if byte not in tried and self._branch(matcher, state, byte, budget):
                return True
            if budget[0] <= 0:
                return True
        return False

    def _branch(self, matcher, state: tuple, byte: int, budget: list[int]) -> bool | None:
        # The search after one more byte; None when the grammar does not take it.
        t = self.index.domain.byte_token_ids[byte]
        budget[0] -= 1
        if t < 0 or not matcher.accept_token(t):
            return None
        try:
            return self._search(matcher, step(state, byte), budget)
        except Duplicate:
            return False
        finally:
            matcher.rollback(1)

    def _legal_bytes(self, matcher, budget: list[int]) -> list[int]:
        # The bytes whose single-byte token the grammar takes next (one mask fill).
        domain = self.index.domain
        if self._scratch is None:
            self._scratch = np.zeros((1, domain.mask_words), dtype=np.int32)
        matcher.fill_mask(self._scratch, 0)
        budget[0] -= 16
        words = self._scratch[0].view(np.uint32)
        return [b for b, t in enumerate(domain.byte_token_ids)
                if t >= 0 and (int(words[t >> 5]) >> (t & 31)) & 1]

    def _advance(self, state: tuple, token_id: int) -> tuple:
        if token_id == self.start and self.start is not None:
            return START
        domain = self.index.domain
        if not domain.is_ordinary(token_id):
            return state
        return feed(state, domain.token_bytes[token_id])


__all__ = ["JsonNameConstraint", "JsonNameIndex", "KEY", "KEYX", "PROBE_BUDGET"]


# ---------------------------------------------------------------- which outputs get one

def json_names_for(constraint, domain: TokenDomain,
                   framing: str | None = None) -> JsonNameConstraint | None:
    """The companion of a content constraint (shared.contract.OutputConstraint) whose JSON may
    hold undeclared member names: json_object, or a json_schema with an object (or any value)
    admitting names it does not declare; None for every other source (no cost for them).
    `framing`: the compile framing (a thinking framing makes the JSON start after its close
    token). Raises what `check_schema` raises for an invalid schema."""
    from shared.contract import ConstraintKind, OutputConstraint

    if not isinstance(constraint, OutputConstraint):
        return None
    probe = False
    if constraint.kind is ConstraintKind.JSON_SCHEMA:
        free, probe = _schema_names(constraint)
        if not free:
            return None
    elif constraint.kind is not ConstraintKind.JSON_OBJECT:
        return None
    return JsonNameConstraint(JsonNameIndex.of(domain), _start_id(framing, domain), probe=probe)


def _start_id(framing: str | None, domain: TokenDomain) -> int | None:
    from shared.frontends.frontend import split_framing
    from shared.frontends.thinking import SPECS

    if framing is None:
        return None
    thinking, _ = split_framing(framing)
    return None if thinking is None else domain.special_id(SPECS[thinking].close)


@lru_cache(maxsize=256)
def _schema_names(constraint) -> tuple[bool, bool]:
    """(some object admits undeclared names, some object restricts them by patternProperties or
    propertyNames: the companion must probe)."""
    from services.grammar.schema import check_schema
    from services.grammar.schema.nodes import (
        AnyValue,
        ArrayType,
        NoValue,
        ObjectType,
        Ref,
        Union,
    )

    reduced = check_schema(constraint.schema, unique_names=True)
    seen: set[int] = set()
    stack = [reduced.root]
    free = probe = False
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AnyValue):
            free = True
        elif isinstance(node, Ref):
            stack.append(reduced.defs[node.name])
        elif isinstance(node, Union):
            stack.extend(node.branches)
        elif isinstance(node, ArrayType):
            stack.extend((*node.prefix, node.items, *(() if node.contains is None
                                                      else (node.contains,))))
        elif isinstance(node, ObjectType):
            if not isinstance(node.names, NoValue) and (
                    node.patterns or not isinstance(node.additional, NoValue)):
                free = True
                probe = probe or bool(node.patterns) or not isinstance(node.names, AnyValue)
            stack.extend(v for _, v in node.properties)
            stack.append(node.additional)
            stack.extend(v for _, v in node.patterns)
    return free, probe
