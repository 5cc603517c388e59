"""Log-probabilities in the OpenAI protocols: the request fields that ask for them and the reply
shapes (chat and Responses: per-token objects; legacy completions: parallel lists).

The worker reports each content token's log-probability under the distribution it was sampled
from (services/worker/program/logprobs.py; the operator's `--logprobs-mode raw` reports the
model's own), with its alternatives most likely first. A token's `token` is its text; a token
whose bytes are not whole UTF-8 (a piece of a character) is written `bytes:\\xNN...`, and `bytes`
always holds its exact bytes.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from services.gateway import fields as f
from shared.errors import InvalidRequest
from shared.generation import MAX_TOP_LOGPROBS, TokenLogprob, TopLogprob

MAX_COMPLETION_LOGPROBS = 5  # the legacy completions protocol's bound
_FLOOR = -9999.0  # a non-finite value as JSON carries it (JSON has no -Infinity)


def token_text(token: bytes) -> str:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in token)


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _FLOOR


def _alternative(t: TopLogprob | TokenLogprob) -> dict[str, Any]:
    return {"token": token_text(t.token), "logprob": _value(t.logprob), "bytes": list(t.token)}


def content_entries(tokens: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` and Responses' output_text `logprobs`: one object per token."""
    return [{**_alternative(t), "top_logprobs": [_alternative(a) for a in t.top]} for t in tokens]


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """Legacy completions' `logprobs`: tokens, token_logprobs, top_logprobs (a dict per token:
    its alternatives and the token itself) and text_offset (each token's character offset in
    the choice's text, counted from `offset`)."""
    texts = [token_text(t.token) for t in tokens]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    tops = []
    for text, t in zip(texts, tokens):
        top = {token_text(a.token): _value(a.logprob) for a in t.top}
        top.setdefault(text, _value(t.logprob))
        tops.append(top)
    return {"tokens": texts, "token_logprobs": [_value(t.logprob) for t in tokens],
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs` (bool) and `top_logprobs` (0..20, only with logprobs): the alternatives
    per token, or None when not asked. Raises InvalidRequest naming the field."""
    asked = f.get_bool(body, "logprobs", "", default=False)
    top = f.get_int(body, "top_logprobs", "")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}",
                             field="top_logprobs")
    if not asked:
        if top:
            raise InvalidRequest("top_logprobs needs logprobs: true", field="top_logprobs")
        return None
    return top or 0


def completions_logprobs(body: dict) -> int | None:
    """Legacy completions' `logprobs` (0..5 alternatives; null: off)."""
    n = f.get_int(body, "logprobs", "")
    if n is not None and not 0 <= n <= MAX_COMPLETION_LOGPROBS:
        raise InvalidRequest(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {n}",
                             field="logprobs")
    return n


def responses_logprobs(body: dict, included: bool) -> int | None:
    """Responses' `top_logprobs` (0..20) with `include: ["message.output_text.logprobs"]`
    (`included`): either asks for log-probabilities."""
    top = f.get_int(body, "top_logprobs", "")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}",
                             field="top_logprobs")
    if not included and not top:
        return None
    return top or 0
