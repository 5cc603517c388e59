"""Walking a compiled constraint with a matcher: whole-output acceptance and random legal walks.

Used by the CLI (`grammar check --instances`, `grammar sample`), the benchmark and the tests. These
are the same matcher operations the worker performs per token, run on the CPU, through the engine
interface (`engines/engine.py`); a bare xgrammar `CompiledGrammar` is accepted too (tests
compile some directly).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import xgrammar as xgr

from services.grammar.engines.engine import CompiledConstraint, Matcher
from services.grammar.json_text import repeats_a_name
from shared.frontends.token_domain import TokenDomain

# annotation only: the companion reads schemas, whose emitters import engines/
if TYPE_CHECKING:
    from services.grammar.json_lengths import JsonLengthConstraint
    from services.grammar.json_names import JsonNameConstraint
    from services.grammar.unique_items import UniqueItemsConstraint


def _matcher(compiled: CompiledConstraint | xgr.CompiledGrammar, domain: TokenDomain | None,
             ) -> Matcher:
    if isinstance(compiled, CompiledConstraint):
        return compiled.matcher()
    from services.grammar.engines.engine_xgrammar import XgrammarConstraint

    if domain is None:
        raise TypeError("a bare xgrammar CompiledGrammar needs its token domain")
    return XgrammarConstraint(compiled, domain).matcher()


def accepts(compiled: CompiledConstraint | xgr.CompiledGrammar, output: str | bytes,
            domain: TokenDomain | None = None, *, unique_names: bool = False,
            lengths: JsonLengthConstraint | None = None) -> bool:
    """True when `output` is a complete output of the language (EOS would be legal after it).
    `unique_names`: the output runs with the JSON name companion (json_names.json_names_for),
    so a JSON text that repeats a member name in one object is not an output. `lengths`: a fresh
    JSON length companion of the output (json_lengths.json_lengths_for): a string that leaves
    its counted bounds makes the text no output."""
    data = output.encode("utf-8") if isinstance(output, str) else output
    if unique_names and repeats_a_name(data):
        return False
    if lengths is not None and lengths.after_bytes(data) is None:
        return False
    if not isinstance(compiled, CompiledConstraint):  # a bare xgrammar grammar (tests)
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
        if data and not matcher.accept_string(data):
            return False
        return matcher.is_completed()
    m = compiled.matcher()
    return m.accept_bytes(data) and m.is_completed()


def legal_ids(mask_row: Any, size: int) -> list[int]:
    """Token ids whose bit is set in one packed mask row (bit i of word w = token 32w+i)."""
    words = np.ascontiguousarray(np.asarray(mask_row), dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:size]
    return np.flatnonzero(bits).tolist()


@dataclass(frozen=True)
class Walk:
    text: str  # decoded with replacement only for display; `data` holds the exact bytes
    data: bytes
    completed: bool  # ended by EOS where the language may end
    tokens: int
    dead_end: bool = False


def random_walk(
    compiled: CompiledConstraint | xgr.CompiledGrammar,
    domain: TokenDomain,
    rng: random.Random,
    *,
    max_tokens: int = 256,
    end_bias: float = 0.5,
    names: JsonNameConstraint | None = None,
    items: UniqueItemsConstraint | None = None,
    lengths: JsonLengthConstraint | None = None,
) -> Walk:
    """Pick uniformly random legal tokens until EOS or `max_tokens`.

    End bias: when EOS is legal, it is taken with probability `end_bias` before a uniform draw over
    the other legal tokens (a uniform draw alone almost never ends a JSON walk, and always ending at
    the first chance would only ever produce the shortest outputs). `names`: the JSON name
    companion of the output (json_names.json_names_for), applied to every mask and token; `items`
    the unique-items companion (unique_items.unique_items_for) and `lengths` the JSON length
    companion (json_lengths.json_lengths_for), the same way.
    """
    matcher = _matcher(compiled, domain)
    mask = np.zeros((1, domain.mask_words), dtype=np.int32)
    eos_ids = domain.eos_ids
    data = bytearray()
    for step in range(max_tokens):
        matcher.fill_mask(mask, 0)
        if lengths is not None:
            lengths.apply(mask[0])
        if names is not None:
            names.apply(mask[0], matcher)
        if items is not None:
            items.apply(mask[0], matcher)
        ids = legal_ids(mask[0], domain.size)
        if not ids:
            return Walk(data.decode("utf-8", "replace"), bytes(data), False, step, dead_end=True)
        eos = [i for i in ids if i in eos_ids] if eos_ids else []
        other = [i for i in ids if i not in eos_ids] if eos else ids
        if eos and (not other or rng.random() < end_bias):
            ok = matcher.accept_token(eos[0])
            assert ok, "a legal EOS was refused"
            return Walk(data.decode("utf-8", "replace"), bytes(data), True, step + 1)
        token = rng.choice(other)
        ok = matcher.accept_token(token)
        assert ok, f"legal token {token} was refused"
        if lengths is not None:
            ok = lengths.accept(token)
            assert ok, f"legal token {token} was refused by its lengths"
        if names is not None:
            names.accept(token)
        if items is not None:
            items.accept(token)
        data += domain.token_bytes[token]
    return Walk(data.decode("utf-8", "replace"), bytes(data), False, max_tokens)
