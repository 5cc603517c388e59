"""Boolean combinations of string automata: complement, union, difference of the languages of
several DFAs (`automata.Dfa`) by one product construction, and finite languages. Used for
property-name regions (objects.py), negated patterns and emptiness proofs (patterns.py)."""

from __future__ import annotations

from services.grammar.regex.charset import CharSet
from services.grammar.regex.tree import Alt, Literal
from services.grammar.schema.automata import (
    MAX_STATES,
    Dfa,
    TooComplex,
    _intersect,
    _trim,
    minimise,
    tree_dfa,
)

_ALL = CharSet.of([(0, 0x10FFFF)]).scalars()


def _complete(dfa: Dfa) -> Dfa:
    """The same language with a transition for every character (a sink state added last)."""
    sink = dfa.size
    delta = []
    for moves in list(dfa.delta) + [()]:
        covered = CharSet.of([r for cs, _ in moves for r in cs.ranges])
        rest = covered.invert()
        delta.append(tuple(moves) + (((rest, sink),) if rest.ranges else ()))
    if not dfa.delta:  # the empty language: only the sink, as state 0
        return Dfa((((_ALL, 0),),), frozenset())
    return Dfa(tuple(delta), dfa.accepting)


def combine(dfas: tuple[Dfa, ...], accept) -> Dfa:
    """The language of strings whose membership vector (one bool per DFA) satisfies `accept`:
    complement, union, difference. Trimmed and minimised; TooComplex beyond MAX_STATES."""
    full = [_complete(d) for d in dfas]
    start = tuple(0 for _ in full)
    index, order, delta = {start: 0}, [start], []
    i = 0
    while i < len(order):
        qs = order[i]
        moves = [(cs, (t,)) for cs, t in full[0].delta[qs[0]]]
        for d, q in zip(full[1:], qs[1:]):
            moves = [(c, ts + (t,)) for c0, ts in moves for cs, t in d.delta[q]
                     for c in (_intersect(c0, cs),) if c.ranges]
        out = []
        for cs, ts in moves:
            if ts not in index:
                if len(order) >= MAX_STATES:
                    raise TooComplex(f"the name language needs more than {MAX_STATES} states")
                index[ts] = len(order)
                order.append(ts)
            out.append((cs, index[ts]))
        delta.append(tuple(out))
        i += 1
    accepting = frozenset(k for k, qs in enumerate(order)
                          if accept(tuple(q in d.accepting for d, q in zip(full, qs))))
    return minimise(_trim(Dfa(tuple(delta), accepting)))


def literal_dfa(texts: tuple[str, ...]) -> Dfa:
    """The finite language `texts`."""
    if not texts:
        return Dfa((), frozenset())
    return tree_dfa(Alt(tuple(Literal(t) for t in texts)) if len(texts) > 1 else Literal(texts[0]))
