"""The string-automaton intersection: several patterns/formats and length bounds on one string.

Each regex tree (a language over decoded characters) becomes a DFA by subset construction over
disjoint character sets; the DFAs are intersected by the product construction, together with a
length counter for minLength/maxLength (characters = Unicode scalar values, as JSON Schema counts
them); states that cannot reach acceptance are removed, so no generated prefix is a dead end; the
result is minimised. Limits (design document): length bounds at most 8,192 characters and at most
65,536 states per intersection result; beyond them `TooComplex` is raised for the caller to turn
into an UnsupportedSchema at the keyword's pointer.

`json_string_ebnf(dfa, rule)` writes the DFA as right-linear EBNF rules over canonical JSON string
units (each character as `strings.unit`), the closing quote in the accepting states.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from services.grammar.regex.charset import CharSet
from services.grammar.regex.tree import Alt, Chars, Literal, Node, Repeat, Seq, to_ebnf

MAX_LENGTH_BOUND = 8192
MAX_STATES = 65536  # per DFA of one expression, and the design document's ceiling
# Per intersection result with a length counter: the product is built in Python and emitted as one
# rule per state; at ~4,000 rules xgrammar's compile already takes seconds on a 49k vocabulary, and
# ~9,400 rules (email with maxLength 255) about 12 s on the 2-core development machine, so the
# length product stays below this (beyond: UnsupportedSchema, the schema is never loosened; the
# grammar-size limit and the compile deadline still apply below it).
MAX_PRODUCT_STATES = 16384
# Products of more states than this write each long character class once (json_string_rules);
# it was the product limit before, so the grammars of smaller products are as they were.
SHARE_UNITS_ABOVE = 4096
SHARED_UNIT = 32


class TooComplex(Exception):
    """The intersection exceeds a limit; the message says which."""


@dataclass(frozen=True)
class Dfa:
    """`delta[q]` is a list of (charset, target) with disjoint charsets; state 0 is the start."""

    delta: tuple[tuple[tuple[CharSet, int], ...], ...]
    accepting: frozenset[int]

    @property
    def size(self) -> int:
        return len(self.delta)


# ---- regex tree -> NFA -> DFA -------------------------------------------------------------------


class _Nfa:
    def __init__(self) -> None:
        self.trans: list[list[tuple[CharSet, int]]] = []
        self.eps: list[list[int]] = []

    def state(self) -> int:
        if len(self.trans) >= 4 * MAX_STATES:
            raise TooComplex(f"the expression needs more than {4 * MAX_STATES} automaton states")
        self.trans.append([])
        self.eps.append([])
        return len(self.trans) - 1

    def build(self, node: Node, start: int) -> int:
        """Add `node` from `start`; return its end state."""
        if isinstance(node, Chars):
            end = self.state()
            if node.charset.ranges:
                self.trans[start].append((node.charset, end))
            return end
        if isinstance(node, Literal):
            cur = start
            for ch in node.text:
                nxt = self.state()
                self.trans[cur].append((CharSet.chars(ch), nxt))
                cur = nxt
            return cur
        if isinstance(node, Seq):
            cur = start
            for item in node.items:
                cur = self.build(item, cur)
            return cur
        if isinstance(node, Alt):
            end = self.state()
            for item in node.items:
                s = self.state()
                self.eps[start].append(s)
                self.eps[self.build(item, s)].append(end)
            return end
        if isinstance(node, Repeat):
            cur = start
            for _ in range(node.lo):
                cur = self.build(node.item, cur)
            if node.hi is None:
                loop = self.state()
                self.eps[cur].append(loop)
                self.eps[self.build(node.item, loop)].append(loop)
                return loop
            end = self.state()
            self.eps[cur].append(end)
            for _ in range(node.hi - node.lo):
                cur = self.build(node.item, cur)
                self.eps[cur].append(end)
            return end
        raise TypeError(f"{type(node).__name__} is not a string regex node")

    def closure(self, states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


def _split(pairs: list[tuple[CharSet, object]]) -> list[tuple[CharSet, frozenset]]:
    """Disjoint character sets, each with the set of targets whose charset contains it."""
    points = sorted({p for cs, _ in pairs for lo, hi in cs.ranges for p in (lo, hi + 1)})
    groups: dict[frozenset, list[tuple[int, int]]] = {}
    for a, b in zip(points, points[1:]):
        targets = frozenset(t for cs, t in pairs if a in cs)
        if targets:
            groups.setdefault(targets, []).append((a, b - 1))
    return [(CharSet.of(r), t) for t, r in groups.items()]


@lru_cache(maxsize=256)
def tree_dfa(tree: Node, limit: int = MAX_STATES) -> Dfa:
    """The (minimal) DFA of the whole-match language of a regex tree (memoized: formats repeat);
    TooComplex past `limit` states of the subset construction."""
    nfa = _Nfa()
    start = nfa.state()
    final = nfa.build(tree, start)
    first = nfa.closure({start})
    index = {first: 0}
    order = [first]
    delta: list[list[tuple[CharSet, int]]] = []
    i = 0
    while i < len(order):
        cur = order[i]
        pairs = [(cs, t) for s in cur for cs, t in nfa.trans[s]]
        out = []
        for cs, targets in _split(pairs):
            nxt = nfa.closure(set(targets))
            if nxt not in index:
                if len(order) >= limit:
                    raise TooComplex(f"the expression needs more than {limit} DFA states")
                index[nxt] = len(order)
                order.append(nxt)
            out.append((cs, index[nxt]))
        delta.append(out)
        i += 1
    return minimise(_trim(Dfa(tuple(tuple(d) for d in delta),
                              frozenset(k for k, s in enumerate(order) if final in s))))


# ---- product, length, trim, minimise ------------------------------------------------------------


def _intersect(a: CharSet, b: CharSet) -> CharSet:
    """A linear merge of the sorted ranges (Python's Unicode classes hold hundreds of ranges)."""
    out, i, j, ra, rb = [], 0, 0, a.ranges, b.ranges
    while i < len(ra) and j < len(rb):
        lo, hi = max(ra[i][0], rb[j][0]), min(ra[i][1], rb[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if ra[i][1] < rb[j][1]:
            i += 1
        else:
            j += 1
    return CharSet(tuple(out))


@lru_cache(maxsize=256)
def intersect(dfas: tuple[Dfa, ...], min_length: int = 0, max_length: int | None = None) -> Dfa:
    """The product of `dfas` with a character counter for [min_length, max_length] (memoized)."""
    if max_length is not None and max_length > MAX_LENGTH_BOUND:
        raise TooComplex(f"maxLength {max_length} is above the intersection limit of "
                         f"{MAX_LENGTH_BOUND} characters")
    if min_length > MAX_LENGTH_BOUND:
        raise TooComplex(f"minLength {min_length} is above the intersection limit of "
                         f"{MAX_LENGTH_BOUND} characters")
    shortest, longest = _length_range(dfas[0]) if len(dfas) == 1 else (0, None)
    if min_length <= shortest:
        min_length = 0  # every string is long enough: no counter needed for the lower bound
    if max_length is not None and longest is not None and longest <= max_length:
        max_length = None  # no string is too long
    if min_length == 0 and max_length is None and len(dfas) == 1:
        return dfas[0]
    limit = MAX_STATES if min_length == 0 and max_length is None else MAX_PRODUCT_STATES
    cap = min_length if max_length is None else max_length + 1  # counts above cap are equivalent
    start = (tuple(0 for _ in dfas), 0)
    index = {start: 0}
    order = [start]
    delta: list[list[tuple[CharSet, int]]] = []
    i = 0
    while i < len(order):
        qs, n = order[i]
        out = []
        if max_length is None or n < max_length:
            moves = [(cs, (t,)) for cs, t in dfas[0].delta[qs[0]]]
            for d, q in zip(dfas[1:], qs[1:]):
                moves = [(c, ts + (t,)) for c0, ts in moves for cs, t in d.delta[q]
                         for c in (_intersect(c0, cs),) if c.ranges]
            for cs, ts in moves:
                nxt = (ts, min(n + 1, cap))
                if nxt not in index:
                    if len(order) >= limit:
                        raise TooComplex(f"the intersection needs more than {limit} states")
                    index[nxt] = len(order)
                    order.append(nxt)
                out.append((cs, index[nxt]))
        delta.append(out)
        i += 1
    accepting = frozenset(k for k, (qs, n) in enumerate(order)
                          if n >= min_length and all(q in d.accepting for d, q in zip(dfas, qs)))
    # The product of minimal DFAs with a counter is left as built (trimmed): Moore's refinement
    # needs about one round per counted character there, which costs more than it saves.
    out = _trim(Dfa(tuple(tuple(d) for d in delta), accepting))
    return minimise(out) if limit == MAX_STATES else out


def _length_range(dfa: Dfa) -> tuple[int, int | None]:
    """(shortest accepted length, longest accepted length or None when unbounded); trimmed DFA."""
    dist, frontier, shortest = {0: 0}, [0], None
    while frontier and shortest is None:
        nxt = []
        for q in frontier:
            if q in dfa.accepting:
                shortest = dist[q]
                break
            for _, t in dfa.delta[q]:
                if t not in dist:
                    dist[t] = dist[q] + 1
                    nxt.append(t)
        frontier = nxt
    longest: dict[int, int] = {}
    state: dict[int, int] = {}  # 1 = on the stack, 2 = done

    def visit(q: int) -> int | None:  # longest accepted suffix from q; None on a cycle
        stack = [(q, iter(dfa.delta[q]))]
        state[q] = 1
        while stack:
            p, it = stack[-1]
            step = next(it, None)
            if step is None:
                stack.pop()
                state[p] = 2
                best = [longest[t] + 1 for _, t in dfa.delta[p]]
                longest[p] = max(best + ([0] if p in dfa.accepting else []))
                continue
            t = step[1]
            if state.get(t) == 1:
                return None
            if t not in state:
                state[t] = 1
                stack.append((t, iter(dfa.delta[t])))
        return longest[q]

    return shortest or 0, visit(0) if dfa.delta else 0


def _trim(dfa: Dfa) -> Dfa:
    """Only states reachable from the start that can reach acceptance; empty language: no states."""
    back: dict[int, set[int]] = {}
    for q, moves in enumerate(dfa.delta):
        for _, t in moves:
            back.setdefault(t, set()).add(q)
    live = set(dfa.accepting)
    stack = list(live)
    while stack:
        for p in back.get(stack.pop(), ()):
            if p not in live:
                live.add(p)
                stack.append(p)
    if 0 not in live:
        return Dfa((), frozenset())
    keep, stack = {0}, [0]
    while stack:
        for _, t in dfa.delta[stack.pop()]:
            if t in live and t not in keep:
                keep.add(t)
                stack.append(t)
    order = sorted(keep)
    new = {q: i for i, q in enumerate(order)}
    delta = tuple(tuple((cs, new[t]) for cs, t in dfa.delta[q] if t in keep) for q in order)
    return Dfa(delta, frozenset(new[q] for q in order if q in dfa.accepting))


def _canonical(flat: list[tuple[int, int, int]], block: list[int]) -> tuple:
    """A state's moves (sorted (lo, hi, target)) as (lo, hi, target block), adjacent equal-block
    ranges merged."""
    out: list[list[int]] = []
    for lo, hi, t in flat:
        b = block[t]
        if out and out[-1][2] == b and out[-1][1] + 1 == lo:
            out[-1][1] = hi
        else:
            out.append([lo, hi, b])
    return tuple(tuple(x) for x in out)


def minimise(dfa: Dfa) -> Dfa:
    """Moore's partition refinement (the DFA is trimmed: missing moves go to a dead state)."""
    if not dfa.delta:
        return dfa
    block = [1 if q in dfa.accepting else 0 for q in range(dfa.size)]
    count = len(set(block))
    flats = [sorted((lo, hi, t) for cs, t in moves for lo, hi in cs.ranges) for moves in dfa.delta]
    while True:
        sigs: dict[tuple, int] = {}
        block = [sigs.setdefault((block[q], _canonical(flat, block)), len(sigs))
                 for q, flat in enumerate(flats)]
        if len(sigs) == count:
            break
        count = len(sigs)
    first: dict[int, int] = {}
    for q in range(dfa.size):
        first.setdefault(block[q], len(first))
    delta: list[list[tuple[CharSet, int]]] = [[] for _ in first]
    done = set()
    for q, moves in enumerate(dfa.delta):
        b = first[block[q]]
        if b in done:
            continue
        done.add(b)
        merged: dict[int, list[tuple[int, int]]] = {}
        for cs, t in moves:
            merged.setdefault(first[block[t]], []).extend(cs.ranges)
        delta[b] = [(CharSet.of(r), t) for t, r in merged.items()]
    accepting = frozenset(first[block[q]] for q in dfa.accepting)
    return Dfa(tuple(tuple(d) for d in delta), accepting)


# ---- membership and emission --------------------------------------------------------------------


def dfa_matches(dfa: Dfa, value: str) -> bool:
    if not dfa.delta:
        return False
    q = 0
    for ch in value:
        cp = ord(ch)
        for cs, t in dfa.delta[q]:
            if cp in cs:
                q = t
                break
        else:
            return False
    return q in dfa.accepting


def json_string_rules(dfa: Dfa, prefix: str) -> tuple[str, dict[str, str]]:
    """(entry expression, rules): the DFA's language as JSON strings (quotes included) with
    canonical escapes; rule names are `prefix` + state number. The DFA must be non-empty."""
    from services.grammar.schema.regex_json import lower

    assert dfa.delta, "an empty language has no grammar"
    rules: dict[str, str] = {}
    # A large product (a length counter times a pattern) repeats each character class in every
    # state of the counter: there each class of more than SHARED_UNIT characters of text is one
    # rule, referred to by every state (the same language; smaller products keep their text)
    shared: dict[str, str] | None = {} if len(dfa.delta) > SHARE_UNITS_ABOVE else None
    for q, moves in enumerate(dfa.delta):
        alts = ['"\\""'] if q in dfa.accepting else []
        for cs, t in moves:
            unit = lower(Chars(cs))
            if unit is not None:
                text = to_ebnf(unit)
                if shared is not None and len(text) > SHARED_UNIT:
                    if text not in shared:
                        shared[text] = f"{prefix}u{len(shared)}"
                        rules[shared[text]] = text
                    alts.append(f"{shared[text]} {prefix}{t}")
                else:
                    alts.append(f"({text}) {prefix}{t}")
        rules[f"{prefix}{q}"] = " | ".join(alts)
    return f'"\\"" {prefix}0', rules
