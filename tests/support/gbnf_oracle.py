"""An independent GBNF recogniser for tests: our parse tree as a plain context-free grammar over
Unicode code points, decided by an Earley parser (with the nullable-completion fix). It shares
only the parse tree with the code under test, never xgrammar or the rewrites."""

from __future__ import annotations

from services.grammar.regex.charset import CharSet
from services.grammar.regex.tree import Alt, Chars, Literal, Node, Ref, Repeat, Seq, Tokens

Symbol = object  # a nonterminal name (str) or a terminal CharSet


class CFG:
    def __init__(self, rules: dict[str, Node]) -> None:
        self.prods: dict[str, list[tuple[Symbol, ...]]] = {}
        self._n = 0
        for name, body in rules.items():
            self.prods.setdefault(name, []).append(self._symbols(body))
        self.nullable = self._nullable()

    def _fresh(self) -> str:
        self._n += 1
        return f"\0{self._n}"

    def _symbols(self, node: Node) -> tuple[Symbol, ...]:
        if isinstance(node, Literal):
            return tuple(CharSet.chars(c) for c in node.text)
        if isinstance(node, Chars):
            return (node.charset,)
        if isinstance(node, Ref):
            return (node.name,)
        if isinstance(node, Seq):
            return tuple(s for item in node.items for s in self._symbols(item))
        if isinstance(node, Alt):
            nt = self._fresh()
            self.prods[nt] = [self._symbols(i) for i in node.items]
            return (nt,)
        if isinstance(node, Tokens):
            raise ValueError("token terminals have no text form")
        assert isinstance(node, Repeat)
        item = self._symbols(node.item)
        out = item * node.lo
        if node.hi is None:
            star = self._fresh()
            self.prods[star] = [(), item + (star,)]
            return out + (star,)
        tail: tuple[Symbol, ...] = ()
        for _ in range(node.hi - node.lo):  # optional items, nested: (x (x (x)?)?)?
            opt = self._fresh()
            self.prods[opt] = [(), item + tail]
            tail = (opt,)
        return out + tail

    def _nullable(self) -> set[str]:
        out: set[str] = set()
        changed = True
        while changed:
            changed = False
            for nt, alts in self.prods.items():
                if nt not in out and any(all(isinstance(s, str) and s in out for s in a)
                                         for a in alts):
                    out.add(nt)
                    changed = True
        return out

    def accepts(self, text: str, start: str = "root") -> bool:
        """Earley recognition of `text` from `start`."""
        n = len(text)
        chart: list[set[tuple[str, int, int, int]]] = [set() for _ in range(n + 1)]
        # item: (nt, alternative index, dot, origin)
        for a in range(len(self.prods[start])):
            chart[0].add((start, a, 0, 0))
        for i in range(n + 1):
            agenda = list(chart[i])
            while agenda:
                nt, a, dot, origin = agenda.pop()
                rhs = self.prods[nt][a]
                if dot < len(rhs):
                    sym = rhs[dot]
                    if isinstance(sym, str):
                        for b in range(len(self.prods[sym])):
                            new = (sym, b, 0, i)
                            if new not in chart[i]:
                                chart[i].add(new)
                                agenda.append(new)
                        if sym in self.nullable:
                            new = (nt, a, dot + 1, origin)
                            if new not in chart[i]:
                                chart[i].add(new)
                                agenda.append(new)
                    elif i < n and ord(text[i]) in sym:
                        chart[i + 1].add((nt, a, dot + 1, origin))
                else:
                    for pnt, pa, pdot, porigin in list(chart[origin]):
                        prhs = self.prods[pnt][pa]
                        if pdot < len(prhs) and prhs[pdot] == nt:
                            new = (pnt, pa, pdot + 1, porigin)
                            if new not in chart[i]:
                                chart[i].add(new)
                                agenda.append(new)
        return any(nt == start and dot == len(self.prods[nt][a]) and origin == 0
                   for nt, a, dot, origin in chart[n])
