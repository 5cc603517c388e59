"""The aiohttp gateway: routes, the API-key guard, the model and health endpoints, and the
service entry point `serve` (the generation handler lives in handler.py)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from services.gateway import anthropic_messages, completions, openai_chat, openai_responses
from services.gateway import fields as f
from services.gateway.errors import ErrorPaths, GatewayError, infernix_error_parts, retry_after
from services.gateway.handler import (
    STATE,
    Entry,
    GatewayState,
    check_model,
    error_response,
    generation_handler,
    is_typed,
    read_body,
)
from services.gateway.known import FieldPolicy
from services.gateway.limits import GatewayLimits, key_allowed, presented_keys
from services.gateway.metrics import GatewayMetrics
from shared.errors import InfernixError
from shared.generation import WorkerClient
from shared.logging import get_logger
from shared.metrics import render

log = get_logger(__name__)


def _entry(protocol: str, prefix: str, module: Any, anthropic: bool = False) -> Entry:
    return Entry(protocol, prefix, module.translate, module.error_paths, module.aggregate,
                 module.Streamer, anthropic)


ENTRIES = {
    "/v1/chat/completions": _entry("chat", "chatcmpl-", openai_chat),
    "/v1/responses": _entry("responses", "resp_", openai_responses),
    "/v1/messages": _entry("messages", "msg_", anthropic_messages, anthropic=True),
    "/v1/completions": _entry("completions", "cmpl-", completions),
}
_OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# aiohttp cancels a handler whose client went away (a non-streaming request stops at the worker
# within a step, as a streaming one does). Every runner of this app passes these options.
RUNNER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}


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
        app.router.add_post(path, generation_handler(entry))
    app.router.add_post("/v1/messages/count_tokens", _count_tokens)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model_id:.+}", _model)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


def _entry_for(request: web.Request) -> Entry:
    path = request.path
    if path.startswith("/v1/messages") or (path.startswith("/v1/models") and
                                           "anthropic-version" in request.headers):
        return ENTRIES["/v1/messages"]
    return ENTRIES.get(path, ENTRIES["/v1/chat/completions"])


@web.middleware
async def _guard(request: web.Request, handler: Callable) -> web.StreamResponse:
    state = request.app[STATE]
    entry = _entry_for(request)
    if request.path not in _OPEN_PATHS and not key_allowed(presented_keys(request.headers),
                                                           state.api_keys):
        if request.path in ENTRIES:
            state.metrics.count(entry.protocol, "unauthorized", "none")
        return error_response(entry, 401, "a valid API key is required (Authorization: Bearer "
                               "KEY or x-api-key: KEY)", None, "invalid_api_key")
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(entry, 404, f"no route {request.method} {request.path}", None,
                               "not_found")
    except web.HTTPMethodNotAllowed:
        return error_response(entry, 405, f"method {request.method} is not allowed on "
                               f"{request.path}", None, "method_not_allowed")


async def _count_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE]
    entry = ENTRIES["/v1/messages"]
    paths = ErrorPaths()
    try:
        body = await read_body(request, state.limits)
        paths = anthropic_messages.error_paths(body)
        model = f.get_str(body, "model", "", required=True)
        prompt, _ = anthropic_messages.prompt_input(body, state.limits, state.policy)
        await check_model(state.worker, model)
        count = await state.worker.count_tokens(prompt, model)
    except GatewayError as err:
        return error_response(entry, err.status, err.message, err.param, err.code)
    except InfernixError as err:
        if not is_typed(err):
            log.error("count_tokens_failed", exc_info=True)
        status, message, param, code = infernix_error_parts(err, paths)
        return error_response(entry, status, message, param, code,
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
        return error_response(_entry_for(request), 404, f"model {name!r} is not served here "
                               f"(serving: {', '.join(names)})", "model", "model_not_found")
    return web.json_response(_model_object(name))


async def _worker_health(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        return await request.app[STATE].worker.health()
    except Exception as err:  # noqa: BLE001 - unhealthy is an answer, not a crash
        return web.json_response({"status": "unavailable", "error": type(err).__name__}, status=503)


def _degraded(health: dict[str, Any]) -> bool:
    """The worker's (or the pool's) own `degraded`: a dependency missing, a pool's worker out."""
    return bool(health.get("degraded"))


async def _healthz(request: web.Request) -> web.Response:
    """Liveness: 200 while requests are served, with `degraded` when a dependency is missing
    (the grammar service or Redis down, a pool's worker out); 503 only when nothing serves, and
    while the worker still warms up (its kernels compile before the first request is served)."""
    health = await _worker_health(request)
    if isinstance(health, web.Response):
        return health
    if health.get("status") == "warming":
        return web.json_response({"status": "warming", "worker": health}, status=503)
    return web.json_response({"status": "ok", "degraded": _degraded(health), "worker": health})


async def _readyz(request: web.Request) -> web.Response:
    """Readiness: 200 when constrained and plain requests can be served now, else 503 naming
    what is missing."""
    health = await _worker_health(request)
    if isinstance(health, web.Response):
        return health
    ready = health.get("ready", True)
    body = {"status": "ready" if ready else "not_ready", "missing": health.get("missing", []),
            "degraded": _degraded(health)}
    return web.json_response(body, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = render(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(*, host: str, port: int, worker: WorkerClient,
                api_keys: frozenset[str] = frozenset(), limits: GatewayLimits = GatewayLimits(),
                registry: CollectorRegistry | None = None,
                ignore_unknown_fields: bool = False,
                on_ready: Callable[[], None] | None = None,
                drain_seconds: float = 30.0) -> None:
    """Serve the gateway until SIGTERM/SIGINT: the first signal stops accepting and lets running
    requests finish (up to `drain_seconds`), a second one exits at once.
    `ignore_unknown_fields`: see
    `create_app` (the CLI's `--ignore-unknown-fields`). `on_ready()` runs once the socket listens.
    Logging is configured by the caller (`shared.logging.configure_logging`)."""
    runner = web.AppRunner(create_app(worker, api_keys=api_keys, limits=limits,
                                      registry=registry,
                                      ignore_unknown_fields=ignore_unknown_fields),
                           shutdown_timeout=drain_seconds, **RUNNER_OPTIONS)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("gateway_listening", host=host, port=port)
    if on_ready is not None:
        on_ready()
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
