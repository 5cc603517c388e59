"""OpenAI (legacy) Completions: `POST /v1/completions`, a raw text continuation. The
`structured_outputs` extension constrains all new text."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from services.gateway import fields as f
from services.gateway import known
from services.gateway.choices import Results, choice_requests
from services.gateway.errors import ErrorPaths
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits
from services.gateway.logprobs import completion_logprobs, completions_logprobs
from services.gateway.openai_chat import openai_sampling, usage
from services.gateway.sse import DONE, SSE
from services.gateway.translate import (
    Translated,
    choice_count,
    structured_outputs,
    structured_outputs_key,
)
from shared.generation import (
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    TextDelta,
    TokenLogprobs,
)

DEFAULT_MAX_TOKENS = 16  # the protocol's documented default
FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
          FinishReason.TOOL_CALLS: "stop"}


def error_paths(body: dict) -> ErrorPaths:
    key = structured_outputs_key(body)
    constraint = f"structured_outputs.{key}" if key else None
    return ErrorPaths(constraint=constraint,
                      aliases={"constraint": constraint or "structured_outputs"})


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ids(value: list, path: str) -> PromptInput:
    for j, token in enumerate(value):
        if not _is_id(token):
            raise f.wrong_type(f"{path}[{j}]", "a token id (an integer)", token)
    return PromptInput(token_ids=tuple(value), source=path)


def _prompts(body: dict, limits: GatewayLimits) -> tuple[PromptInput, ...]:
    """The protocol's four prompt shapes: a string, a non-empty list of strings, a list of token
    ids, or a non-empty list of token-id lists (raw ids are continued as they are, like text;
    the worker checks them against the vocabulary)."""
    value = f.get(body, "prompt", "", required=True)
    expected = "a string, an array of strings, an array of token ids or an array of such arrays"
    if isinstance(value, str):
        return (PromptInput(text=value),)
    if not isinstance(value, list) or not value:
        raise f.wrong_type("prompt", expected, value)
    if _is_id(value[0]):
        return (_ids(value, "prompt"),)
    prompts: list[PromptInput] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            prompts.append(PromptInput(text=item))
        elif isinstance(item, list) and item:
            prompts.append(_ids(item, f"prompt[{i}]"))
        else:
            raise f.wrong_type(f"prompt[{i}]", "a string or a non-empty array of token ids", item)
    limits.check_choices(len(prompts), "prompt")  # one choice per prompt at least
    return tuple(prompts)


def translate(body: dict, request_id: str, limits: GatewayLimits,
              policy: FieldPolicy = FieldPolicy()) -> Translated:
    """Completions body -> one GenerateRequest per choice (each prompt times `n`, in the
    protocol's order: prompt-major). Raises typed RequestErrors naming the field."""
    policy.check(body, "", known.COMPLETIONS)
    model = f.get_str(body, "model", "", required=True)
    prompts = _prompts(body, limits)
    n = choice_count(body, limits, len(prompts))
    options = RequestOptions(
        max_tokens=f.get_int(body, "max_tokens", "", default=DEFAULT_MAX_TOKENS),
        sampling=openai_sampling(body), constraint=structured_outputs(body, limits),
        stop=f.stop_strings(body, "stop", ""), logprobs=completions_logprobs(body))
    stream = f.get_bool(body, "stream", "", default=False)
    stream_options = f.get_dict(body, "stream_options", "") or {}
    policy.check(stream_options, "stream_options", known.CHAT_STREAM_OPTIONS)
    include_usage = f.get_bool(stream_options, "include_usage", "stream_options", default=False)
    requests: tuple[GenerateRequest, ...] = ()
    for p, prompt in enumerate(prompts):
        base = GenerateRequest(request_id, prompt, options, model)
        if p:
            base = dataclasses.replace(base, request_id=f"{request_id}-p{p}")
        requests += choice_requests(base, n)
    return Translated(requests, error_paths(body), stream=stream, include_usage=include_usage,
                      per_prompt=n)


def aggregate(tr: Translated, results: Results, created: int) -> dict[str, Any]:
    """The text_completion object of finished generations (choice i: prompt i // n)."""
    return {"id": tr.request.request_id, "object": "text_completion", "created": created,
            "model": tr.request.model,
            "choices": [{"index": i, "text": fin.content,
                         "logprobs": None if fin.logprobs is None
                         else completion_logprobs(fin.logprobs),
                         "finish_reason": FINISH[fin.finish_reason],
                         "infernix": {"constraint": fin.constraint}}
                        for i, fin in enumerate(results.finished)],
            "usage": usage(results), "infernix": {"constraint": results.first.constraint}}


class Streamer:
    """text_completion chunks: text deltas (with their choice index), each choice's finish
    chunk (with its constraint report), an optional usage chunk, then [DONE]. Log-probability
    entries ride on the next text chunk of their choice, the rest on its finish chunk; their
    text offsets count from the start of the choice's tokens, as the aggregate reply's."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.created = int(time.time())
        self._held: dict[int, list] = {}  # choice index -> entries not yet sent
        self._offset: dict[int, int] = {}  # choice index -> text offset of the next entry

    def _chunk(self, text: str | None, index: int = 0, finish: str | None = None,
               **extra: Any) -> SSE:
        logprobs = None
        held = self._held.pop(index, None) if text or finish is not None else None
        if held:
            logprobs = completion_logprobs(held, self._offset.get(index, 0))
            self._offset[index] = self._offset.get(index, 0) + sum(map(len, logprobs["tokens"]))
        choices = [] if text is None else [
            {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]
        return SSE({"id": self.tr.request.request_id, "object": "text_completion",
                    "created": self.created, "model": self.tr.request.model, "choices": choices,
                    **extra})

    def begin(self, counts: Any = None) -> list[SSE]:
        return []

    def event(self, event: Any, index: int = 0) -> list[SSE]:
        if isinstance(event, TokenLogprobs):
            self._held.setdefault(index, []).extend(event.tokens)
            return []
        if isinstance(event, TextDelta) and event.text:
            return [self._chunk(event.text, index)]
        return []

    def choice_done(self, finished: Finished, index: int = 0) -> list[SSE]:
        return [self._chunk("", index, FINISH[finished.finish_reason],
                            infernix={"constraint": finished.constraint})]

    def finish(self, results: Results) -> list[SSE]:
        out = [self._chunk(None, usage=usage(results))] if self.tr.include_usage else []
        return out + [DONE]

    def fail(self, error_body: dict) -> list[SSE]:
        return [SSE(error_body), DONE]
