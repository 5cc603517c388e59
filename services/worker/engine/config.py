"""The Engine's configuration: lanes, lengths, the prefill budget, graphs, speculation, the
prefix cache, the pipeline and the warm-up (every field checked at construction: ValueError naming
it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 4  # resident lanes B, >= 1
    max_len: int | None = None  # positions per lane (prompt + output); None: from the KV budget
    kv_budget_bytes: int = 256 << 20  # KV cache bytes when max_len is None, > 0
    prefill_chunk: int = 512  # prompt tokens per prefill step, all prefilling rows together, >= 1
    cuda_graphs: bool = True  # capture decode graphs per batch size on CUDA
    preempt_after_s: float | None = None  # pause a running request for one waiting this long
    max_waiting: int | None = None  # queued requests beyond the lanes; None: 4 x max_batch
    speculative: str | None = None  # None, or a backend of services/worker/spec (ngram, ...)
    num_draft_tokens: int = 4  # K: drafts per row and round when speculative, >= 1
    draft_model: str | None = None  # checkpoint directory of a DFlash / DFlash2 draft model
    draft_vocab: int | None = None  # MTP drafts among the first N token ids; None: all of them
    prefix_cache: bool = True  # reuse cached KV blocks (+ hybrid state snapshots) of equal prefixes
    kv_cache_tokens: int | None = None  # KV pool positions, at least every lane's full length
    # Launch decode step n+1 before committing step n (the pipeline, Engine.step); None: on
    # CUDA, where the commit then overlaps the device (on the CPU the forward is synchronous,
    # so it would only delay publication by one forward)
    pipeline: bool | None = None
    # Run every kernel shape once at start (program/warmup.py) before health says ok (a served
    # CUDA worker turns it on: services/embedded.py; benches and tests time their own shapes)
    warmup: bool = False
    # What logprobs report (program/logprobs.py): "processed" (the distribution each token was
    # sampled from) or "raw" (the model's own log-softmax)
    logprobs_mode: str = "processed"

    def __post_init__(self) -> None:
        for name in ("max_batch", "kv_budget_bytes", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"EngineConfig.max_len must be >= 2, got {self.max_len}")
        if self.preempt_after_s is not None and self.preempt_after_s < 0:
            raise ValueError(
                f"EngineConfig.preempt_after_s must be >= 0, got {self.preempt_after_s}"
            )
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"EngineConfig.max_waiting must be >= 0, got {self.max_waiting}")
        if self.num_draft_tokens < 1:
            raise ValueError(f"EngineConfig.num_draft_tokens must be >= 1, got "
                             f"{self.num_draft_tokens}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 1:
            raise ValueError(
                f"EngineConfig.kv_cache_tokens must be >= 1, got {self.kv_cache_tokens}"
            )
        if self.logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"EngineConfig.logprobs_mode must be processed or raw, got "
                             f"{self.logprobs_mode!r}")

    @property
    def waiting_limit(self) -> int:
        return 4 * self.max_batch if self.max_waiting is None else self.max_waiting
