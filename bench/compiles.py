"""Triton compiles (and autotuning) on the request path: which kernels a timed round compiled
after the warm-up should have compiled them all (`bench prefix`, `bench spec`)."""

from __future__ import annotations

import contextlib
import time


@contextlib.contextmanager
def compile_log(active: bool):
    """Yields (list of {"request", "kernel"}, a setter of the current request's tag); while
    active, Triton's jit_cache_hook (called on every in-memory kernel cache miss, before a compile
    or a disk load) appends each miss, and the kernel is compiled as usual; its autotuning
    listener appends each benchmarked new key ("autotune ..." with the seconds it took)."""
    seen: list[dict[str, str]] = []
    current = {"tag": ""}

    def tag(name: str) -> None:
        current["tag"] = name

    if not active:
        yield seen, tag
        return
    import triton

    knobs = triton.knobs.runtime
    previous = knobs.jit_cache_hook

    def hook(*args, **kwargs):
        info = kwargs.get("fn")
        seen.append({"request": current["tag"],
                     "kernel": f"{getattr(info, 'name', '?')} {kwargs.get('repr', '')}"[:600]})
        return None  # compile it: the log only counts

    from triton.runtime.autotuner import Autotuner

    tune = Autotuner.run

    def tuned(self, *args, **kwargs):  # a key new to the autotuner's cache was benchmarked
        keys, started = len(self.cache), time.perf_counter()
        out = tune(self, *args, **kwargs)
        if len(self.cache) > keys:
            name = getattr(getattr(self, "base_fn", None), "__name__", "?")
            seen.append({"request": current["tag"], "kernel": f"autotune {name} "
                         f"{time.perf_counter() - started:.2f}s"})
        return out

    knobs.jit_cache_hook, Autotuner.run = hook, tuned
    try:
        yield seen, tag
    finally:
        knobs.jit_cache_hook, Autotuner.run = previous, tune
