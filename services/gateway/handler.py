"""The generation handler every protocol entry shares: read and translate the body, start the
worker generations (one per choice), then answer with one aggregate response or an SSE stream,
mapping every failure to the protocol's error shape."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from services.gateway.body import parse_body
from services.gateway.choices import Choices, Results
from services.gateway.errors import (
    ErrorPaths,
    GatewayError,
    anthropic_error,
    infernix_error_parts,
    openai_error,
    retry_after,
    status_of,
)
from services.gateway.generation import RequestRecord, constraint_label
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits
from services.gateway.metrics import GatewayMetrics
from services.gateway.sse import open_stream, send
from services.gateway.translate import Translated
from shared.errors import InfernixError, InternalError, ServiceUnavailable, error_from_dict
from shared.generation import Finished, FinishReason, WorkerClient
from shared.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Entry:
    """One generation protocol: how to translate its body and shape its replies."""

    protocol: str  # metrics label: chat, responses, messages, completions
    id_prefix: str  # request id prefix: chatcmpl-, resp_, msg_, cmpl-
    translate: Callable[[dict, str, GatewayLimits, FieldPolicy], Translated]
    error_paths: Callable[[dict], ErrorPaths]
    aggregate: Callable[[Translated, Results, int], dict]
    streamer: Callable[[Translated], Any]
    anthropic: bool = False  # Anthropic error shape

    def new_id(self) -> str:
        return f"{self.id_prefix}{secrets.token_hex(12)}"

    def error_body(self, status: int, message: str, param: str | None, code: str | None) -> dict:
        shape = anthropic_error if self.anthropic else openai_error
        return shape(status, message, param=param, code=code)


@dataclass(frozen=True)
class GatewayState:
    worker: WorkerClient
    api_keys: frozenset[str]
    limits: GatewayLimits
    metrics: GatewayMetrics
    policy: FieldPolicy


STATE = web.AppKey("infernix_gateway", GatewayState)


def error_response(entry: Entry, status: int, message: str, param: str | None,
                    code: str | None, request_id: str | None = None,
                    retry: int | None = None, committed: dict | None = None) -> web.Response:
    headers = {"X-Request-Id": request_id} if request_id else {}
    if retry is not None:
        headers["Retry-After"] = str(retry)
    body = entry.error_body(status, message, param, code)
    if committed is not None:
        body["error"]["committed"] = committed
    return web.json_response(body, status=status, headers=headers or None)


def committed_output(finished: Finished, index: int) -> dict:
    """What a choice that failed while generating had already committed: a stream published it
    before its error event, so the aggregate's 422 carries it too (earlier committed output is
    kept; only the failed round's uncommitted tokens are dropped)."""
    return {"index": index, "content": finished.content, "reasoning": finished.reasoning,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments_json}
                           for c in finished.tool_calls],
            "output_tokens": finished.usage.completion_tokens}


async def read_body(request: web.Request, limits: GatewayLimits) -> dict:
    too_large = GatewayError(413, f"the request body is larger than this gateway's limit "
                             f"max_body_bytes={limits.max_body_bytes}", "request_too_large")
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    return parse_body(raw, limits.max_json_depth)


async def check_model(worker: WorkerClient, model: str) -> None:
    served = await worker.models()
    if model not in served:
        raise GatewayError(404, f"model {model!r} is not served here (serving: "
                           f"{', '.join(served)})", "model_not_found", param="model")


def generation_handler(entry: Entry) -> Callable:
    async def handle(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        record = RequestRecord(entry.new_id(), entry.protocol)
        state.metrics.in_flight.labels(protocol=entry.protocol).inc()
        try:
            return await _generate(request, entry, state, record)
        except asyncio.CancelledError:
            record.outcome = "client_gone"
            raise
        finally:
            state.metrics.in_flight.labels(protocol=entry.protocol).dec()
            record.done(state.metrics)
    return handle


_OUTCOMES = {401: "unauthorized", 413: "too_large", 429: "overloaded", 503: "unavailable"}


def _fail(entry: Entry, record: RequestRecord, status: int, message: str, param: str | None,
          code: str | None, outcome: str, retry: int | None = None,
          committed: dict | None = None) -> web.Response:
    record.status, record.outcome, record.error_type = status, outcome, code
    # Only the field path, never the pointer into the caller's schema (schema text).
    record.error_param = None if param is None else param.split("/", 1)[0]
    return error_response(entry, status, message, param, code, record.request_id, retry,
                          committed)


def _fail_typed(entry: Entry, record: RequestRecord, err: InfernixError, paths: ErrorPaths, *,
                started: bool = False, outcome: str | None = None,
                committed: dict | None = None) -> web.Response:
    status, message, param, code = infernix_error_parts(err, paths, started=started)
    if outcome is None:
        outcome = _OUTCOMES.get(status, "rejected" if status < 500 else "error")
    return _fail(entry, record, status, message, param, code, outcome, retry_after(err, status),
                 committed if status == 422 else None)


async def _generate(request: web.Request, entry: Entry, state: GatewayState,
                    record: RequestRecord) -> web.StreamResponse:
    paths = ErrorPaths()
    choices: Choices | None = None
    try:
        try:
            body = await read_body(request, state.limits)
            paths = entry.error_paths(body)
            tr = entry.translate(body, record.request_id, state.limits, state.policy)
            record.model, record.stream = tr.request.model, tr.stream
            record.constraint_kind = constraint_label(tr.request)
            await check_model(state.worker, tr.request.model)
            choices = Choices(state.worker, tr.requests, tr.per_prompt)
            await choices.start()
        except GatewayError as err:
            return _fail(entry, record, err.status, err.message, err.param, err.code,
                         _OUTCOMES.get(err.status, "rejected"))
        except InfernixError as err:
            if not is_typed(err):
                log.error("request_failed", request_id=record.request_id, exc_info=True)
            return _fail_typed(entry, record, err, paths)
        except Exception as err:  # noqa: BLE001 - a worker or gateway bug: logged, counted, 500
            log.error("request_failed", request_id=record.request_id, exc_info=True)
            return _fail_typed(entry, record, InternalError(str(err)), paths, outcome="error")
        if tr.stream:
            return await _stream(request, entry, tr, choices, record)
        return await _aggregate(entry, tr, choices, record)
    finally:
        if choices is not None:
            record.first_output_at = choices.first_output_at
            await choices.close()


def is_typed(err: InfernixError) -> bool:
    return status_of(err) != 500


def _terminal_error(finished: Finished) -> InfernixError:
    if finished.finish_reason is FinishReason.CANCELLED:
        # A client that cancels is gone; one that sees this was cut by the worker stopping (its
        # drain's grace period ended): a dependency failure it may retry, not an internal error.
        return ServiceUnavailable("the worker stopped before the generation finished (it was "
                                  "shutting down)", service="worker", retry_after_s=1.0)
    if finished.error:
        return error_from_dict(finished.error)
    return InternalError("the worker reported an error without details")


def _failed(finished: list[Finished]) -> Finished | None:
    return next((f for f in finished
                 if f.finish_reason in (FinishReason.ERROR, FinishReason.CANCELLED)), None)


async def _aggregate(entry: Entry, tr: Translated, choices: Choices,
                     record: RequestRecord) -> web.Response:
    try:
        finished = await choices.collect()
    except Exception as err:  # noqa: BLE001 - the worker failed mid-generation
        log.error("worker_failed", request_id=record.request_id, exc_info=True)
        err = err if isinstance(err, InfernixError) else InternalError(str(err))
        return _fail_typed(entry, record, err, tr.paths, started=True)
    results = choices.results(finished)
    record.finished = results.summary()
    failed = _failed(finished)
    if failed is not None:
        outcome = "cancelled" if failed.finish_reason is FinishReason.CANCELLED else None
        return _fail_typed(entry, record, _terminal_error(failed), tr.paths, started=True,
                           outcome=outcome,
                           committed=committed_output(failed, finished.index(failed)))
    record.outcome = results.first.finish_reason.value
    return web.json_response(entry.aggregate(tr, results, int(time.time())),
                             headers={"X-Request-Id": record.request_id})


async def _stream(request: web.Request, entry: Entry, tr: Translated, choices: Choices,
                  record: RequestRecord) -> web.StreamResponse:
    streamer = entry.streamer(tr)
    response = await open_stream(request, record.request_id)
    finished: list[Finished | None] = [None] * len(tr.requests)
    try:
        # the prompt counts as the worker reports them by then (Started, again at admission)
        await send(response, streamer.begin(lambda: choices.counts))
        async for index, event in choices.events():
            if not isinstance(event, Finished):
                await send(response, streamer.event(event, index))
                continue
            finished[index] = event
            if event.finish_reason in (FinishReason.ERROR, FinishReason.CANCELLED):
                record.finished = event
                raise _terminal_error(event)
            await send(response, streamer.choice_done(event, index))
        results = choices.results([f for f in finished if f is not None])
        record.finished = results.summary()
        await send(response, streamer.finish(results))
        record.outcome = results.first.finish_reason.value
    except ConnectionResetError:
        record.outcome = "client_gone"
    except Exception as err:  # noqa: BLE001 - the worker failed mid-stream: terminal error event
        if not isinstance(err, InfernixError):
            log.error("worker_failed", request_id=record.request_id, exc_info=True)
            err = InternalError(str(err))
        status, message, param, code = infernix_error_parts(err, tr.paths, started=True)
        cancelled = record.finished is not None and \
            record.finished.finish_reason is FinishReason.CANCELLED
        record.outcome = "cancelled" if cancelled else "error"
        record.error_type = code
        try:
            await send(response, streamer.fail(entry.error_body(status, message, param, code)))
        except ConnectionResetError:
            record.outcome = "client_gone"
    return response
