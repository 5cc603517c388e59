"""The reduced schema graph as xgrammar EBNF in the generation layout.

Layout: declared properties in declared order (optional ones may be skipped), then any additional
properties; whitespace runs of at most 32 characters between tokens and none around the root value;
canonical string escapes; numbers as in `numbers`. One rule per node (memoized), one per definition.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from services.grammar.regex.tree import ebnf_literal
from services.grammar.schema import numbers
from services.grammar.schema.nodes import (
    AnyValue, ArrayType, BooleanType, IntegerType, Literals, Node, NoValue, NullType, NumberType,
    ObjectType, ReducedSchema, Ref, StringType, Union,
)
from services.grammar.schema.strings import (
    CHAR_RULE, MAX_WHITESPACE, STRING_SUB_RULE, key_excluding, literal,
)

_BASE = f"""ws ::= [ \\t\\n\\r]{{0,{MAX_WHITESPACE}}}
char ::= {CHAR_RULE}
string ::= "\\"" string_sub
string_sub ::= {STRING_SUB_RULE}
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{{" ws ( member ws ( "," ws member ws )* )? "}}"
member ::= string ws ":" ws value
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
"""


class Emitter:
    """Builds the EBNF text; `pattern_ebnf(string_node, rule_prefix) -> (expression, rules)`
    compiles a string's patterns/formats and lengths."""

    def __init__(self, schema: ReducedSchema,
                 pattern_ebnf: Callable[[Any, str], tuple[str, dict[str, str]]],
                 extended: Callable[["Emitter", Node], str | None] | None = None) -> None:
        self.schema = schema
        self.pattern_ebnf = pattern_ebnf
        # node forms emitted elsewhere (schema/arrays.py, schema/objects.py): a body or None
        self.extended = extended
        self.rules: dict[str, str] = {}
        self.memo: dict[Node, str] = {}
        self._counter = 0

    def grammar(self) -> str:
        self._named("number", numbers.number_ebnf(numbers.NumberType()))
        root = self.rule(self.schema.root)
        body = "".join(f"{k} ::= {v}\n" for k, v in self.rules.items())
        return f"root ::= {root}\n" + _BASE + body

    def _named(self, name: str, body: str | None) -> str:
        self.rules[name] = body if body else '"\\u0000" "\\u0000"'
        return name

    def _fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def rule(self, node: Node) -> str:
        """The name of a rule for `node` (a NEVER node only appears where it is unreachable)."""
        if isinstance(node, AnyValue):
            return "value"
        if isinstance(node, Ref):
            name = "d" + str(list(self.schema.defs).index(node.name))
            if name not in self.rules:
                self.rules[name] = "(nothing)"  # placeholder against recursion
                self.rules[name] = self.rule(self.schema.defs[node.name])
            return name
        if node in self.memo:
            return self.memo[node]
        name = self._fresh("n")
        self.memo[node] = name
        self.rules[name] = "(nothing)"
        self.rules[name] = self._body(node)
        return name

    def _body(self, node: Node) -> str:
        if self.extended is not None:
            body = self.extended(self, node)
            if body is not None:
                return body
        if isinstance(node, NoValue):
            # Unreachable in a satisfiable graph; a rule that no output can complete.
            return '"\\u0000" "\\u0000"'
        if isinstance(node, Union):
            return " | ".join(self.rule(b) for b in node.branches)
        if isinstance(node, Literals):
            return " | ".join(self._value_literal(json.loads(t)) for t in node.texts)
        if isinstance(node, NullType):
            return '"null"'
        if isinstance(node, BooleanType):
            return '"true" | "false"'
        if isinstance(node, IntegerType):
            return numbers.integer_ebnf(node)
        if isinstance(node, NumberType):
            return numbers.number_ebnf(node) or '"\\u0000" "\\u0000"'
        if isinstance(node, StringType):
            return self._string(node)
        if isinstance(node, ArrayType):
            return self._array(node)
        assert isinstance(node, ObjectType)
        return self._object(node)

    def _value_literal(self, v: Any) -> str:
        if isinstance(v, dict):
            if not v:
                return '"{" ws "}"'
            members = ' ws "," ws '.join(f'{literal(k)} ws ":" ws {self._value_literal(x)}'
                                         for k, x in v.items())
            return f'("{{" ws {members} ws "}}")'
        if isinstance(v, list):
            if not v:
                return '"[" ws "]"'
            return '("[" ws ' + ' ws "," ws '.join(self._value_literal(x) for x in v) + ' ws "]")'
        if isinstance(v, str):
            return literal(v)
        return ebnf_literal(json.dumps(v))

    def _string(self, node: StringType) -> str:
        if node.patterns:  # pattern/format (and length): the expression and its rules
            body, rules = self.pattern_ebnf(node, self._fresh("p") + "_")
            self.rules.update(rules)
            return body
        hi = "" if node.max_length is None else str(node.max_length)
        if node.min_length == 0 and node.max_length is None:
            return "string"
        return f'"\\"" char{{{node.min_length},{hi}}} "\\""'

    def _array(self, node: ArrayType) -> str:
        prefix, lo, hi = node.prefix, node.min_items, node.max_items
        k = len(prefix)
        items = None if isinstance(node.items, NoValue) else self.rule(node.items)

        def tail(first: bool) -> str:
            # what follows after k prefix elements: more items, then "]"
            if items is None or hi == k:
                return '"]"'
            need = max(lo - k, 0)
            top = "" if hi is None else str(hi - k)
            if first:  # k == 0: no comma before the first item
                more_lo = max(need - 1, 0)
                more_hi = "" if hi is None else str(hi - 1)
                body = f'{items} ws ("," ws {items} ws){{{more_lo},{more_hi}}} "]"'
                return body if need > 0 else f'({body} | "]")'
            return f'("," ws {items} ws){{{need},{top}}} "]"'

        # seq(i): after i elements (i >= 1) of the prefix
        def seq(i: int) -> str:
            if i == k:
                return tail(False)
            step = f'"," ws {self.rule(prefix[i])} ws {seq(i + 1)}'
            return f'({step} | "]")' if i >= lo else f"({step})"

        if k == 0:
            return f'"[" ws {tail(True)}'
        first = f'{self.rule(prefix[0])} ws {seq(1)}'
        return f'"[" ws ({first} | "]")' if lo == 0 else f'"[" ws {first}'

    def _object(self, node: ObjectType) -> str:
        required = node.required_names
        props = [(k, v) for k, v in node.properties if not isinstance(v, NoValue)]
        names = [k for k, _ in node.properties] + [n for n in required if
                                                    n not in dict(node.properties)]
        extra = None
        if not isinstance(node.additional, NoValue):
            key = self._fresh("k")
            self.rules.update(key_excluding(names, key))
            extra = f'{key} ws ":" ws {self.rule(node.additional)}'
        prefix = self._fresh("o")
        self.rules[prefix] = "(nothing)"
        # state (i, started): rule name o_i_s; built from the end
        def name(i: int, started: bool) -> str:
            return f"{prefix}_{i}_{int(started)}"

        n = len(props)
        for started in (False, True):
            if extra is None:
                self.rules[name(n, started)] = '"}"'
            elif started:
                self.rules[name(n, started)] = f'("," ws {extra} ws)* "}}"'
            else:
                self.rules[name(n, started)] = f'{extra} ws ("," ws {extra} ws)* "}}" | "}}"'
        for i in range(n - 1, -1, -1):
            key, sub = props[i]
            for started in (False, True):
                comma = '"," ws ' if started else ""
                take = f'{comma}{literal(key)} ws ":" ws {self.rule(sub)} ws {name(i + 1, True)}'
                self.rules[name(i, started)] = take if key in required else \
                    f"{take} | {name(i + 1, started)}"
        del self.rules[prefix]
        return f'"{{" ws {name(0, False)}'
