"""Rewrites of a parsed grammar that keep its language and make xgrammar's masks cheap.

xgrammar precomputes, for each grammar position, which tokens are decided by that position alone;
a token that can run past the end of the current rule is "uncertain" and is checked against the
whole parse stack for every mask. A repetition of a rule with alternatives (`("a" | "\\\\" ...)*`)
becomes a helper rule that may end after every unit, so nearly every token inside it is uncertain
(llama.cpp's JSON string rule: ~20 ms per mask on SmolLM2, ~0.1 s on Qwen3.5). Two rewrites, each
an identity of languages:

1. Character sets: a rule or alternative whose every branch is one character (a class, a
   one-character literal, or a rule of that kind) becomes one class: `en-char+` with
   `en-char ::= letter | digit | punctuation` is `[a-zA-Z0-9!-/...]+`, which xgrammar matches
   natively.
2. Repetitions: `X* rest` (X not nullable; rest the remainder of the sequence, already
   rewritten) becomes `R` with `R ::= rest | X R` (`X{m,} = X{m} X*`; a repetition at the end
   gives `R ::= "" | X R`). R cannot end inside the repetition, and it carries a lookahead
   annotation `(= [c...])` listing every character that can follow it anywhere (FIRST of what
   follows, through FOLLOW of the enclosing rules), so tokens that cross its end are decided at
   compile time too. The annotation is a superset of what follows, as xgrammar's compile-hint
   semantics require; it is left out when a token terminal (Token/ExcludeToken) can follow.
3. Small rules (whitespace, identifiers, numbers) no recursion passes through are copied into
   the rules that use them, so a token running from one into the next is decided in one rule.
4. Trailing repetitions that may be empty (`statement ::= (...) ws`) move to every use of the
   rule (`statement ws`), in front of what follows it, where rewrite 2 can take that in.
5. Annotations: every other rule without one gets the same kind of lookahead (an identifier rule
   followed only by `(`, `,`, `;` or whitespace no longer leaves every `word.` token uncertain),
   except the rules a user's own lookahead refers to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.grammar.gbnf.inline import hoist_trailing, inline_small, reachable
from services.grammar.gbnf.parser import Rule
from services.grammar.regex.charset import ANY, EMPTY, CharSet
from services.grammar.regex.tree import (
    Alt,
    Chars,
    Literal,
    Node,
    Ref,
    Repeat,
    Seq,
    Tokens,
    alt,
    seq,
)


@dataclass
class _First:
    """The characters that can start a string (plus: a token terminal can start it)."""

    chars: CharSet = EMPTY
    token: bool = False

    def add(self, other: "_First") -> bool:
        merged = self.chars.union(other.chars)
        changed = merged != self.chars or (other.token and not self.token)
        self.chars, self.token = merged, self.token or other.token
        return changed


@dataclass
class _Follow(_First):
    end: bool = False  # the end of the output can follow

    def add(self, other: "_First") -> bool:  # type: ignore[override]
        changed = super().add(other)
        if isinstance(other, _Follow) and other.end and not self.end:
            self.end = changed = True
        return changed


def _charset(node: Node, sets: dict[str, CharSet | None]) -> CharSet | None:
    """The set of one-character strings `node` matches, or None when it matches anything else."""
    if isinstance(node, Chars):
        return node.charset
    if isinstance(node, Literal):
        return CharSet.chars(node.text) if len(node.text) == 1 else None
    if isinstance(node, Ref):
        return sets.get(node.name)
    if isinstance(node, Alt):
        out = EMPTY
        for item in node.items:
            cs = _charset(item, sets)
            if cs is None:
                return None
            out = out.union(cs)
        return out
    if isinstance(node, Seq) and len(node.items) == 1:
        return _charset(node.items[0], sets)
    return None


class _Analysis:
    def __init__(self, rules: dict[str, Node]) -> None:
        self.rules = rules
        self.nullable: dict[str, bool] = {n: False for n in rules}
        self.first: dict[str, _First] = {n: _First() for n in rules}
        changed = True
        while changed:
            changed = False
            for name, body in rules.items():
                if not self.nullable[name] and self.is_nullable(body):
                    self.nullable[name] = changed = True
                changed |= self.first[name].add(self.first_of(body))
        self.follow: dict[str, _Follow] = {n: _Follow() for n in rules}
        self.follow["root"].end = True
        changed = True
        while changed:
            changed = False
            for name, body in rules.items():
                changed |= self._walk(body, self.follow[name])

    def register(self, name: str, first: _First, nullable: bool) -> None:
        """A rule added while rewriting (its FOLLOW is not needed until the final analysis)."""
        self.rules[name] = Seq(())
        self.nullable[name] = nullable
        self.first[name] = first
        self.follow[name] = _Follow()

    def is_nullable(self, node: Node) -> bool:
        if isinstance(node, Literal):
            return node.text == ""
        if isinstance(node, (Chars, Tokens)):
            return False
        if isinstance(node, Ref):
            return self.nullable[node.name]
        if isinstance(node, Seq):
            return all(self.is_nullable(i) for i in node.items)
        if isinstance(node, Alt):
            return any(self.is_nullable(i) for i in node.items)
        assert isinstance(node, Repeat)
        return node.lo == 0 or node.hi == 0 or self.is_nullable(node.item)

    def first_of(self, node: Node) -> _First:
        out = _First()
        if isinstance(node, Literal):
            if node.text:
                out.chars = CharSet.chars(node.text[0])
        elif isinstance(node, Chars):
            out.chars = node.charset
        elif isinstance(node, Tokens):
            out.token = True
        elif isinstance(node, Ref):
            out.add(self.first[node.name])
        elif isinstance(node, Seq):
            for item in node.items:
                out.add(self.first_of(item))
                if not self.is_nullable(item):
                    break
        elif isinstance(node, Alt):
            for item in node.items:
                out.add(self.first_of(item))
        else:
            assert isinstance(node, Repeat)
            if node.hi != 0:
                out.add(self.first_of(node.item))
        return out

    def after(self, items: tuple[Node, ...], follow: _Follow) -> _Follow:
        """What can follow the position before `items` given `follow` after them."""
        out = _Follow()
        for item in items:
            out.add(self.first_of(item))
            if not self.is_nullable(item):
                return out
        out.add(follow)
        return out

    def _walk(self, node: Node, follow: _Follow) -> bool:
        if isinstance(node, Ref):
            return self.follow[node.name].add(follow)
        changed = False
        if isinstance(node, Seq):
            for i, item in enumerate(node.items):
                changed |= self._walk(item, self.after(node.items[i + 1:], follow))
        elif isinstance(node, Alt):
            for item in node.items:
                changed |= self._walk(item, follow)
        elif isinstance(node, Repeat):
            inner = _Follow()
            inner.add(follow)
            if node.hi is None or node.hi > 1:
                inner.add(self.first_of(node.item))
            changed |= self._walk(node.item, inner)
        return changed


@dataclass
class _Rewriter:
    analysis: _Analysis
    taken: set[str]
    added: list[Rule] = field(default_factory=list)
    counter: int = 0

    def fresh(self) -> str:
        while f"rep_{self.counter}" in self.taken:
            self.counter += 1
        name = f"rep_{self.counter}"
        self.taken.add(name)
        return name

    def node(self, node: Node, follow: _Follow) -> Node:
        if isinstance(node, Seq):
            return self.sequence(node.items, follow)
        if isinstance(node, Alt):
            return alt([self.node(i, follow) for i in node.items])
        if isinstance(node, Repeat):
            return self.sequence((node,), follow)
        return node

    def _qualifies(self, node: Node) -> bool:
        return (isinstance(node, Repeat) and node.hi is None
                and not self.analysis.is_nullable(node.item))

    def sequence(self, items: tuple[Node, ...], follow: _Follow) -> Node:
        """Rewrite right to left, so an element is final before the repetition before it takes
        it into its rule. Each output entry keeps the language it stands for (in terms of the
        grammar before rewriting), from which FIRST and FOLLOW are computed."""
        out: list[tuple[Node, Node]] = []  # (rewritten, its language), rightmost first

        def after(entries: list[tuple[Node, Node]]) -> _Follow:
            return self.analysis.after(tuple(m for _, m in reversed(entries)), follow)

        for item in reversed(items):
            here = after(out)
            if not self._qualifies(item):
                if isinstance(item, Repeat):
                    inner = _Follow()
                    inner.add(here)
                    if item.hi is None or item.hi > 1:
                        inner.add(self.analysis.first_of(item.item))
                    out.append((Repeat(self.node(item.item, inner), item.lo, item.hi), item))
                else:
                    out.append((self.node(item, here), item))
                continue
            assert isinstance(item, Repeat)
            # X{m,} Y  ->  X{m} R  with  R ::= Y | X R, Y = the rest of the sequence: R ends only
            # where the sequence ends (taking only the next element would leave `ws* [a-z]
            # [a-z0-9]*` ending after one letter, every " word" token uncertain there; measured on
            # Qwen3.5 the whole rest is faster for every benchmark grammar, C-like p99 8.6 ms ->
            # 72 us, JSON p50 66 -> 41 us).
            stop = seq([n for n, _ in reversed(out)])
            stop_lang = Seq(tuple(m for _, m in reversed(out)))
            out = []
            after_r = follow
            name = self.fresh()
            lang = Seq((Repeat(item.item, 0, None), stop_lang))
            first = self.analysis.first_of(lang)
            self.analysis.register(name, first, self.analysis.is_nullable(stop_lang))
            unit_items = item.item.items if isinstance(item.item, Seq) else (item.item,)
            again = self.sequence(tuple(unit_items) + (Ref(name),), after_r)
            self.added.append(Rule(name, alt([stop, again]), _lookahead(after_r)))
            out.append((Ref(name), lang))
            if item.lo:
                unit_follow = _Follow()
                unit_follow.add(self.analysis.first_of(lang))
                unit = self.node(item.item, unit_follow)
                out.append((Repeat(unit, item.lo, item.lo) if item.lo > 1 else unit,
                            Repeat(item.item, item.lo, item.lo)))
        return seq([node for node, _ in reversed(out)])


def _lookahead(follow: _Follow) -> Node | None:
    """The annotation for a rule that `follow` can follow: its characters; a class that matches
    nothing when only the end of the output can follow (tokens that run past the end are then
    refused at compile time; one that ends there is still accepted); none when a token
    terminal can follow or anything can."""
    if follow.token or follow.chars == ANY:
        return None
    if not follow.chars.ranges:
        return Chars(EMPTY) if follow.end else None
    return Chars(follow.chars)


def optimize(rules: list[Rule]) -> list[Rule]:
    """The same language with character sets merged and repetitions as annotated recursion."""
    bodies = {r.name: r.body for r in rules}
    sets: dict[str, CharSet | None] = {}
    changed = True
    while changed:  # rules that are sets of single characters, through references
        changed = False
        for name, body in bodies.items():
            if sets.get(name) is None:
                cs = _charset(body, {k: v for k, v in sets.items() if k != name})
                if cs is not None:
                    sets[name] = cs
                    changed = True

    def inline(node: Node) -> Node:
        cs = _charset(node, sets)
        if cs is not None and cs.ranges and not isinstance(node, Chars):
            return Chars(cs)
        if isinstance(node, Seq):
            return seq([inline(i) for i in node.items])
        if isinstance(node, Alt):
            return alt([inline(i) for i in node.items])
        if isinstance(node, Repeat):
            return Repeat(inline(node.item), node.lo, node.hi)
        return node

    inlined = hoist_trailing(inline_small([Rule(r.name, inline(r.body), r.lookahead)
                                           for r in rules]))
    analysis = _Analysis({r.name: r.body for r in inlined})
    rewriter = _Rewriter(analysis, {r.name for r in inlined})
    out = [Rule(r.name, rewriter.node(r.body, analysis.follow[r.name]), r.lookahead)
           for r in inlined] + rewriter.added
    # Every rule without an annotation gets what can follow it, except rules a user's lookahead
    # refers to (their annotations would take part in evaluating that lookahead).
    final = _Analysis({r.name: r.body for r in out})
    in_lookahead = reachable([r.lookahead for r in out if r.lookahead is not None],
                              {r.name: r.body for r in out})
    return [r if r.lookahead is not None or r.name == "root" or r.name in in_lookahead
            else Rule(r.name, r.body, _lookahead(final.follow[r.name])) for r in out]
