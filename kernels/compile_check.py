"""Compile every Triton kernel for an NVIDIA target without a GPU (a CPU-side check).

    python -m kernels.compile_check [--arch 90]

Runs the public entry points at the Qwen3-8B / Qwen3.5 shapes on CPU tensors with kernel launches
intercepted (nothing executes), then compiles each distinct launch (argument types, constexprs,
num_warps, num_stages) to a cubin for `cuda:<arch>` with Triton's bundled ptxas. It catches type,
shape and lowering errors that the interpreter cannot see (for example tensor-core dot operand
types). It does not check numerics or speed: the gpu-marked tests and bench/kernel_speed.py do.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
          torch.int32: "*i32", torch.int64: "*i64", torch.uint8: "*u8", torch.int8: "*i8"}
_OPTIONS = ("num_warps", "num_stages")


@contextlib.contextmanager
def captured_launches():
    """Replace JITFunction.run by a recorder; yields the list of (fn, args, kwargs)."""
    launches: list = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


def _signature(fn: JITFunction, args: tuple, kwargs: dict):
    values = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items()
                                               if k not in _OPTIONS}
    sig, consts = {}, {}
    for i, p in enumerate(fn.params):
        v = values[p.name]
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            consts[(i,)] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = _TYPES[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}.{p.name}: cannot type {type(v).__name__}")
    options = {k: kwargs[k] for k in _OPTIONS if k in kwargs}
    return sig, consts, options


def exercise() -> None:
    """Call every public kernel entry point at real shapes (launches are intercepted)."""
    from kernels.acceptance import accept_drafts
    from kernels.acceptance_contract import PositionState, speculative_penalties
    from kernels.norms import add_rms_norm, rms_norm
    from kernels.paged_attention import paged_attention
    from kernels.paged_kv import write_kv
    from kernels.qkv_prepare import prepare_qkv
    from kernels.rope import apply_rope_
    from kernels.sampling import sample
    from kernels.sampling_contract import PenaltyHistory, SamplingParams
    from kernels.sampling_greedy import generable_words
    from kernels.sampling_greedy_triton import sample_greedy_triton
    from kernels.swiglu import swiglu
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.zeros(2, 4096, dtype=dt)
        w = torch.zeros(4096, dtype=dt)
        for z in (False, True):
            rms_norm(x, w, 1e-6, zero_centered=z)
            add_rms_norm(x, x, w, 1e-6, zero_centered=z)
        swiglu(torch.zeros(2, 2 * 12288, dtype=dt))
        for heads, kv, d, rot in ((32, 8, 128, 128), (16, 4, 256, 64)):  # Qwen3-8B, Qwen3.5-9B
            qkv = torch.zeros(2, 5, (heads + 2 * kv) * d, dtype=dt)
            q = qkv[..., :heads * d].view(2, 5, heads, d)
            k = qkv[..., heads * d:(heads + kv) * d].view(2, 5, kv, d)
            v = qkv[..., (heads + kv) * d:].view(2, 5, kv, d)
            rms_norm(q, torch.zeros(d, dtype=dt), 1e-6, out=q)
            cs = torch.zeros(2, 5, rot // 2)
            apply_rope_(q, k, cs, cs)
            kc = torch.zeros(40, 16, kv, d, dtype=dt)
            table = torch.zeros(2, 20, dtype=torch.int32)
            pos = torch.zeros(2, 5, dtype=torch.int64)
            write_kv(kc, kc, k, v, table, pos)
            nw = torch.zeros(d, dtype=dt)
            for z in (False, True):
                prepare_qkv(q, k, v, cs, cs, kc, kc, table, pos, q_norm=nw, k_norm=nw,
                            zero_centered=z)
            prepare_qkv(q, k, v, cs, cs, kc, kc, table, pos)
            for t in (1, 5, 300):
                qq = torch.zeros(2, t, heads, d, dtype=dt)
                pp = torch.zeros(2, t, dtype=torch.int64)
                for splits in (1, 4):
                    paged_attention(qq, kc, kc, table, pp, num_splits=splits)
    from kernels.gemv import GemvConfig, gemv

    for dt in (
        torch.bfloat16,
        torch.float16,
    ):  # decode GEMV: the heuristic config, each mode, a bias
        for n, k in ((6144, 4096), (4096, 12288), (248320, 4096)):
            w = torch.zeros(n, k, dtype=dt)
            for m in (1, 2, 4, 8, 16):
                gemv(torch.zeros(m, k, dtype=dt), w)
        w, b = torch.zeros(3000, 4160, dtype=dt), torch.zeros(3000, dtype=dt)
        for mode in ("acc", "sum", "dot"):
            gemv(torch.zeros(3, 4160, dtype=dt), w, b, GemvConfig(32, 128, 4, 4, 3, mode))
    vocab, words = 151_936, 4748
    for dt in (torch.bfloat16, torch.float32):
        logits = torch.zeros(4, vocab, dtype=dt)
        mask = torch.zeros(4, words, dtype=torch.int32)
        mrow = torch.zeros(4, dtype=torch.int32)
        hist = PenaltyHistory(torch.zeros(4, 3000, dtype=torch.int32),
                              torch.zeros(4, 3000, dtype=torch.int32))
        for temp, width in ((0.0, 1), (0.8, 50), (0.8, None)):
            params = SamplingParams.from_rows(4, temperature=temp)
            for kw in ({}, {"mask": mask, "mask_row": mrow}, {"penalties": hist}):
                sample(logits, params, vocab_size=vocab, candidate_width=width, **kw)
        for k in (4, 15):
            lg = torch.zeros(4, k + 1, vocab, dtype=dt)
            drafts = torch.zeros(4, k, dtype=torch.int64)
            nd = torch.zeros(4, dtype=torch.int32)
            st = torch.full((4, k + 1), int(PositionState.READY), dtype=torch.int32)
            m3 = torch.zeros(4, k + 1, words, dtype=torch.int32)
            qi, qp = torch.zeros(4, k, 16, dtype=torch.int32), torch.zeros(4, k, 16)
            pen = speculative_penalties(PenaltyHistory(hist.ids[:, :10], hist.counts[:, :10]),
                                        drafts)
            for temp, width in ((0.0, 1), (0.8, 50)):
                params = SamplingParams.from_rows(4, temperature=temp)
                accept_drafts(lg, params, drafts, nd, st, vocab_size=vocab, mask=m3,
                              candidate_width=width, eos_ids=torch.zeros(2, dtype=torch.int32))
                accept_drafts(lg, params, drafts, nd, st, vocab_size=vocab, q_ids=qi, q_probs=qp,
                              candidate_width=width, penalties=pen)
    gvocab = 248_320  # the fused greedy argmax at Qwen3.5's vocabulary, every block size used
    gwords = -(-gvocab // 32)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for rows in (1, 8, 64):
            logits = torch.zeros(rows, gvocab + 64, dtype=dt)
            mask = torch.zeros(rows, 2, gwords, dtype=torch.int32)
            mrow = torch.zeros(rows, dtype=torch.int32)
            gen = generable_words(gvocab, [gvocab - 1])
            for block in (None, 16384):
                for kw in ({}, {"mask": mask, "mask_row": mrow}):
                    for g in (None, gen):
                        sample_greedy_triton(logits, vocab_size=gvocab, generable=g,
                                             block_v=block, **kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability (90 = H100/H200)")
    args = ap.parse_args(argv)
    with captured_launches() as launches:
        exercise()
    seen, failures = set(), []
    started = time.time()
    target = GPUTarget("cuda", args.arch, 32)
    for fn, a, kw in launches:
        sig, consts, options = _signature(fn, a, kw)
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted(consts.items())),
               tuple(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        try:
            triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target,
                           options=options)
        except Exception as e:  # noqa: BLE001 (report every failing configuration)
            failures.append(f"{fn.__name__} {dict(consts)}: {type(e).__name__}: {e}"[:2000])
    print(f"compiled {len(seen)} kernel configurations for sm_{args.arch} in "
          f"{time.time() - started:.0f} s; {len(failures)} failed")
    for f in failures:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
