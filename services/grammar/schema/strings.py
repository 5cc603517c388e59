"""JSON string grammars with canonical escapes: one encoding per Unicode scalar value.

An unescaped character is any scalar except '"', '\\' and controls; the controls with a short
escape use it (\\b \\t \\n \\f \\r), the other controls use lowercase \\u00xx, and '"' / '\\' use
\\" / \\\\. Because the encoding is injective, a length counts decoded characters exactly and a
key grammar can exclude declared names by their bytes.
"""

from __future__ import annotations

import json

from services.grammar.regex.tree import ebnf_literal

# One canonical JSON string unit (the encoding json.dumps(ensure_ascii=False) produces); surrogate
# code points are excluded explicitly (xgrammar's negated class would otherwise accept their 3-byte
# encodings, which are not UTF-8).
RAW_CLASS = r'[^"\\\x00-\x1f\ud800-\udfff]'
ESCAPES = (r'"\\" ["\\bfnrt]', r'"\\u00" ("0" [0-7bef] | "1" [0-9a-f])')
CHAR_RULE = " | ".join((RAW_CLASS, *ESCAPES))

# The rest of an unbounded JSON string after its opening quote, closing quote included, written as
# a right recursion with a lookahead annotation. Measured on the Qwen3.5 vocabulary: filling a mask
# inside a string costs ~40 us this way and ~125 ms as `char* "\""` (a repetition of a rule with
# alternatives leaves every multi-character token to be checked at run time). The annotation says
# what follows a string inside JSON (whitespace, then , } ] or :); at the root nothing follows, so
# no token can cross the closing quote there and the hint cannot make a mask too strict.
MAX_WHITESPACE = 32  # longest run of insignificant whitespace between JSON tokens
STRING_SUB_RULE = ("(" + " | ".join(['"\\""'] + [f"{u} string_sub" for u in (RAW_CLASS, *ESCAPES)])
                   + f") (= [ \\t\\n\\r]{{0,{MAX_WHITESPACE}}} [,}}\\]:])")

# A string of lo..hi characters (`minLength`/`maxLength`) as a chain of rules, for xgrammar: `t_k`
# is "at most k more characters, then the closing quote", `m_j_d` "exactly j more characters,
# then t_d"; every character's alternatives sit inline in the chain rule, and every chain rule
# ends at the closing quote and carries the string's lookahead annotation. xgrammar precomputes a
# token's mask inside one rule and the rules below it; written as `char{lo,hi}` (a counted
# repetition of a rule with alternatives) every token longer than one character crosses the end
# of `char` and is checked at run time, ~20 ms per mask on SmolLM2's vocabulary and ~0.1 s on
# Qwen3.5's (docs/benchmarks.md, "Bounded strings in framed grammars"). Each chain rule costs one
# precomputed mask per character class (~10 ms compile on SmolLM2, ~45 ms on Qwen3.5): chains
# are shared by every bounded string of a grammar and written up to CHAIN_MAX_LENGTH characters
# and CHAIN_RULE_BUDGET rules per grammar; longer bounds keep the counted repetition.
CHAIN_MAX_LENGTH = 64
CHAIN_RULE_BUDGET = 128
_CHAIN = "strb_"
_UNITS = (RAW_CLASS, *ESCAPES)
_CLOSE_LOOKAHEAD = f"(= [ \\t\\n\\r]{{0,{MAX_WHITESPACE}}} [,}}\\]:])"


def bounded_string_rules(lo: int, hi: int | None, rules: dict[str, str]) -> str | None:
    """The rule for the rest of a JSON string of lo..hi characters after its opening quote
    (closing quote included), its chain added to `rules`; None when the bound is beyond the chain
    limits (the caller writes the counted repetition)."""
    if hi is None or hi > CHAIN_MAX_LENGTH:
        return None
    d = hi - lo
    new = [k for k in range(d + 1) if f"{_CHAIN}t{k}" not in rules]
    new_m = [j for j in range(1, lo + 1) if f"{_CHAIN}m{j}_{d}" not in rules]
    used = sum(1 for name in rules if name.startswith(_CHAIN))
    if used + len(new) + len(new_m) > CHAIN_RULE_BUDGET:
        return None
    for k in new:
        alts = ['"\\""'] + [f"{u} {_CHAIN}t{k - 1}" for u in _UNITS] * (k > 0)
        rules[f"{_CHAIN}t{k}"] = f"({' | '.join(alts)}) {_CLOSE_LOOKAHEAD}"
    for j in new_m:
        below = f"{_CHAIN}m{j - 1}_{d}" if j > 1 else f"{_CHAIN}t{d}"
        rules[f"{_CHAIN}m{j}_{d}"] = f"({' | '.join(f'{u} {below}' for u in _UNITS)}) " \
                                     f"{_CLOSE_LOOKAHEAD}"
    return f"{_CHAIN}m{lo}_{d}" if lo else f"{_CHAIN}t{d}"


_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
# Every escaped unit, for excluding specific units in a key trie.
ESCAPED_UNITS = tuple(sorted(set(_SHORT.values()) | {f"\\u{c:04x}" for c in range(0x20)
                                                       if chr(c) not in _SHORT}))


def unit(ch: str) -> str:
    """The canonical JSON encoding of one character."""
    return json.dumps(ch, ensure_ascii=False)[1:-1]


def literal(text: str) -> str:
    """EBNF for the canonical JSON string (quotes included) of `text`."""
    return ebnf_literal(json.dumps(text, ensure_ascii=False))


def _class_char(ch: str) -> str:
    cp = ord(ch)
    if ch in "\\]^-[":
        return "\\" + ch
    if 0x20 <= cp < 0x7F:
        return ch
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def key_excluding(names: list[str], rule: str) -> dict[str, str]:
    """Rules `rule`, `rule_1`, ... for a JSON string (quotes included) that is none of `names`.

    A trie over canonical units: at each node the next unit either follows a child edge, or is any
    other unit and frees the rest; the closing quote is allowed only where no name ends. The
    escapes that free the rest are one shared rule (`rule_e`) at the nodes whose edges hold no
    escape (written out per node they were ~85% of the grammar of a schema with thousands of
    declared names).
    """
    trie: dict[str, dict] = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(unit(ch), {})
        node["\0end"] = {}
    rules: dict[str, str] = {}
    free = "string_sub"  # any other units, then the closing quote
    escapes = f"{rule}_e"  # an escape, then any other units: the same at every node without one
    counter = [0]

    def build(node: dict) -> str:
        name = f"{rule}_{counter[0]}"
        counter[0] += 1
        alts = [] if "\0end" in node else ['"\\""']
        raw_children = []
        esc_children = set()
        for u, sub in node.items():
            if u == "\0end":
                continue
            alts.append(f"{ebnf_literal(u)} {build(sub)}")
            if u.startswith("\\"):
                esc_children.add(u)
            else:
                raw_children.append(u)
        excluded = "".join(_class_char(c) for c in raw_children)
        alts.append(f'[^"\\\\\\x00-\\x1f\\ud800-\\udfff{excluded}] {free}')
        if not esc_children:  # every escape frees the rest: one rule shared by the trie's nodes
            alts.append(escapes)
        for esc in ESCAPED_UNITS if esc_children else ():
            if esc not in esc_children:
                alts.append(f"{ebnf_literal(esc)} {free}")
        rules[name] = " | ".join(alts)
        return name

    top = build(trie)
    rules[rule] = f'"\\"" {top}'
    rules[escapes] = " | ".join(f"{u} {free}" for u in ESCAPES)
    return rules
