"""OpenAI (legacy) Completions: `POST /v1/completions`, a raw text continuation. The
`structured_outputs` extension constrains all new text."""

from __future__ import annotations

import time
from typing import Any

from services.gateway import fields as f
from services.gateway.errors import ErrorPaths
from services.gateway.limits import GatewayLimits
from services.gateway.sse import DONE, SSE
from services.gateway.translate import Translated, structured_outputs, structured_outputs_key
from shared.errors import Unsupported
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    TextDelta,
)

DEFAULT_MAX_TOKENS = 16  # the protocol's documented default
FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
          FinishReason.TOOL_CALLS: "stop"}


def error_paths(body: dict) -> ErrorPaths:
    key = structured_outputs_key(body)
    constraint = f"structured_outputs.{key}" if key else None
    return ErrorPaths(constraint=constraint,
                      aliases={"constraint": constraint or "structured_outputs"})


def _prompt(body: dict) -> str:
    value = f.get(body, "prompt", "", required=True)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if not isinstance(value, str):
        raise Unsupported("prompt must be one string (batched or token-id prompts are not "
                          "supported)", field="prompt")
    return value


def translate(body: dict, request_id: str, limits: GatewayLimits) -> Translated:
    """Completions body -> GenerateRequest. Raises typed RequestErrors naming the field."""
    model = f.get_str(body, "model", "", required=True)
    n = f.get_int(body, "n", "", default=1)
    if n != 1:
        raise Unsupported(f"n must be 1 (one choice per request), got {n}", field="n")
    f.reject_unless(not f.get_bool(body, "echo", "", default=False), "echo", "echo is not supported")
    f.reject_unless(f.get(body, "logprobs", "") is f.MISSING, "logprobs",
                    "logprobs are not supported")
    f.reject_unless(f.get(body, "suffix", "") is f.MISSING, "suffix", "suffix is not supported")
    best_of = f.get_int(body, "best_of", "", default=1)
    f.reject_unless(best_of == 1, "best_of", f"best_of must be 1, got {best_of}")
    sampling = SamplingParams(
        temperature=f.get_number(body, "temperature", "", default=1.0),
        top_p=f.get_number(body, "top_p", "", default=1.0),
        seed=f.get_int(body, "seed", ""),
        presence_penalty=f.get_number(body, "presence_penalty", "", default=0.0),
        frequency_penalty=f.get_number(body, "frequency_penalty", "", default=0.0),
    )
    options = RequestOptions(
        max_tokens=f.get_int(body, "max_tokens", "", default=DEFAULT_MAX_TOKENS),
        sampling=sampling, constraint=structured_outputs(body, limits),
        stop=f.stop_strings(body, "stop", ""))
    stream = f.get_bool(body, "stream", "", default=False)
    stream_options = f.get_dict(body, "stream_options", "") or {}
    include_usage = f.get_bool(stream_options, "include_usage", "stream_options", default=False)
    request = GenerateRequest(request_id, PromptInput(text=_prompt(body)), options, model)
    return Translated(request, error_paths(body), stream=stream, include_usage=include_usage)


def _usage(finished: Finished) -> dict[str, int]:
    u = finished.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def aggregate(tr: Translated, finished: Finished, created: int) -> dict[str, Any]:
    """The text_completion object of a finished generation."""
    return {"id": tr.request.request_id, "object": "text_completion", "created": created,
            "model": tr.request.model,
            "choices": [{"index": 0, "text": finished.content, "logprobs": None,
                         "finish_reason": FINISH[finished.finish_reason]}],
            "usage": _usage(finished), "infernix": {"constraint": finished.constraint}}


class Streamer:
    """text_completion chunks: text deltas, the finish chunk (with the constraint report), an
    optional usage chunk, then [DONE]."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.created = int(time.time())

    def _chunk(self, text: str | None, finish: str | None = None, **extra: Any) -> SSE:
        choices = [] if text is None else [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        return SSE({"id": self.tr.request.request_id, "object": "text_completion",
                    "created": self.created, "model": self.tr.request.model, "choices": choices,
                    **extra})

    def begin(self) -> list[SSE]:
        return []

    def event(self, event: Any) -> list[SSE]:
        if isinstance(event, TextDelta) and event.text:
            return [self._chunk(event.text)]
        return []

    def finish(self, finished: Finished) -> list[SSE]:
        out = [self._chunk("", FINISH[finished.finish_reason],
                           infernix={"constraint": finished.constraint})]
        if self.tr.include_usage:
            out.append(self._chunk(None, usage=_usage(finished)))
        return out + [DONE]

    def fail(self, error_body: dict) -> list[SSE]:
        return [SSE(error_body), DONE]
