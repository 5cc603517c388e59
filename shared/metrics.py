"""Prometheus metrics, one small class per service, each on an explicit registry.

Labels take fixed values only (a served model name, an outcome enum), never request text.
A registry is passed in (the service's own) or created fresh, so tests never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# The outcome label of infernix_grammar_compiles_total.
COMPILE_OUTCOMES = ("l1", "redis", "built", "shared", "error")


class GrammarMetrics:
    """Compile-cache metrics of the grammar service and of workers' grammar caches."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.redis_fallbacks = Counter(
            "infernix_grammar_redis_fallbacks_total",
            "Cache operations that could not use a configured Redis and fell back to the process",
            registry=self.registry,
        )
        self.compiles = Counter(
            "infernix_grammar_compiles_total",
            "Compile requests by model and outcome (l1, redis, built, shared, error)",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.compile_seconds = Histogram(
            "infernix_grammar_compile_seconds",
            "Wall time of cold compiles (validation, conversion and vocabulary compilation)",
            ["model"],
            buckets=(0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.l1_bytes = Gauge(
            "infernix_grammar_l1_bytes",
            "Bytes of compiled grammars held in the in-process LRU",
            ["model"],
            registry=self.registry,
        )

    def count_compile(self, model: str, outcome: str) -> None:
        if outcome not in COMPILE_OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {COMPILE_OUTCOMES}")
        self.compiles.labels(model=model, outcome=outcome).inc()


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format of `registry` (for a /metrics endpoint)."""
    return generate_latest(registry)
