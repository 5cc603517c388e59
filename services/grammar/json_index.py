"""JsonNameIndex: the tokens of a vocabulary that can touch a JSON member name, by what they
spell around their quotes, commas and escapes (the candidates `json_names.JsonNameConstraint`
simulates in each mask; every other token cannot complete or approach a used name)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shared.frontends.token_domain import TokenDomain

WS_BYTES = b" \n\t\r"


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
    domain.byte_token_ids  # the probes' single-byte tokens: a pass over the vocabulary, paid here
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
        stripped = data.rstrip(WS_BYTES)
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
