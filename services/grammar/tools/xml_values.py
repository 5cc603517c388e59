"""Strict XML argument values: which parameters are raw strings, and raw string grammars.

Design document: "Pure string arguments use a raw string; type unions without string use JSON
values. A raw argument mixing string with other types whose branch the model format cannot
determine is rejected for strict composition while preparing" and "A raw string argument ends at
\\n</parameter>, which must not occur in the value. Grammar and parser use the same delimiter rule
and strict output generates only losslessly representable values; a required const/enum value that
cannot be represented returns an explicit error instead of being changed. A string's
pattern/length and the delimiter exclusion hold together."

`parameter_kind` classifies a reduced parameter schema: RAW (every value is a string), JSON (no
value is a string) or MIXED (rejected: the raw text of a string could also be the JSON text of
another value, e.g. `null`). `RawStrings` writes EBNF for raw string values that never contain
the delimiter `\\n</parameter>` (`VALUE_END`), as right-linear rules of the delimiter's KMP
automaton, times a character count for length bounds:

- no pattern and no length: the automaton alone;
- a maximum length below the delimiter's length: any characters (no value that short holds it);
- a minimum length up to `MAX_COUNTED` (and no maximum of 13 or more): the automaton times the
  count (its compile cost grows with the count);
- any other length bounds (a maximum of 13 or more, a longer minimum): the automaton alone, the
  bounds counted beside the matcher by the RawLengthConstraint companion (raw_lengths.py), which
  `counted` gives them to; a union of such strings counts one interval of lengths;
- one pattern, no length: the pattern's own language when it cannot produce a line break (then it
  cannot hold the delimiter, whose first character is the line break);
- const/enum: the literal texts, each checked not to hold the delimiter.

Everything else (a pattern that may produce a line break, several patterns, a counted union with
a gap or a pattern or literal branch) needs the general string-automaton intersection:
UnsupportedSchema at the parameter, never a looser language.
"""

from __future__ import annotations

import json

from services.grammar.regex.charset import ANY, CharSet, ebnf_class
from services.grammar.regex.tree import Alt, Chars, Literal, Repeat, Seq, ebnf_literal, to_ebnf
from services.grammar.regex.tree import Node as TreeNode
from services.grammar.schema.context import Context
from services.grammar.schema.nodes import (
    AnyValue,
    Literals,
    Node,
    NoValue,
    ReducedSchema,
    Ref,
    StringType,
    Union,
)
from services.grammar.schema.patterns import PatternSupport
from services.grammar.tools.param_names import kmp_failure
from shared.frontends.formats.qwen_xml import VALUE_END

RAW, JSON, MIXED, NEVER = "raw", "json", "mixed", "never"
# Longest length bound the grammar counts itself, together with the delimiter exclusion. The
# product automaton costs about 0.3-0.6 s of compile per counted character on the Qwen3.5
# vocabulary (measured: minLength 3: 2.1 s, 8: 4.8 s; maxLength 13: 4.9 s, 24: 17 s; unbounded:
# 0.7 s), so longer bounds are counted by the length companion instead.
MAX_COUNTED = 4


def resolve(node: Node, schema: ReducedSchema) -> Node:
    """`node` with references followed (a reference cycle without structure: NoValue)."""
    seen: set[str] = set()
    while isinstance(node, Ref):
        if node.name in seen:
            return NoValue()
        seen.add(node.name)
        node = schema.defs[node.name]
    return node


def parameter_kind(node: Node, schema: ReducedSchema) -> str:
    """RAW, JSON, MIXED or NEVER (no value at all) for a reduced parameter schema."""
    node = resolve(node, schema)
    if isinstance(node, NoValue):
        return NEVER
    if isinstance(node, AnyValue):
        return MIXED
    if isinstance(node, StringType):
        return RAW
    if isinstance(node, Literals):
        strings = [isinstance(json.loads(t), str) for t in node.texts]
        return RAW if all(strings) else JSON if not any(strings) else MIXED
    if isinstance(node, Union):
        kinds = {parameter_kind(b, schema) for b in node.branches} - {NEVER}
        return kinds.pop() if len(kinds) == 1 else MIXED if kinds else NEVER
    return JSON


def _counted(node: StringType) -> bool:
    """Whether a raw string's length bounds are counted beside its grammar: no pattern, and
    bounds the delimiter automaton cannot carry cheaply (a maximum of the delimiter's length or
    more, or a minimum above MAX_COUNTED)."""
    lo, hi = node.min_length, node.max_length
    if node.patterns or (hi is not None and hi < len(VALUE_END)) or (lo == 0 and hi is None):
        return False
    return (hi if hi is not None else lo) > MAX_COUNTED


def _can_produce(tree: TreeNode, cp: int) -> bool:
    if isinstance(tree, Chars):
        return cp in tree.charset
    if isinstance(tree, Literal):
        return chr(cp) in tree.text
    if isinstance(tree, (Seq, Alt)):
        return any(_can_produce(i, cp) for i in tree.items)
    if isinstance(tree, Repeat):
        return tree.hi != 0 and _can_produce(tree.item, cp)
    return True  # anything else: assume it can


class RawStrings:
    """Raw string value grammars of one tool; rules accumulate in `rules` (name -> body)."""

    def __init__(self, prefix: str, ctx: Context | None = None,
                 patterns: PatternSupport | None = None) -> None:
        self.prefix = prefix
        self.ctx = ctx or Context()
        self.patterns = patterns or PatternSupport(self.ctx)
        self.rules: dict[str, str] = {}
        self._automaton: dict[tuple[int, int], dict[str, int]] = {}

    def bind(self, ctx: Context, patterns: PatternSupport) -> "RawStrings":
        """This rule set reporting errors through another tool's context."""
        self.ctx, self.patterns = ctx, patterns
        return self

    def copy(self) -> "RawStrings":
        """A scratch copy to build into; `adopt` keeps what it built."""
        other = RawStrings(self.prefix, self.ctx, self.patterns)
        other.rules = dict(self.rules)
        other._automaton = {k: dict(v) for k, v in self._automaton.items()}
        return other

    def adopt(self, other: "RawStrings") -> None:
        """Take the rules a scratch copy built."""
        self.rules, self._automaton = other.rules, other._automaton
        self.ctx, self.patterns = other.ctx, other.patterns

    def unbounded(self) -> str:
        """The rule for any text without the delimiter."""
        return self._state(0, 0, None)

    def expression(self, node: Node, schema: ReducedSchema, pointer: str) -> str:
        """An EBNF expression for the raw texts of `node`'s values (all strings). Raises
        UnsupportedSchema (at `pointer`) for a value set it cannot represent exactly."""
        node = resolve(node, schema)
        if isinstance(node, Union):
            alts = [self.expression(b, schema, pointer) for b in node.branches
                    if parameter_kind(b, schema) != NEVER]
            return "(" + " | ".join(alts) + ")"
        if isinstance(node, Literals):
            texts = [json.loads(t) for t in node.texts]
            for text in texts:
                if VALUE_END in text:
                    raise self.ctx.unsupported(pointer, f"the value {text!r} contains the "
                                               "parameter delimiter '\\n</parameter>' and cannot "
                                               "be written as a raw XML argument")
            return "(" + " | ".join(ebnf_literal(t) if t else '""' for t in texts) + ")"
        assert isinstance(node, StringType), node
        if node.patterns:
            return self._pattern(node, pointer)
        lo, hi = node.min_length, node.max_length
        if hi is not None and hi < len(VALUE_END):
            return f"{ebnf_class(ANY)}{{{lo},{hi}}}" if hi else '""'
        if lo == 0 and hi is None:
            return self._state(0, 0, None)
        if _counted(node):  # the length companion counts it (raw_lengths.py)
            return self._state(0, 0, None)
        return self._state(0, 0, (lo, hi))

    def counted(self, node: Node, schema: ReducedSchema,
                pointer: str) -> tuple[int, int | None] | None:
        """The (min, max or None) length bounds of a raw parameter that its grammar leaves to the
        RawLengthConstraint companion (raw_lengths.py) beside the delimiter automaton, None when
        the grammar holds its value set exactly. A union of such strings counts one interval: a
        union with a gap between its lengths, or with a pattern or literal branch, raises
        UnsupportedSchema at `pointer`."""
        node = resolve(node, schema)
        branches = [resolve(b, schema) for b in node.branches
                    if parameter_kind(b, schema) != NEVER] if isinstance(node, Union) else [node]
        if not any(isinstance(b, StringType) and _counted(b) for b in branches):
            return None
        if not all(isinstance(b, StringType) and not b.patterns for b in branches):
            raise self.ctx.unsupported(pointer, "a raw XML string union of a length-bounded "
                                       "string with a pattern or literal branch is not supported")
        spans = sorted((b.min_length, b.max_length) for b in branches)
        lo, hi = spans[0]
        for a, b in spans[1:]:
            if hi is not None and a > hi + 1:
                raise self.ctx.unsupported(pointer, "a raw XML string union whose length bounds "
                                           "leave a gap is not supported")
            hi = None if hi is None or b is None else max(hi, b)
        return lo, hi

    def _pattern(self, node: StringType, pointer: str) -> str:
        self.patterns.check(node, self.ctx)
        if not self.patterns.tree_only(node):  # several patterns, formats or lengths: automaton
            return self._dfa(node)
        tree = self.patterns.tree(node.patterns[0])
        if _can_produce(tree, ord("\n")):
            raise self.ctx.unsupported(node.patterns[0].pointer, "a pattern that may produce a "
                                       "line break on a raw XML string (its intersection with the "
                                       "'\\n</parameter>' exclusion) is not supported yet")
        return "(" + to_ebnf(tree) + ")"

    def _dfa(self, node: StringType) -> str:
        """The intersection automaton of the string's patterns, formats and lengths
        (PatternSupport.string_dfa) as raw characters, one rule per state. A value without a line
        break can never hold the delimiter, so it is exact only when no state reads one."""
        dfa = self.patterns.string_dfa(node, self.ctx)
        if any(ord("\n") in cs for moves in dfa.delta for cs, _ in moves):
            raise self.ctx.unsupported(node.patterns[-1].pointer, "a pattern or format that may "
                                       "produce a line break on a raw XML string (its intersection "
                                       "with the '\\n</parameter>' exclusion) is not supported yet")
        base = f"{self.prefix}dfa{len(self.rules)}_"
        for q, moves in enumerate(dfa.delta):
            alts = ['""'] if q in dfa.accepting else []
            alts += [f"{ebnf_class(cs.scalars())} {base}{t}" for cs, t in moves]
            self.rules[f"{base}{q}"] = " | ".join(alts) if alts else '""'
        return f"{base}0"

    # -- the delimiter's automaton, times a count -------------------------------------------------
    def _transitions(self, state: int) -> dict[int, str]:
        """KMP transitions of the delimiter from `state`: next state -> character class."""
        word = VALUE_END
        by_next: dict[int, list[str]] = {}
        for ch in sorted(set(word)):
            k = state
            while k and word[k] != ch:
                k = kmp_failure(word)[k]
            nxt = k + 1 if word[k] == ch else 0
            if nxt < len(word):
                by_next.setdefault(nxt, []).append(ch)
        out = {nxt: CharSet.chars("".join(chars)) for nxt, chars in by_next.items()}
        others = CharSet.chars("".join(set(word))).invert().scalars()
        out[0] = out[0].union(others) if 0 in out else others
        return {nxt: ebnf_class(cs) if cs.single is None else ebnf_literal(chr(cs.single))
                for nxt, cs in out.items()}

    def _state(self, state: int, count: int, bounds: tuple[int, int | None] | None) -> str:
        """The rule for the rest of a value after `count` characters, in automaton `state`;
        `bounds` (lo, hi) counts characters (None: unbounded, the count is not kept)."""
        if bounds is not None and bounds[1] is None and count >= bounds[0]:
            bounds, count = None, 0  # past the minimum, no maximum: the plain automaton
        tag = "u" if bounds is None else f"b{bounds[0]}_{bounds[1]}_{count}"
        name = f"{self.prefix}raw_{tag}_{state}"
        if name in self.rules:
            return name
        self.rules[name] = '""'  # placeholder against recursion
        alts = []
        if bounds is None or count >= bounds[0]:
            alts.append('""')
        if bounds is None or bounds[1] is None or count < bounds[1]:
            for nxt, cls in self._transitions(state).items():
                alts.append(f"{cls} {self._state(nxt, count + 1, bounds)}")
        self.rules[name] = " | ".join(alts) if alts else '""'
        return name


