"""Time the kernels against their torch references and SDPA at the Qwen3-8B shape; write JSON.

    python -m bench.kernel_speed --out bench_kernels.json [--quick] [--only attention,...]

Shapes: hidden 4096, 32 q heads and 8 KV heads of 128, intermediate 12288, vocabulary 151,936, bf16,
B in 1, 8, 32, 64 and contexts 1k-4k (paged KV, block 16, blocks shuffled); the fused greedy argmax
(`--only sampling_greedy`) at vocabulary 248,320 and B in 1, 8, 64. Every case runs each
implementation side by side in one process and reports microseconds per call two ways: `us_graph`,
the GPU time of 20 calls captured in one CUDA graph (no launch overhead: the decode graph's view),
and `us_eager`, back-to-back eager calls (launch overhead included). `host_sync` says whether an
implementation synchronises with the host (torch's sync debug mode): those (the references of
attention, sampling and acceptance) get no graph figure, and a kernel path that did would be a bug
(the decode graph cannot capture a sync). `max_abs_diff` compares each output with the case's first
implementation. Ratios come from the same run; no figure here is asserted by any test. `--tiny`
(tiny shapes, any device, wall-clock timing on CPU) lets a CPU test run the whole script under
Triton's interpreter.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.kernel_timing import run_case


@dataclass(frozen=True)
class Shape:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    inter: int = 12288
    vocab: int = 151_936
    batches: tuple = (1, 8, 32, 64)
    contexts: tuple = (1024, 2048, 4096)
    windows: tuple = (1, 4)  # query tokens per row: decode and K = 3 verification
    drafts: tuple = (4, 15)
    accept_batches: tuple = (1, 8, 64)
    ref_attention_limit: int = 8 * 4096  # B * context above which the reference is skipped
    tunings: tuple = ((64, 4, 3), (128, 4, 2), (128, 8, 2), (32, 4, 3), (32, 2, 2))
    split_sweep: tuple = (1, 2, 4, 8, 16, 32)
    prefill: tuple = (512,)  # chunk lengths of the B = 1 prefill case (new tokens after a prefix)
    greedy_vocab: int = 248_320  # the fused greedy argmax: Qwen3.5's padded vocabulary
    greedy_batches: tuple = (1, 8, 64)
    greedy_blocks: tuple = (2048, 4096, 8192, 16384)  # its columns per program, swept
    device: str = "cuda"


QUICK = Shape(batches=(1, 64), contexts=(4096,), accept_batches=(1, 64))
TINY = Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=48, vocab=300, batches=(2,),
             contexts=(40,), windows=(1, 3), drafts=(2,), accept_batches=(2,), device="cpu",
             tunings=((32, 2, 2),), split_sweep=(1, 2), prefill=(20,), greedy_vocab=300,
             greedy_batches=(2,), greedy_blocks=(64,))
DT = torch.bfloat16


def _none(*_) -> None:
    return None


def bench_layers(results: list, sh: Shape) -> None:
    from kernels.norms import add_rms_norm, rms_norm
    from kernels.norms_ref import add_rms_norm_ref, rms_norm_ref
    from kernels.rope import apply_rope_
    from kernels.rope_ref import apply_rope_ref_
    from kernels.swiglu import swiglu
    from kernels.swiglu_ref import swiglu_ref
    from services.worker.models.rope import apply_rope
    dev, hd = sh.device, sh.head_dim
    for b in sh.batches:
        x = torch.randn(b, sh.hidden, device=dev, dtype=DT)
        r = torch.randn_like(x)
        w = torch.randn(sh.hidden, device=dev, dtype=DT)
        impls = {"triton": lambda: rms_norm(x, w, 1e-6),
                 "torch_ref": lambda: rms_norm_ref(x, w, 1e-6)}
        if hasattr(F, "rms_norm"):
            impls["torch_F.rms_norm"] = lambda: F.rms_norm(x, (sh.hidden,), w, 1e-6)
        run_case(results, "rms_norm", {"B": b}, impls, nbytes=2 * x.numel() * 2)
        run_case(results, "add_rms_norm", {"B": b},
                 {"triton": lambda: add_rms_norm(x, r, w, 1e-6),
                  "torch_ref": lambda: add_rms_norm_ref(x, r, w, 1e-6)}, nbytes=4 * x.numel() * 2)
        qkv = torch.randn(b, 1, (sh.heads + 2 * sh.kv_heads) * hd, device=dev, dtype=DT)
        q = qkv[..., :sh.heads * hd].view(b, 1, sh.heads, hd)
        k = qkv[..., sh.heads * hd:(sh.heads + sh.kv_heads) * hd].view(b, 1, sh.kv_heads, hd)
        wn = torch.randn(hd, device=dev, dtype=DT)
        run_case(results, "qk_norm_q_view", {"B": b},
                 {"triton": lambda: _none(rms_norm(q, wn, 1e-6, out=q)),
                  "torch_ref": lambda: _none(q.copy_(rms_norm_ref(q, wn, 1e-6)))})
        ang = torch.rand(b, 1, hd // 2, device=dev) * 3000
        cos, sin = ang.cos(), ang.sin()
        run_case(results, "rope_q_k", {"B": b},
                 {"triton": lambda: apply_rope_(q, k, cos, sin),
                  "torch_ref": lambda: apply_rope_ref_(q, k, cos, sin),
                  "today_services_rope": lambda: _none(q.copy_(apply_rope(q, cos, sin)),
                                                       k.copy_(apply_rope(k, cos, sin)))})
        gu = torch.randn(b, 2 * sh.inter, device=dev, dtype=DT)
        run_case(results, "swiglu", {"B": b},
                 {"triton": lambda: swiglu(gu), "torch_ref": lambda: swiglu_ref(gu)},
                 nbytes=3 * b * sh.inter * 2)


def bench_attention(results: list, sh: Shape) -> None:
    from kernels.paged_attention import paged_attention
    from kernels.paged_kv import write_kv
    from kernels.paged_kv_ref import gather_kv_ref, paged_attention_ref, write_kv_ref
    dev, block = sh.device, 16
    for b in sh.batches:
        for context in sh.contexts:
            per_row = -(-context // block)
            kc = torch.randn(b * per_row, block, sh.kv_heads, sh.head_dim, device=dev, dtype=DT)
            vc = torch.randn_like(kc)
            table = torch.randperm(b * per_row, device=dev).view(b, per_row).to(torch.int32)
            keys = gather_kv_ref(kc, table, context)  # [B, L, Hkv, D]: the logical layout
            values = gather_kv_ref(vc, table, context)
            k_sdpa = keys.transpose(1, 2).contiguous()  # [B, Hkv, L, D]: SDPA's best case
            v_sdpa = values.transpose(1, 2).contiguous()
            lanes = torch.arange(b, device=dev)
            for t in sh.windows:
                q = torch.randn(b, t, sh.heads, sh.head_dim, device=dev, dtype=DT)
                pos = torch.arange(context - t, context, device=dev).expand(b, t).contiguous()
                visible = (torch.arange(context, device=dev)[None, None, :]
                           <= pos[:, :, None])[:, None]  # [B, 1, T, L]

                def sdpa():
                    return F.scaled_dot_product_attention(
                        q.transpose(1, 2), k_sdpa, v_sdpa, attn_mask=None if t == 1 else visible,
                        enable_gqa=True).transpose(1, 2)

                def today():  # services/worker/models/dense.py: lane gather + masked SDPA
                    kk = keys[lanes, :context].transpose(1, 2)
                    vv = values[lanes, :context].transpose(1, 2)
                    return F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv,
                                                          attn_mask=visible,
                                                          enable_gqa=True).transpose(1, 2)

                impls = {"triton_paged": lambda: paged_attention(q, kc, vc, table, pos,
                                                                 max_seq_len=context),
                         "sdpa_contiguous": sdpa, "today_gather_mask_sdpa": today}
                if b * context <= sh.ref_attention_limit:
                    impls["torch_ref"] = lambda: paged_attention_ref(q, kc, vc, table, pos)
                kv_bytes = 2 * b * context * sh.kv_heads * sh.head_dim * 2
                run_case(results, "attention", {"B": b, "context": context, "T": t}, impls,
                         nbytes=kv_bytes)
            if b == sh.batches[0]:  # row 0 of the pool as a B = 1 prefill (before any write)
                for t in sh.prefill:
                    bench_prefill(results, sh, context, t, kc, vc, table[:1], k_sdpa[:1],
                                  v_sdpa[:1])
            k_new = torch.randn(b, 1, sh.kv_heads, sh.head_dim, device=dev, dtype=DT)
            v_new = torch.randn_like(k_new)
            wpos = torch.full((b, 1), context - 1, device=dev)  # the writes below change KV
            run_case(results, "write_kv", {"B": b, "context": context},
                     {"triton": lambda: write_kv(kc, vc, k_new, v_new, table, wpos),
                      "torch_ref": lambda: write_kv_ref(kc, vc, k_new, v_new, table, wpos)})
            bench_prepare(results, sh, b, context, kc, vc, table, wpos)
            kc = vc = keys = values = k_sdpa = v_sdpa = None
            if dev == "cuda":
                torch.cuda.empty_cache()


def bench_attention_tuning(results: list, sh: Shape) -> None:
    """The attention kernel's launch choices side by side: KV tile, warps, stages and splits."""
    from kernels.paged_attention import choose_splits, paged_attention
    dev, block = sh.device, 16
    context = max(sh.contexts)
    for b in sorted({sh.batches[0], sh.batches[-1]}):
        per_row = -(-context // block)
        kc = torch.randn(b * per_row, block, sh.kv_heads, sh.head_dim, device=dev, dtype=DT)
        vc = torch.randn_like(kc)
        table = torch.randperm(b * per_row, device=dev).view(b, per_row).to(torch.int32)
        for t in sh.windows:
            q = torch.randn(b, t, sh.heads, sh.head_dim, device=dev, dtype=DT)
            pos = torch.arange(context - t, context, device=dev).expand(b, t).contiguous()
            default = choose_splits(b, 1, sh.kv_heads, context, torch.device(dev))
            impls = {f"default_S{default}": lambda: paged_attention(q, kc, vc, table, pos,
                                                                    max_seq_len=context)}
            for bn, warps, stages in sh.tunings:
                impls[f"n{bn}_w{warps}_s{stages}"] = (
                    lambda bn=bn, warps=warps, stages=stages: paged_attention(
                        q, kc, vc, table, pos, max_seq_len=context, block_n=bn, num_warps=warps,
                        num_stages=stages))
            for splits in sorted(set(sh.split_sweep) - {default}):
                impls[f"S{splits}"] = lambda splits=splits: paged_attention(
                    q, kc, vc, table, pos, num_splits=splits)
            kv_bytes = 2 * b * context * sh.kv_heads * sh.head_dim * 2
            run_case(results, "attention_tuning", {"B": b, "context": context, "T": t}, impls,
                     nbytes=kv_bytes)
        kc = vc = None
        if dev == "cuda":
            torch.cuda.empty_cache()


def bench_prefill(results, sh, context, t, kc, vc, table, k_sdpa, v_sdpa) -> None:
    """A prefill chunk of t tokens after a cached prefix (B = 1): the paged kernel against SDPA
    with the offset causal mask on contiguous KV."""
    from kernels.paged_attention import paged_attention
    dev = sh.device
    q = torch.randn(1, t, sh.heads, sh.head_dim, device=dev, dtype=DT)
    pos = torch.arange(context - t, context, device=dev)[None]
    visible = (torch.arange(context, device=dev)[None, None, :] <= pos[:, :, None])[:, None]
    run_case(results, "attention_prefill", {"B": 1, "context": context, "T": t},
             {"triton_paged": lambda: paged_attention(q, kc, vc, table, pos, max_seq_len=context),
              "sdpa_contiguous_mask": lambda: F.scaled_dot_product_attention(
                  q.transpose(1, 2), k_sdpa, v_sdpa, attn_mask=visible,
                  enable_gqa=True).transpose(1, 2)})


def bench_prepare(results, sh, b, context, kc, vc, table, wpos) -> None:
    """q/k norm + RoPE + KV write: one fused launch, the separate kernels, and the references."""
    from kernels.norms import rms_norm
    from kernels.paged_kv import write_kv
    from kernels.qkv_prepare import prepare_qkv, prepare_qkv_ref
    from kernels.rope import apply_rope_
    hq, hk, hd = sh.heads, sh.kv_heads, sh.head_dim
    qkv = torch.randn(b, 1, (hq + 2 * hk) * hd, device=sh.device, dtype=DT)
    q = qkv[..., :hq * hd].view(b, 1, hq, hd)
    k = qkv[..., hq * hd:(hq + hk) * hd].view(b, 1, hk, hd)
    v = qkv[..., (hq + hk) * hd:].view(b, 1, hk, hd)
    wq, wk = torch.randn(2, hd, device=sh.device, dtype=DT)
    ang = torch.rand(b, 1, hd // 2, device=sh.device) * 3000
    cos, sin = ang.cos(), ang.sin()
    kn = torch.empty_like(k)

    def separate():
        rms_norm(q, wq, 1e-6, out=q)
        rms_norm(k, wk, 1e-6, out=kn)
        apply_rope_(q, kn, cos, sin)
        write_kv(kc, vc, kn, v, table, wpos)

    run_case(results, "qkv_prepare", {"B": b, "context": context},
             {"triton_fused": lambda: _none(prepare_qkv(q, k, v, cos, sin, kc, vc, table, wpos,
                                                        q_norm=wq, k_norm=wk)),
              "triton_separate": separate,
              "torch_ref": lambda: _none(prepare_qkv_ref(q, k, v, cos, sin, kc, vc, table, wpos,
                                                         q_norm=wq, k_norm=wk))})


def bench_sampling(results: list, sh: Shape) -> None:
    from kernels.sampling import sample
    from kernels.sampling_contract import SamplingParams
    from kernels.sampling_ref import sample_reference
    dev, v = sh.device, sh.vocab
    words = -(-v // 32)
    for b in sh.batches:
        logits = torch.randn(b, v, device=dev, dtype=DT)
        mask = torch.randint(-2**31, 2**31 - 1, (b, words), device=dev, dtype=torch.int32)
        mask_row = torch.arange(b, device=dev, dtype=torch.int32)
        greedy = SamplingParams.from_rows(b, temperature=0.0, device=dev)
        hot = SamplingParams.from_rows(b, temperature=0.8, top_k=50, top_p=0.95, device=dev)
        for label, kw in (("unconstrained", {}), ("masked", {"mask": mask, "mask_row": mask_row})):
            run_case(results, f"sample_greedy_{label}", {"B": b, "V": v},
                     {"triton_argmax": lambda: sample(logits, greedy, vocab_size=v,
                                                      candidate_width=1, **kw).tokens,
                      "triton_topk_width_50": lambda: sample(logits, greedy, vocab_size=v,
                                                             candidate_width=50, **kw).tokens,
                      "torch_ref": lambda: sample_reference(logits, greedy, vocab_size=v,
                                                            candidate_width=1, **kw).tokens})
            run_case(results, f"sample_topk50_{label}", {"B": b, "V": v},
                     {"triton": lambda: sample(logits, hot, vocab_size=v, candidate_width=50,
                                               **kw).tokens,
                      "torch_ref": lambda: sample_reference(logits, hot, vocab_size=v,
                                                            candidate_width=50, **kw).tokens})


def bench_sampling_greedy(results: list, sh: Shape) -> None:
    """The greedy sample stage of a decode step, bf16 logits: the fused one-pass Triton argmax
    (kernels/sampling_greedy_triton.py, reading the static generable mask) against what the
    sampler ran before on CUDA, `_generable`'s index_fill copy then the torch `sample_greedy`.
    Unconstrained and masked (every row constrained); the fused kernel's block size swept."""
    from kernels.sampling_greedy import generable_words, sample_greedy
    from kernels.sampling_greedy_triton import default_block, sample_greedy_triton
    dev, v = sh.device, sh.greedy_vocab
    words = -(-v // 32)
    never = torch.arange(v - max(1, v // 1000), v, device=dev)  # the padding ids past the tokens
    generable = generable_words(v, never, dev)
    for b in sh.greedy_batches:
        logits = torch.randn(b, v, device=dev, dtype=DT)
        logits[:, never] = -30.0  # so that every implementation picks the same tokens
        mask = torch.randint(-2**31, 2**31 - 1, (b, 1, words), device=dev, dtype=torch.int32)
        mask[..., -1] = 0  # bits past V zero
        mask_row = torch.arange(b, device=dev, dtype=torch.int32)
        for label, kw in (("unconstrained", {}), ("masked", {"mask": mask, "mask_row": mask_row})):
            def fused(block=None, kw=kw):
                r = sample_greedy_triton(logits, vocab_size=v, generable=generable, block_v=block,
                                         **kw)
                return r.tokens, r.status

            def before(kw=kw):  # Sampler.sample's all-greedy branch before the fused kernel
                r = sample_greedy(logits.index_fill(1, never, float("-inf")), vocab_size=v, **kw)
                return r.tokens, r.status

            def argmax_only(kw=kw):  # the torch argmax without the index_fill copy
                r = sample_greedy(logits, vocab_size=v, **kw)
                return r.tokens, r.status

            impls = {f"triton_fused_default_b{default_block(b)}": fused}
            for block in sh.greedy_blocks:
                impls[f"triton_fused_b{block}"] = lambda block=block: fused(block)
            impls["torch_index_fill_sample_greedy"] = before
            impls["torch_sample_greedy_no_index_fill"] = argmax_only
            run_case(results, f"sample_greedy_fused_{label}", {"B": b, "V": v}, impls,
                     nbytes=b * v * 2 + (b * words * 4 if kw else 0))


def bench_acceptance(results: list, sh: Shape) -> None:
    from kernels.acceptance import accept_drafts
    from kernels.acceptance_contract import PositionState
    from kernels.acceptance_ref import accept_drafts_ref
    from kernels.sampling_contract import SamplingParams
    dev, v = sh.device, sh.vocab
    words = -(-v // 32)
    for b in sh.accept_batches:
        for k in sh.drafts:
            logits = torch.randn(b, k + 1, v, device=dev, dtype=DT)
            d = logits[:, :k].float().argmax(-1)  # [B, K] the target's own greedy choices
            nd = torch.full((b,), k, dtype=torch.int32, device=dev)
            states = torch.full((b, k + 1), int(PositionState.READY), dtype=torch.int32,
                                device=dev)
            mask = torch.full((b, k + 1, words), -1, dtype=torch.int32, device=dev)
            q_ids = torch.topk(logits[:, :k].float(), 16, dim=-1).indices.to(torch.int32)
            q_probs = torch.full((b, k, 16), 1 / 16, device=dev)
            for label, temp, width, q in (
                    ("greedy", 0.0, 1, None), ("onehot_T0.8_topk50", 0.8, 50, None),
                    ("sparse16_T0.8_topk50", 0.8, 50, (q_ids, q_probs))):
                params = SamplingParams.from_rows(b, temperature=temp,
                                                  top_k=0 if temp == 0 else 50, device=dev)
                kw = dict(vocab_size=v, mask=mask, candidate_width=min(width, v),
                          q_ids=None if q is None else q[0], q_probs=None if q is None else q[1])
                run_case(results, f"accept_{label}", {"B": b, "K": k, "V": v},
                         {"triton": lambda: accept_drafts(logits, params, d, nd, states, **kw),
                          "torch_ref": lambda: accept_drafts_ref(logits, params, d, nd, states,
                                                                 **kw)})


GROUPS = {"layers": bench_layers, "attention": bench_attention,
          "attention_tuning": bench_attention_tuning, "sampling": bench_sampling,
          "sampling_greedy": bench_sampling_greedy, "acceptance": bench_acceptance}


def ratios(results: list) -> list:
    """Each implementation's time over its case's first implementation (the kernel)."""
    out = []
    skip = ("impl", "us_graph", "us_eager", "max_abs_diff", "gb_per_s", "host_sync")
    for rec in results:
        key = {k: v for k, v in rec.items() if k not in skip}
        base = next(r for r in results if {k: r.get(k) for k in key} == key)
        if rec is base:
            continue
        graph = rec["us_graph"] / base["us_graph"] if rec["us_graph"] and base["us_graph"] else None
        out.append(dict(key, impl=rec["impl"], vs=base["impl"], graph_ratio=graph,
                        eager_ratio=rec["us_eager"] / base["us_eager"]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--quick", action="store_true", help="B in 1, 64 and one context only")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    ap.add_argument("--only", default=",".join(GROUPS), help="comma-separated groups to run")
    args = ap.parse_args(argv)
    shape = TINY if args.tiny else QUICK if args.quick else Shape()
    if shape.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.kernel_speed needs a CUDA device (or --tiny)")
    import triton
    results: list = []
    started = time.time()
    torch.manual_seed(0)
    with torch.inference_mode():
        for name in args.only.split(","):
            if name not in GROUPS:
                raise SystemExit(f"--only: unknown group {name!r}; choose from {', '.join(GROUPS)}")
            GROUPS[name](results, shape)
    out = dict(device=torch.cuda.get_device_name() if shape.device == "cuda" else "cpu",
               torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), shape=shape.__dict__,
               seconds=round(time.time() - started, 1), results=results,
               ratios_to_kernel=ratios(results),
               notes="us_graph: GPU time per call inside a CUDA graph; us_eager: with launch "
                     "overhead; a ratio > 1 means the alternative is slower than the kernel")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {len(results)} records to {args.out} in {out['seconds']} s")


if __name__ == "__main__":
    main()
