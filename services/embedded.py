"""The wiring of Infernix's processes: which concrete clients each command builds.

The boundaries stay the same in every mode (design: the gateway talks to a `WorkerClient`, the
worker to a `GrammarClient`); only this module decides whether a client is in process or gRPC:

- `open_grammar(...)`: the worker's GrammarClient: the grammar service over gRPC when an address is
  given (the worker's own caches read Redis only), else an in-process compiler and cache;
- `open_worker(...)`: a started Engine over the loaded model behind an in-process WorkerClient;
- `infernix serve` (embedded mode) = `open_worker` with an in-process grammar client, behind the
  gateway, all in one process with one metrics registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.settings import default
from shared.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    # Defaults: services/settings.py's table (the flags' own).
    model: str = default("model")  # built-in name or checkpoint directory
    device: str = default("device")  # torch device
    lanes: int = default("lanes")  # resident lanes, >= 1
    max_len: int = default("max_len")  # positions per lane, >= 2
    prefill_chunk: int = default("prefill_chunk")  # prompt tokens per prefill step (all rows), >= 1
    preempt_after_s: float | None = default("preempt_after")  # None: no preemption
    max_waiting: int | None = default("max_waiting")  # bounded waiting queue; None: 4 x lanes
    speculative: str | None = default("speculative")  # backend (services/worker/spec); None: off
    draft_model: str | None = default("draft_model")  # draft checkpoint (dflash, dflash2)
    num_draft_tokens: int = default("num_draft_tokens")  # K, >= 1
    draft_vocab: int | None = default("draft_vocab")  # mtp: drafts among the first N ids
    prefix_cache: bool = not default("no_prefix_cache")  # the automatic prefix cache
    pipeline: bool = not default("no_pipeline")  # CUDA: launch step n+1 before committing step n
    kv_cache_tokens: int | None = default("kv_cache_tokens")  # KV positions; None: lanes x max_len
    warmup: bool = not default("no_warmup")  # CUDA: every kernel shape compiled before ready
    kernel_cache: str = default("kernel_cache")  # CUDA: the on-disk compiled-kernel cache
    logprobs_mode: str = default("logprobs_mode")  # "processed" | "raw" (program/logprobs.py)

    def __post_init__(self) -> None:
        for name, low in (("lanes", 1), ("max_len", 2), ("prefill_chunk", 1),
                          ("num_draft_tokens", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 1:
            raise ValueError(f"kv_cache_tokens must be >= 1, got {self.kv_cache_tokens}")
        from services.worker.spec import check_backend

        # Unsupported before the model loads
        check_backend(self.speculative, self.draft_model, self.draft_vocab)

    @classmethod
    def from_args(cls, args) -> "WorkerSettings":
        return cls(model=args.model, device=args.device, lanes=args.lanes, max_len=args.max_len,
                   prefill_chunk=args.prefill_chunk, preempt_after_s=args.preempt_after,
                   max_waiting=args.max_waiting, speculative=args.speculative,
                   draft_model=args.draft_model, num_draft_tokens=args.num_draft_tokens,
                   draft_vocab=getattr(args, "draft_vocab", None),
                   prefix_cache=not getattr(args, "no_prefix_cache", False),
                   pipeline=not getattr(args, "no_pipeline", False),
                   kv_cache_tokens=getattr(args, "kv_cache_tokens", None),
                   warmup=not getattr(args, "no_warmup", False),
                   kernel_cache=getattr(args, "kernel_cache", None) or default("kernel_cache"),
                   logprobs_mode=getattr(args, "logprobs_mode", None) or default("logprobs_mode"))


def open_grammar(model: str, *, redis_url: str | None = None, service: str | None = None,
                 config=None, client_options: dict | None = None, registry=None):
    """The worker's GrammarClient for `model` (see the module docstring). `config`: the caches'
    CacheConfig (default: CacheConfig(), read-only on Redis when a service is named);
    `client_options`: GrpcGrammarClient keywords (timeouts, fallback). Raises InvalidRequest for
    an unknown model name."""
    from services.grammar.cache.grammar_cache import CacheConfig, ModelCaches
    from services.grammar.client import GrpcGrammarClient, in_process_client
    from shared.frontends import get_domain
    from shared.metrics import GrammarMetrics

    domains = {model: get_domain(model)}
    if service is None:
        return in_process_client(domains, redis_url=redis_url, config=config, registry=registry)
    config = config if config is not None else CacheConfig(read_only=True)
    caches = ModelCaches.open(domains, redis_url=redis_url, metrics=GrammarMetrics(registry),
                              config=config)
    host, _, port = service.rpartition(":")
    return GrpcGrammarClient(host, int(port), caches, **(client_options or {}))


def use_kernel_cache(path: str) -> str:
    """Point this process's compiled-kernel caches at `path` (created): Triton's binaries and
    its autotuning results (fla-core's chunked gated delta rule caches its autotuning there
    too), so a restart on the same machine compiles and benchmarks nothing it has seen. An
    operator's own TRITON_CACHE_DIR wins. Returns the directory in use."""
    import os

    directory = os.environ.setdefault("TRITON_CACHE_DIR", os.path.expanduser(path))
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    os.makedirs(directory, exist_ok=True)
    log.info("kernel_cache", directory=directory)
    return directory


def open_worker(settings: WorkerSettings, *, grammar=None, registry=None):
    """Load the model and start an Engine over it behind an InProcessWorkerClient (bf16 on CUDA,
    float32 on the CPU). Without `grammar`, an in-process grammar client for the model."""
    import torch

    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    cuda = settings.device.startswith("cuda")
    if cuda:  # before the first kernel compiles
        use_kernel_cache(settings.kernel_cache)
    dtype = torch.bfloat16 if cuda else torch.float32
    log.info("model_loading", model=settings.model, device=settings.device)
    runtime = load_runtime(settings.model, device=settings.device, dtype=dtype)
    if settings.warmup:  # before health says ok, as the kernels' warm-up
        from services.grammar import client as grammar_client

        log.info("companion_indices_built", seconds=round(
            grammar_client.build_companion_indices(runtime.frontend.domain), 3))
    config = EngineConfig(max_batch=settings.lanes, max_len=settings.max_len,
                          prefill_chunk=settings.prefill_chunk,
                          preempt_after_s=settings.preempt_after_s,
                          max_waiting=settings.max_waiting,
                          speculative=settings.speculative,
                          num_draft_tokens=settings.num_draft_tokens,
                          draft_vocab=settings.draft_vocab,
                          draft_model=settings.draft_model, prefix_cache=settings.prefix_cache,
                          pipeline=None if settings.pipeline else False,
                          kv_cache_tokens=settings.kv_cache_tokens,
                          warmup=settings.warmup and cuda,
                          logprobs_mode=settings.logprobs_mode)
    return open_in_process(runtime, config, grammar=grammar, registry=registry)
