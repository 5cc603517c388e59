"""Prometheus metrics of the gateway, on an explicit registry (one per app unless given)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PROTOCOLS = ("chat", "responses", "messages", "completions")
# Fixed outcome label values: a finish reason, or how the request failed.
OUTCOMES = ("stop", "length", "tool_calls", "cancelled", "error", "rejected", "unauthorized",
            "too_large", "client_gone", "overloaded", "unavailable")
# Fixed constraint label values: the content constraint kind, "tools", or "none".
CONSTRAINTS = ("none", "grammar", "json_object", "json_schema", "choice", "regex", "tools")

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    """Requests by protocol and outcome, latency, time to first token, tokens and in-flight."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "infernix_gateway_requests_total",
            "Requests by protocol, outcome (finish reason or failure) and constraint kind",
            ["protocol", "outcome", "constraint"], registry=self.registry)
        self.request_seconds = Histogram(
            "infernix_gateway_request_seconds", "Wall time from request arrival to the last byte",
            ["protocol"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttft_seconds = Histogram(
            "infernix_gateway_ttft_seconds",
            "Wall time from request arrival to the first output event",
            ["protocol"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "infernix_gateway_tokens_total", "Prompt and completion tokens of finished requests",
            ["protocol", "kind"], registry=self.registry)
        self.in_flight = Gauge(
            "infernix_gateway_in_flight", "Generation requests being served", ["protocol"],
            registry=self.registry)

    def count(self, protocol: str, outcome: str, constraint: str) -> None:
        if protocol not in PROTOCOLS or outcome not in OUTCOMES or constraint not in CONSTRAINTS:
            raise ValueError(f"unknown label value in ({protocol!r}, {outcome!r}, {constraint!r})")
        self.requests.labels(protocol=protocol, outcome=outcome, constraint=constraint).inc()
