"""The aiohttp gateway: routes, API-key and size guards, the generation handler that drives a
`WorkerClient` for every protocol, and the service entry point `serve`."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from services.gateway import anthropic_messages, completions, openai_chat, openai_responses
from services.gateway import fields as f
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
from services.gateway.limits import GatewayLimits, key_allowed, presented_keys
from services.gateway.metrics import GatewayMetrics
from services.gateway.sse import open_stream, send
from services.gateway.translate import Translated
from shared.errors import InfernixError, InternalError, error_from_dict
from shared.generation import Finished, FinishReason, WorkerClient
from shared.logging import get_logger
from shared.metrics import render

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


def _entry(protocol: str, prefix: str, module: Any, anthropic: bool = False) -> Entry:
    return Entry(protocol, prefix, module.translate, module.error_paths, module.aggregate,
                 module.Streamer, anthropic)


ENTRIES = {
    "/v1/chat/completions": _entry("chat", "chatcmpl-", openai_chat),
    "/v1/responses": _entry("responses", "resp_", openai_responses),
    "/v1/messages": _entry("messages", "msg_", anthropic_messages, anthropic=True),
    "/v1/completions": _entry("completions", "cmpl-", completions),
}
_OPEN_PATHS = frozenset({"/healthz"})
# aiohttp cancels a handler whose client went away (a non-streaming request stops at the worker
# within a step, as a streaming one does). Every runner of this app passes these options.
RUNNER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}


@dataclass(frozen=True)
class GatewayState:
    worker: WorkerClient
    api_keys: frozenset[str]
    limits: GatewayLimits
    metrics: GatewayMetrics
    policy: FieldPolicy


STATE = web.AppKey("infernix_gateway", GatewayState)


def create_app(worker: WorkerClient, *, api_keys: frozenset[str] = frozenset(),
               limits: GatewayLimits = GatewayLimits(),
               registry: CollectorRegistry | None = None,
               ignore_unknown_fields: bool = False) -> web.Application:
    """The gateway application in front of `worker`; run it with `RUNNER_OPTIONS`.

    `api_keys`: when non-empty every route but /healthz needs `Authorization: Bearer KEY` or
    `x-api-key: KEY` (default: open). `limits`: body, nesting, message, tool, choice and schema
    limits. `registry`: the Prometheus registry for the gateway's metrics (default: a fresh one).
    `ignore_unknown_fields` (default False): accept and ignore request fields no protocol
    documents instead of answering 400 (never those that would change the output; see known.py)."""
    app = web.Application(middlewares=[_guard], client_max_size=limits.max_body_bytes)
    app[STATE] = GatewayState(worker, frozenset(api_keys), limits, GatewayMetrics(registry),
                              FieldPolicy(ignore_unknown_fields))
    for path, entry in ENTRIES.items():
        app.router.add_post(path, _generation_handler(entry))
    app.router.add_post("/v1/messages/count_tokens", _count_tokens)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model_id:.+}", _model)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    return app


def _entry_for(request: web.Request) -> Entry:
    path = request.path
    if path.startswith("/v1/messages") or (path.startswith("/v1/models") and
                                           "anthropic-version" in request.headers):
        return ENTRIES["/v1/messages"]
    return ENTRIES.get(path, ENTRIES["/v1/chat/completions"])


def _error_response(entry: Entry, status: int, message: str, param: str | None,
                    code: str | None, request_id: str | None = None,
                    retry: int | None = None) -> web.Response:
    headers = {"X-Request-Id": request_id} if request_id else {}
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return web.json_response(entry.error_body(status, message, param, code), status=status,
                             headers=headers or None)


@web.middleware
async def _guard(request: web.Request, handler: Callable) -> web.StreamResponse:
    state = request.app[STATE]
    entry = _entry_for(request)
    if request.path not in _OPEN_PATHS and not key_allowed(presented_keys(request.headers),
                                                           state.api_keys):
        if request.path in ENTRIES:
            state.metrics.count(entry.protocol, "unauthorized", "none")
        return _error_response(entry, 401, "a valid API key is required (Authorization: Bearer "
                               "KEY or x-api-key: KEY)", None, "invalid_api_key")
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _error_response(entry, 404, f"no route {request.method} {request.path}", None,
                               "not_found")
    except web.HTTPMethodNotAllowed:
        return _error_response(entry, 405, f"method {request.method} is not allowed on "
                               f"{request.path}", None, "method_not_allowed")


async def _read_body(request: web.Request, limits: GatewayLimits) -> dict:
    too_large = GatewayError(413, f"the request body is larger than this gateway's limit "
                             f"max_body_bytes={limits.max_body_bytes}", "request_too_large")
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    return parse_body(raw, limits.max_json_depth)


async def _check_model(worker: WorkerClient, model: str) -> None:
    served = await worker.models()
    if model not in served:
        raise GatewayError(404, f"model {model!r} is not served here (serving: "
                           f"{', '.join(served)})", "model_not_found", param="model")


def _generation_handler(entry: Entry) -> Callable:
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
          code: str | None, outcome: str, retry: int | None = None) -> web.Response:
    record.status, record.outcome, record.error_type = status, outcome, code
    # Only the field path, never the pointer into the caller's schema (schema text).
    record.error_param = None if param is None else param.split("/", 1)[0]
    return _error_response(entry, status, message, param, code, record.request_id, retry)


def _fail_typed(entry: Entry, record: RequestRecord, err: InfernixError, paths: ErrorPaths, *,
                started: bool = False, outcome: str | None = None) -> web.Response:
    status, message, param, code = infernix_error_parts(err, paths, started=started)
    if outcome is None:
        outcome = _OUTCOMES.get(status, "rejected" if status < 500 else "error")
    return _fail(entry, record, status, message, param, code, outcome, retry_after(err, status))


async def _generate(request: web.Request, entry: Entry, state: GatewayState,
                    record: RequestRecord) -> web.StreamResponse:
    paths = ErrorPaths()
    choices: Choices | None = None
    try:
        try:
            body = await _read_body(request, state.limits)
            paths = entry.error_paths(body)
            tr = entry.translate(body, record.request_id, state.limits, state.policy)
            record.model, record.stream = tr.request.model, tr.stream
            record.constraint_kind = constraint_label(tr.request)
            await _check_model(state.worker, tr.request.model)
            choices = Choices(state.worker, tr.requests, tr.per_prompt)
            await choices.start()
        except GatewayError as err:
            return _fail(entry, record, err.status, err.message, err.param, err.code,
                         _OUTCOMES.get(err.status, "rejected"))
        except InfernixError as err:
            if not _is_typed(err):
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


def _is_typed(err: InfernixError) -> bool:
    return status_of(err) != 500


def _terminal_error(finished: Finished) -> InfernixError:
    if finished.finish_reason is FinishReason.CANCELLED:
        return InternalError("the generation was cancelled before it finished")
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
                           outcome=outcome)
    record.outcome = results.first.finish_reason.value
    return web.json_response(entry.aggregate(tr, results, int(time.time())),
                             headers={"X-Request-Id": record.request_id})


async def _stream(request: web.Request, entry: Entry, tr: Translated, choices: Choices,
                  record: RequestRecord) -> web.StreamResponse:
    streamer = entry.streamer(tr)
    response = await open_stream(request, record.request_id)
    finished: list[Finished | None] = [None] * len(tr.requests)
    try:
        await send(response, streamer.begin(choices.counts))
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


async def _count_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE]
    entry = ENTRIES["/v1/messages"]
    paths = ErrorPaths()
    try:
        body = await _read_body(request, state.limits)
        paths = anthropic_messages.error_paths(body)
        model = f.get_str(body, "model", "", required=True)
        prompt, _ = anthropic_messages.prompt_input(body, state.limits, state.policy)
        await _check_model(state.worker, model)
        count = await state.worker.count_tokens(prompt, model)
    except GatewayError as err:
        return _error_response(entry, err.status, err.message, err.param, err.code)
    except InfernixError as err:
        if not _is_typed(err):
            log.error("count_tokens_failed", exc_info=True)
        status, message, param, code = infernix_error_parts(err, paths)
        return _error_response(entry, status, message, param, code,
                               retry=retry_after(err, status))
    return web.json_response({"input_tokens": count})


def _model_object(name: str) -> dict[str, Any]:
    """One model as both SDKs read it: OpenAI's `{id, object, created, owned_by}` and
    Anthropic's `{id, type, display_name, created_at}`."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "infernix",
            "type": "model", "display_name": name, "created_at": "1970-01-01T00:00:00Z"}


async def _models(request: web.Request) -> web.Response:
    """One list both SDKs read: OpenAI's `{object: list, data}` and Anthropic's paging fields."""
    names = await request.app[STATE].worker.models()
    return web.json_response({"object": "list", "data": [_model_object(n) for n in names],
                              "has_more": False,
                              "first_id": names[0] if names else None,
                              "last_id": names[-1] if names else None})


async def _model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: the model object, or 404 in the caller's protocol shape."""
    name = request.match_info["model_id"]
    names = await request.app[STATE].worker.models()
    if name not in names:
        return _error_response(_entry_for(request), 404, f"model {name!r} is not served here "
                               f"(serving: {', '.join(names)})", "model", "model_not_found")
    return web.json_response(_model_object(name))


async def _healthz(request: web.Request) -> web.Response:
    try:
        health = await request.app[STATE].worker.health()
    except Exception as err:  # noqa: BLE001 - unhealthy is an answer, not a crash
        return web.json_response({"status": "unavailable", "error": type(err).__name__}, status=503)
    return web.json_response({"status": "ok", "worker": health})


async def _metrics(request: web.Request) -> web.Response:
    body = render(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(*, host: str, port: int, worker: WorkerClient,
                api_keys: frozenset[str] = frozenset(), limits: GatewayLimits = GatewayLimits(),
                registry: CollectorRegistry | None = None,
                ignore_unknown_fields: bool = False) -> None:
    """Serve the gateway until SIGTERM/SIGINT: the first signal stops accepting and lets running
    requests finish (up to 30 s), a second one exits at once. `ignore_unknown_fields`: see
    `create_app` (the CLI's `--ignore-unknown-fields`). Logging is configured by the caller
    (`shared.logging.configure_logging`)."""
    runner = web.AppRunner(create_app(worker, api_keys=api_keys, limits=limits,
                                      registry=registry,
                                      ignore_unknown_fields=ignore_unknown_fields),
                           shutdown_timeout=30.0, **RUNNER_OPTIONS)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("gateway_listening", host=host, port=port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            raise SystemExit(128 + signum)
        log.info("gateway_stopping", signal=signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
