"""Rewrites 3 and 4 of rewrite.py's list, both identities of languages: small rules that no
recursion passes through are copied into their users, and trailing repetitions that may be empty
move to every use of their rule; `reachable`, the rule names a node refers to."""

from __future__ import annotations

from services.grammar.gbnf.parser import Rule
from services.grammar.regex.tree import Alt, Node, Ref, Repeat, Seq, alt, seq

INLINE_NODES = 16  # rules with at most this many tree nodes are copied into their users


def _size(node: Node) -> int:
    if isinstance(node, (Seq, Alt)):
        return 1 + sum(_size(i) for i in node.items)
    if isinstance(node, Repeat):
        return 1 + _size(node.item)
    return 1


def _refs(node: Node) -> set[str]:
    return reachable([node], {}, follow=False)


def inline_small(rules: list[Rule]) -> list[Rule]:
    """Copy small rules that no recursion passes through into the rules that use them, so that
    a token running from, say, `ws` into what follows it is decided inside one rule. The root,
    annotated rules and rules a lookahead names stay rules."""
    bodies = {r.name: r.body for r in rules}
    keep = {"root"} | {r.name for r in rules if r.lookahead is not None} | \
        reachable([r.lookahead for r in rules if r.lookahead is not None], bodies)
    small: dict[str, Node] = {}
    changed = True
    while changed:
        changed = False
        for name, body in bodies.items():
            if name in keep or name in small or _size(body) > INLINE_NODES:
                continue
            if _refs(body) <= set(small):  # only references to rules already inlinable
                small[name] = body
                changed = True

    def expand(node: Node) -> Node:
        if isinstance(node, Ref) and node.name in small:
            return expand(small[node.name])
        if isinstance(node, Seq):
            return seq([expand(i) for i in node.items])
        if isinstance(node, Alt):
            return alt([expand(i) for i in node.items])
        if isinstance(node, Repeat):
            return Repeat(expand(node.item), node.lo, node.hi)
        return node

    return [Rule(r.name, expand(r.body), r.lookahead) for r in rules if r.name not in small]


def hoist_trailing(rules: list[Rule]) -> list[Rule]:
    """`S ::= A W` with W a trailing repetition that may be empty (`statement ::= (...) ws`)
    becomes `S ::= A`, and every use of S becomes `S W`: the same language, and W now sits in
    front of whatever follows S, where rewrite.py's repetition rewrite can take that into its
    rule."""
    bodies = {r.name: r.body for r in rules}
    keep = {"root"} | {r.name for r in rules if r.lookahead is not None} | \
        reachable([r.lookahead for r in rules if r.lookahead is not None], bodies)
    tails: dict[str, Node] = {}
    for r in rules:
        body = r.body
        if r.name in keep or not isinstance(body, Seq) or len(body.items) < 2:
            continue
        last = body.items[-1]
        if isinstance(last, Repeat) and last.lo == 0 and last.hi is None and not _refs(last):
            tails[r.name] = last

    def use(node: Node) -> Node:
        if isinstance(node, Ref) and node.name in tails:
            return Seq((node, tails[node.name]))
        if isinstance(node, Seq):
            return seq([use(i) for i in node.items])
        if isinstance(node, Alt):
            return alt([use(i) for i in node.items])
        if isinstance(node, Repeat):
            return Repeat(use(node.item), node.lo, node.hi)
        return node

    out = []
    for r in rules:
        body = r.body
        if r.name in tails:
            assert isinstance(body, Seq)
            body = seq(list(body.items[:-1]))
        out.append(Rule(r.name, use(body), r.lookahead))
    return out


def reachable(roots: list[Node], bodies: dict[str, Node], *, follow: bool = True) -> set[str]:
    """Rule names referred to from `roots` (through the rules' bodies too when `follow`)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if isinstance(node, Ref):
            if node.name not in seen:
                seen.add(node.name)
                if follow:
                    stack.append(bodies[node.name])
        elif isinstance(node, (Seq, Alt)):
            stack.extend(node.items)
        elif isinstance(node, Repeat):
            stack.append(node.item)
    return seen
