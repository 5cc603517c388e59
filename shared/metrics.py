"""Prometheus metrics, one small class per service, each on an explicit registry.

Labels take fixed values only (a served model name, an outcome enum), never request text.
A registry is passed in (the service's own) or created fresh, so tests never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# The outcome label of infernix_grammar_compiles_total.
COMPILE_OUTCOMES = ("l1", "redis", "service", "built", "shared", "error", "too_complex",
                    "overloaded")
# The limit label of infernix_grammar_compile_limit_stops_total.
COMPILE_LIMITS = ("compile_deadline_s", "compile_memory_bytes")


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
            "Compile requests by model and outcome (l1, redis, service, built, shared, error, "
            "too_complex, overloaded)",
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
        self.cold_compiles_in_flight = Gauge(
            "infernix_grammar_cold_compiles_in_flight",
            "Cold compiles running now (at most two per model)",
            ["model"],
            registry=self.registry,
        )
        self.l1_bytes = Gauge(
            "infernix_grammar_l1_bytes",
            "Bytes of compiled grammars held in the in-process LRU",
            ["model"],
            registry=self.registry,
        )

        self.compile_limit_stops = Counter(
            "infernix_grammar_compile_limit_stops_total",
            "Cold compiles stopped by a compile limit (compile_deadline_s, compile_memory_bytes)",
            ["model", "limit"],
            registry=self.registry,
        )
        self.service_fallbacks = Counter(
            "infernix_grammar_service_fallbacks_total",
            "Grammars a worker got without the grammar service (Redis or an in-process build)",
            ["model"],
            registry=self.registry,
        )

    def count_compile(self, model: str, outcome: str) -> None:
        if outcome not in COMPILE_OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {COMPILE_OUTCOMES}")
        self.compiles.labels(model=model, outcome=outcome).inc()


class GrammarClientMetrics:
    """A worker's view of the grammar service (one GrpcGrammarClient per registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.service_up = Gauge(
            "infernix_grammar_service_up",
            "1 while the grammar service answers this worker, 0 while it is unreachable",
            registry=self.registry,
        )
        self.service_failures = Counter(
            "infernix_grammar_service_failures_total",
            "Calls to the grammar service that failed in transport (down, refused, timed out)",
            registry=self.registry,
        )


# Fixed label values of the worker's request counter.
CONSTRAINT_KINDS = ("none", "grammar", "json_object", "json_schema", "choice", "regex", "tools")
FINISH_REASONS = ("stop", "length", "tool_calls", "cancelled", "error")
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WorkerMetrics:
    """Engine metrics: requests by constraint kind and outcome, lanes, queue, latencies, mask
    work."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "infernix_worker_requests_total",
            "Finished requests by constraint kind and finish reason", ["constraint", "outcome"],
            registry=self.registry)
        self.lanes_in_use = Gauge(
            "infernix_worker_lanes_in_use",
            "Resident lanes holding a request",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "infernix_worker_queue_depth", "Requests waiting for a lane", registry=self.registry)
        self.warmup_seconds = Gauge(
            "infernix_worker_warmup_seconds", "Seconds the start-up warm-up took (every kernel "
            "shape compiled before ready; 0 while it runs or when off)", registry=self.registry)
        self.warmup_shapes = Gauge(
            "infernix_worker_warmup_shapes", "Forward, graph and sampler shapes the warm-up ran",
            ["kind"], registry=self.registry)
        self.ttft_seconds = Histogram(
            "infernix_worker_ttft_seconds", "Submission to first published token",
            buckets=_TTFT_BUCKETS, registry=self.registry)
        self.tpot_seconds = Histogram(
            "infernix_worker_time_per_token_seconds",
            "Decode time per output token after the first",
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.mask_cpu_seconds = Counter(
            "infernix_worker_mask_cpu_seconds_total",
            "CPU seconds spent filling masks, looking ahead and rolling back",
            registry=self.registry,
        )
        self.mask_positions = Counter(
            "infernix_worker_mask_positions_total", "Mask rows computed for finished requests "
            "(ready and dead-end positions, lookahead included)", registry=self.registry)
        self.mask_upload_bytes = Counter(
            "infernix_worker_mask_upload_bytes_total", "Mask bytes copied to the device for the "
            "committed steps of finished requests", registry=self.registry)
        self.prepare_seconds = Histogram(
            "infernix_worker_prepare_seconds", "Preparation of finished requests by stage: input "
            "(render and tokenize the prompt), constraint (grammar, matcher, tool stream)",
            ["stage"], buckets=_TOKEN_BUCKETS + (5.0, 10.0, 30.0), registry=self.registry)
        self.tokens = Counter(
            "infernix_worker_tokens_total", "Prompt and completion tokens of finished requests",
            ["kind"], registry=self.registry)
        self.queue_seconds = Histogram(
            "infernix_worker_queue_seconds", "Time a request waited for a lane (each admission)",
            buckets=_TTFT_BUCKETS, registry=self.registry)
        self.rejected = Counter(
            "infernix_worker_rejected_total", "Requests refused before they were queued",
            ["reason"], registry=self.registry)
        self.preemptions = Counter(
            "infernix_worker_preemptions_total",
            "Running requests paused for a long-waiting one (resumed later by Replay)",
            registry=self.registry)
        self.spec_drafts = Counter(
            "infernix_worker_spec_draft_tokens_total",
            "Speculative drafts verified in committed rounds, and of them accepted",
            ["result"], registry=self.registry)  # result: proposed | accepted | rolled_back
        self.spec_rounds = Counter(
            "infernix_worker_spec_rounds_total",
            "Committed verification rounds of one request that carried drafts",
            registry=self.registry)
        self.spec_draft_wait_seconds = Counter(
            "infernix_worker_spec_draft_wait_seconds_total",
            "Host seconds waiting for drafts (proposing on the host, or a draft model's ready "
            "event)", registry=self.registry)

        self.prefix_lookup_tokens = Counter(
            "infernix_worker_prefix_cache_lookup_tokens_total",
            "Prompt tokens looked up in the prefix cache at admission (what could have hit)",
            registry=self.registry)
        self.prefix_hit_tokens = Counter(
            "infernix_worker_prefix_cache_hit_tokens_total",
            "Prompt tokens whose KV came from the prefix cache (prefill skipped)",
            registry=self.registry)
        self.prefix_evictions = Counter(
            "infernix_worker_prefix_cache_evictions_total",
            "Cached KV blocks reused for new data (least recently used first)",
            registry=self.registry)
        self.prefix_hit_rate = Gauge(
            "infernix_worker_prefix_cache_hit_rate",
            "Hit tokens / lookup tokens since start", registry=self.registry)
        self.kv_blocks = Gauge(
            "infernix_worker_kv_blocks", "KV pool blocks by state (available: free or evictable; "
            "cached: in the prefix cache, referenced or not)", ["state"], registry=self.registry)
        self.state_snapshots = Gauge(
            "infernix_worker_prefix_cache_state_snapshots", "Recurrent-state snapshots a hybrid "
            "model's prefix cache holds (each resumes prompts at one block boundary)",
            registry=self.registry)
        self.snapshot_evictions = Counter(
            "infernix_worker_prefix_cache_snapshot_evictions_total", "Recurrent-state snapshots "
            "dropped for a slot or with the KV blocks they need", registry=self.registry)
        self._prefix_seen = (0, 0, 0, 0)
        self.forced_closes = Counter(
            "infernix_worker_thinking_forced_closes_total",
            "Reasoning phases closed by the thinking budget (the close sequence forced)",
            registry=self.registry)

    def prefix_cache(self, stats, *, free_blocks: int, cached_blocks: int) -> None:
        """Bring the prefix-cache metrics up to `stats` (a program/blocks.PrefixCacheStats with
        cumulative counts)."""
        seen = (stats.lookup_tokens, stats.hit_tokens, stats.evictions, stats.snapshot_evictions)
        for counter, now, before in zip((self.prefix_lookup_tokens, self.prefix_hit_tokens,
                                         self.prefix_evictions, self.snapshot_evictions), seen,
                                        self._prefix_seen):
            if now > before:
                counter.inc(now - before)
        self._prefix_seen = seen
        self.prefix_hit_rate.set(stats.hit_rate)
        self.kv_blocks.labels(state="available").set(free_blocks)
        self.kv_blocks.labels(state="cached").set(cached_blocks)
        self.state_snapshots.set(stats.snapshots)

    def finished(self, constraint: str, outcome: str, *, ttft: float | None, tpot: float | None,
                 mask_seconds: float, prompt_tokens: int, completion_tokens: int,
                 mask_positions: int = 0, mask_upload_bytes: int = 0,
                 input_seconds: float | None = None,
                 constraint_seconds: float | None = None) -> None:
        if constraint not in CONSTRAINT_KINDS or outcome not in FINISH_REASONS:
            raise ValueError(f"unknown label value in ({constraint!r}, {outcome!r})")
        self.requests.labels(constraint=constraint, outcome=outcome).inc()
        if ttft is not None:
            self.ttft_seconds.observe(ttft)
        if tpot is not None:
            self.tpot_seconds.observe(tpot)
        self.mask_cpu_seconds.inc(mask_seconds)
        self.tokens.labels(kind="prompt").inc(prompt_tokens)
        self.tokens.labels(kind="completion").inc(completion_tokens)
        self.mask_positions.inc(mask_positions)
        self.mask_upload_bytes.inc(mask_upload_bytes)
        for stage, seconds in (("input", input_seconds), ("constraint", constraint_seconds)):
            if seconds is not None:
                self.prepare_seconds.labels(stage=stage).observe(seconds)


def serve_metrics(port: int, registry: CollectorRegistry, host: str = "0.0.0.0") -> None:
    """Expose `registry` on http://host:port/metrics from a daemon thread (port 0: off)."""
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=registry)


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format of `registry` (for a /metrics endpoint)."""
    return generate_latest(registry)
