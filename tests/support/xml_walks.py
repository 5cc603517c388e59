"""Test helpers for the Qwen3.5 output framings: biased random walks through a real xgrammar
matcher's masks (with the ParameterNameConstraint companion applied to every mask), and an
independent reader of the XML tool format written from the template's layout (not the production
decoder), to judge what the walks produce."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache

import torch
import xgrammar as xgr

from services.grammar.tools.param_names import NameIndex, ParameterNameConstraint
from shared.frontends.token_domain import TokenDomain

FRAMING_BYTES = frozenset(b"\n</>=")


@dataclass
class Walk:
    tokens: list[int]
    completed: bool  # ended by EOS


SCRIPTS = (b"\n</parameter>\n", b"</function>\n")


@lru_cache(maxsize=4)
def _tables(domain: TokenDomain) -> tuple[torch.Tensor, dict[bytes, int]]:
    """Per domain: which ids start with a framing byte, and ordinary bytes -> smallest id."""
    framing = [False] * domain.size
    by_bytes: dict[bytes, int] = {}
    for i, b in enumerate(domain.token_bytes):
        if not domain.is_ordinary(i):
            continue
        framing[i] = bool(b) and b[0] in FRAMING_BYTES
        by_bytes.setdefault(b, i)
    return torch.tensor(framing, dtype=torch.bool), by_bytes


def _legal(mask: torch.Tensor, size: int) -> torch.Tensor:
    """[V] bool: the legal ids of a packed mask row."""
    words = mask.to(torch.int64) & 0xFFFFFFFF
    return (((words.unsqueeze(-1) >> torch.arange(32)) & 1).flatten()[:size]).bool()


def walk(compiled: xgr.CompiledGrammar, domain: TokenDomain, rng: random.Random, *,
         max_tokens: int = 400, end_bias: float = 0.3, names: bool = False,
         prefer: frozenset[int] = frozenset(), prefer_weight: float = 0.4,
         scripts: tuple[bytes, ...] = SCRIPTS, script_rate: float = 0.06) -> Walk:
    """A random legal walk. EOS is taken with probability `end_bias` where legal; otherwise with
    probability `prefer_weight` a legal token from `prefer` (control tokens, framing merges;
    control tokens ten times as likely), else mostly a token starting with a framing byte, else
    any legal token. With probability `script_rate` per step the walk tries to write one of
    `scripts` (closing framing), longest legal token first, dropping it where the grammar does not
    allow it. `names`: apply the ParameterNameConstraint companion to every mask and accept
    through it. Vectorised over the mask, so the real 248k vocabulary walks quickly."""
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, domain.size)
    companion = None
    if names:
        companion = ParameterNameConstraint(NameIndex.of(domain), domain.special_id("<tool_call>"),
                                            domain.special_id("</tool_call>"))
    framing_ids, by_bytes = _tables(domain)
    eos_ids = sorted(domain.eos_ids)
    tokens: list[int] = []
    script = b""

    def take(token: int) -> None:
        assert matcher.accept_token(token), token
        if companion is not None:
            companion.accept(token)
        tokens.append(token)

    for _ in range(max_tokens):
        matcher.fill_next_token_bitmask(mask)
        if companion is not None:
            companion.apply(mask[0])
        legal = _legal(mask[0], domain.size)
        eos = [i for i in eos_ids if legal[i]]
        legal[eos_ids] = False
        other = torch.nonzero(legal).flatten()
        assert eos or len(other), f"dead end after {tokens}"
        if eos and (not len(other) or rng.random() < end_bias):
            assert matcher.accept_token(eos[0])
            return Walk(tokens, True)
        if not script and rng.random() < script_rate:
            script = rng.choice(scripts)
        steps = [by_bytes[script[:k]] for k in range(len(script), 0, -1)
                 if script[:k] in by_bytes and legal[by_bytes[script[:k]]]] if script else []
        if steps:
            script = script[len(domain.token_bytes[steps[0]]):]
            take(steps[0])
            continue
        script = b""
        preferred = [i for i in sorted(prefer) if i < domain.size and legal[i]]
        r = rng.random()
        framing = torch.nonzero(legal & framing_ids).flatten()
        if preferred and r < prefer_weight:
            weights = [10 if i in domain.control_ids else 1 for i in preferred]
            take(rng.choices(preferred, weights)[0])
        elif len(framing) and r < prefer_weight + (1 - prefer_weight) * 0.6:
            take(int(framing[rng.randrange(len(framing))]))
        else:
            take(int(other[rng.randrange(len(other))]))
    return Walk(tokens, False)


def segments(tokens: list[int], domain: TokenDomain) -> list[tuple[str, bytes]]:
    """("text", bytes) runs between control tokens and ("ctl", spelling bytes) per control token."""
    out: list[tuple[str, bytes]] = []
    for t in tokens:
        if t in domain.control_ids:
            out.append(("ctl", domain.token_bytes[t]))
        elif out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + domain.token_bytes[t])
        else:
            out.append(("text", domain.token_bytes[t]))
    return out


@dataclass
class Parsed:
    reasoning: bytes | None  # None: no thinking framing
    content: str  # text before the first call (or the JSON content)
    calls: list[tuple[str, list[tuple[str, str]]]]  # (name, [(param, value text)])


_CALL = re.compile(r"\n<function=([^>\n]+)>\n((?:<parameter=[^>\n\r]+>\n.*?\n</parameter>\n)*)"
                   r"</function>\n", re.S)
_PARAM = re.compile(r"<parameter=([^>\n\r]+)>\n(.*?)\n</parameter>\n", re.S)


def parse(tokens: list[int], domain: TokenDomain, *, thinking: bool) -> Parsed:
    """Read a complete output of the framing independently; raises AssertionError when it is not
    in the format (reasoning, then `</think>` and exactly `\\n\\n`, or at once a call opened
    inside the think block; text; calls opened and closed by their control tokens, one newline
    between calls, nothing after the last)."""
    segs = segments(tokens, domain)
    reasoning = None
    if thinking:  # up to `</think>` and its separator, or up to a call opened inside the think
        at = next(i for i, (k, _) in enumerate(segs) if k == "ctl")
        assert segs[at] in (("ctl", b"</think>"), ("ctl", b"<tool_call>")), segs[at]
        reasoning = b"".join(b for _, b in segs[:at])
        if segs[at] == ("ctl", b"</think>"):
            segs = segs[at + 1:]
            assert segs and segs[0][0] == "text" and segs[0][1].startswith(b"\n\n"), segs[:1]
            rest = segs[0][1][2:]
            segs = ([("text", rest)] if rest else []) + segs[1:]
        else:
            segs = segs[at:]
    content = b""
    if segs and segs[0][0] == "text":
        content, segs = segs[0][1], segs[1:]
    calls = []
    i = 0
    while i < len(segs):
        assert segs[i] == ("ctl", b"<tool_call>"), segs[i]
        assert segs[i + 1][0] == "text" and segs[i + 2] == ("ctl", b"</tool_call>"), segs[i:i + 3]
        body = segs[i + 1][1].decode("utf-8")
        m = _CALL.fullmatch(body)
        assert m, body
        params = [(p.group(1), p.group(2)) for p in _PARAM.finditer(m.group(2))]
        assert "".join(p.group(0) for p in _PARAM.finditer(m.group(2))) == m.group(2)
        calls.append((m.group(1), params))
        i += 3
        if i < len(segs):
            assert segs[i] == ("text", b"\n"), segs[i]
            i += 1
    return Parsed(reasoning, content.decode("utf-8"), calls)


def decode_arguments(params: list[tuple[str, str]], schema: dict) -> dict:
    """Strict values read by the schema: a parameter declared `type: string`, or whose enum
    values are all strings, is its raw text; every other is JSON text."""
    props = schema.get("properties", {})
    out = {}
    for name, text in params:
        prop = props.get(name, {})
        enum = prop.get("enum")
        raw = prop.get("type") == "string" or (enum is not None and
                                                all(isinstance(v, str) for v in enum))
        out[name] = text if raw else json.loads(text)
    return out
