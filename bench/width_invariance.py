"""Width and batch invariance of the CUDA forward, op by op, and the GEMV configs of the
width-invariant route (models/layers.py WIDTH_INVARIANT).

    python -m bench.width_invariance --models tiny-dense tiny-qwen35 qwen3-8b-random \
        qwen35-9b-random --draft 3 --out width_invariance.json [--sweep-budget 90]

Trace: a prompt is prefilled into two lanes; lane 0 then runs K+1 decode steps of one token
(greedy), lane 1 one verify forward of the same K+1 tokens at the same positions. Every op of the
fused path (models/layers.py's linear, norms, rope, swiglu; the KV cache's attend; the GDN conv,
recurrence and gated norm) records its output; the verify's row j is compared bit for bit with
decode step j's. Reported: the first op whose outputs differ, every op kind's count of differing
calls, whether the logits and their argmax agree per position. Batch: lane 0's decode step alone
and beside three other lanes. Each with the route off and on.

Sweep: for each weight shape of the two models, dot-mode configs of the GEMV timed (CUDA graphs,
weights rotated past L2: bench/gemv_sweep.py's Timer) at the decode rows 1 and 8 and the verify
rows 4 and 32, against F.linear; the config minimising the decode time (M = 1 and 8 weighted
alike) is what `kernels.gemv_configs.INVARIANT` holds. No assertion about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

import torch
import torch.nn.functional as F

from services.worker.models import gdn, layers
from services.worker.models.kv_cache import KVCache

_OPS = ("linear", "rms_norm", "add_rms_norm", "rope", "swiglu")


@contextlib.contextmanager
def traced(record: list):
    """Every fused-path op appends (name, outputs) to `record` while inside."""
    from services.worker.models import dense, fused_linear, qwen35, qwen35_layers

    saved = []

    def wrap(name, fn):
        def inner(*args, **kwargs):
            out = fn(*args, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)
            record.append((name, [o.detach().clone() for o in outs if torch.is_tensor(o)]))
            return out
        return inner

    modules = (layers, fused_linear, gdn, dense, qwen35, qwen35_layers)
    for name in _OPS:
        original = getattr(layers, name)
        wrapped = wrap(name, original)
        for mod in modules:
            if getattr(mod, name, None) is original:
                saved.append((mod, name, original))
                setattr(mod, name, wrapped)
    for mod, name in ((gdn, "conv"), (KVCache, "attend"), (gdn.GatedRMSNorm, "forward")):
        original = getattr(mod, name)
        saved.append((mod, name, original))
        setattr(mod, name, wrap(f"{getattr(mod, '__name__', '')}.{name}", original))
    recur = gdn.GatedDeltaNet._recur
    saved.append((gdn.GatedDeltaNet, "_recur", recur))
    gdn.GatedDeltaNet._recur = wrap("gdn.recur", recur)
    try:
        yield record
    finally:
        for mod, name, original in reversed(saved):
            setattr(mod, name, original)


def _rows(t: torch.Tensor, tokens: int) -> torch.Tensor:
    # an op's output of a one-row forward of `tokens` tokens, one line per token
    return t.reshape(tokens, -1)


def _build(name: str, device: str):
    from bench.models import build_runtime

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if name in ("qwen3-8b-random", "qwen35-9b-random"):
        return build_runtime(name, device).model
    from bench.random_weights import ByteTokenizer, random_qwen3_runtime, random_qwen35
    from tests.support.common import byte_domain

    d = byte_domain()
    if name == "tiny-dense":
        return random_qwen3_runtime(d, ByteTokenizer(d), shape=TINY_DENSE, seed=3,
                                    dtype=dtype, device=device).model
    if name == "tiny-qwen35":
        return random_qwen35(vocab_size=d.size, mtp=True, seed=3, dtype=dtype, device=device,
                             **TINY_QWEN35)
    raise ValueError(name)


# Small models of the real architectures' head layout (head_dim 128 / 256, GQA 4), in bf16.
TINY_DENSE = {"hidden_size": 256, "intermediate_size": 512, "num_layers": 2, "num_heads": 8,
              "num_kv_heads": 2, "head_dim": 128}
TINY_QWEN35 = dict(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=1,
                   head_dim=256, rotary_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=128, linear_value_head_dim=128,
                   max_position_embeddings=4096,
                   layer_types=("linear_attention", "linear_attention", "linear_attention",
                                "full_attention"))


@torch.no_grad()
def trace(model, *, draft: int, prompt_len: int, max_len: int, seed: int,
          device: str = "cuda") -> dict:
    dev = torch.device(device)
    lanes_n = 6
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    state = model.new_state(lanes_n, max_len, dtype=dtype, device=dev,
                            verify_width=draft + 1)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (lanes_n, prompt_len), generator=gen)
    pos = torch.arange(prompt_len)[None]

    def fwd(tokens, positions, lanes):
        out = model(tokens.to(dev), positions.to(dev), state, torch.tensor(lanes).to(dev),
                    kv_len=max_len)
        state.commit(lanes, [tokens.shape[1]] * len(lanes))  # a hybrid state advances on commit
        return out

    for lane in reversed(range(lanes_n)):  # one row at a time: lanes 0 and 1 get the same bits
        logits = fwd(prompts[0 if lane == 1 else lane][None], pos, [lane])
    first = int(logits[0, -1].argmax())  # lane 0's
    decode_records, tokens, decode_logits = [], [first], []
    for j in range(draft + 1):
        rec: list = []
        with traced(rec):
            out = fwd(torch.tensor([[tokens[-1]]]), torch.tensor([[prompt_len + j]]), [0])
        decode_records.append(rec)
        decode_logits.append(out[0, -1].float())
        tokens.append(int(out[0, -1].argmax()))
    verify_rec: list = []
    with traced(verify_rec):
        vout = fwd(torch.tensor([tokens[:draft + 1]]),
                   torch.arange(prompt_len, prompt_len + draft + 1)[None], [1])
    result: dict = {"draft": draft, "prompt_len": prompt_len, "ops": len(verify_rec),
                    "first_difference": None, "differing_calls": {}, "calls": {}}
    if any(len(r) != len(verify_rec) for r in decode_records):
        result["error"] = "op sequences differ in length"
        return result
    for i, (name, outs) in enumerate(verify_rec):
        result["calls"][name] = result["calls"].get(name, 0) + 1
        differs = False
        for k, v in enumerate(outs):
            vr = _rows(v, draft + 1)
            for j in range(draft + 1):
                d = _rows(decode_records[j][i][1][k], 1)[0]
                if not torch.equal(vr[j], d):
                    differs = True
                    if result["first_difference"] is None:
                        diff = (vr[j].float() - d.float()).abs()
                        result["first_difference"] = {
                            "op_index": i, "op": name, "output": k, "position": j,
                            "shape": list(v.shape), "max_abs_diff": float(diff.max()),
                            "fraction_differing": float((diff > 0).float().mean())}
        if differs:
            result["differing_calls"][name] = result["differing_calls"].get(name, 0) + 1
    result["logits_equal"] = [bool(torch.equal(vout[0, j].float(), decode_logits[j]))
                              for j in range(draft + 1)]
    result["argmax_equal"] = [int(vout[0, j].argmax()) == tokens[j + 1] for j in range(draft + 1)]
    # batch invariance: lane 0's next decode step alone vs beside lanes 2..4 (then lane 0 again)
    nxt, p = torch.tensor([[tokens[-1]]]), prompt_len + draft + 1
    alone = fwd(nxt, torch.tensor([[p]]), [0])[0, -1].float()
    others = torch.randint(0, vocab, (3, 1), generator=gen)
    together = fwd(torch.cat([nxt, others]), torch.tensor([[p], [prompt_len]] + [[prompt_len]] * 2),
                   [0, 2, 3, 4])[0, -1].float()
    result["batch4_logits_equal"] = bool(torch.equal(alone, together))
    result["batch4_max_abs_diff"] = float((alone - together).abs().max())
    return result


def shapes_of(model) -> list[tuple[int, int]]:
    seen = []
    for p in model.parameters():
        if p.dim() == 2 and p.is_cuda and p.dtype == torch.bfloat16 and p.shape[0] > 64:
            key = tuple(p.shape)
            if key not in seen:
                seen.append(key)
    return seen


def sweep(shapes, budget: float, ms=(1, 8, 4, 32)) -> dict:
    from bench.gemv_sweep import Timer
    from kernels import gemv as G
    from kernels.gemv_configs import GemvConfig, invariant_config

    timer, out, deadline = Timer(20), {}, time.perf_counter() + budget
    for N, K in shapes:
        nbytes = N * K * 2
        copies = max(1, math.ceil((256 << 20) / nbytes))
        calls = max(copies, math.ceil((512 << 20) / nbytes))
        ws = [(torch.randn(N, K, device="cuda") * K ** -0.5).to(torch.bfloat16)
              for _ in range(copies)]
        default = invariant_config(N, K)
        cands = [default] + [GemvConfig(bn, 128, s, 4, st, "dot") for bn in (32, 64, 128)
                             for s in (1, 2, 4, 8) for st in (3, 4)]
        row: dict = {"N": N, "K": K, "F.linear_s": {}, "configs": []}
        xs = {M: torch.randn(M, K, device="cuda").to(torch.bfloat16) for M in ms}
        for M in ms:
            row["F.linear_s"][M] = timer(lambda i, x=xs[M]: F.linear(x, ws[i % copies]), calls)
        for c in dict.fromkeys(cands):
            if time.perf_counter() > deadline and c != default:
                break
            try:
                times = {M: timer(lambda i, x=xs[M], c=c: G.gemv(x, ws[i % copies], None, c),
                                  calls) for M in ms}
            except Exception as exc:  # a config out of resources
                print(f"  {c}: {type(exc).__name__}", flush=True)
                continue
            row["configs"].append(dict(c.as_dict(), default=c == default,
                                       **{f"M{M}_s": t for M, t in times.items()}))
        best = min(row["configs"], key=lambda r: r["M1_s"] + r["M8_s"])
        row["best"] = best
        lin = row["F.linear_s"]
        print(f"N={N} K={K} F.linear M1 {lin[1] * 1e6:.1f} M8 {lin[8] * 1e6:.1f} us | best "
              f"{best['block_n']}/{best['split']}/{best['num_stages']} M1 {best['M1_s'] * 1e6:.1f} "
              f"M8 {best['M8_s'] * 1e6:.1f} M4 {best['M4_s'] * 1e6:.1f} M32 "
              f"{best['M32_s'] * 1e6:.1f} (F.linear M32 {lin[32] * 1e6:.1f})", flush=True)
        out[f"{N}x{K}"] = row
        ws = None
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny-dense", "tiny-qwen35"])
    ap.add_argument("--draft", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--sweep-budget", type=float, default=0.0, help="seconds; 0: no sweep")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the tiny models")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    report: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "traces": {}, "sweep": {}}
    shapes: list = []
    for name in args.models:
        model = _build(name, args.device)
        if name.endswith("random"):
            shapes += [s for s in shapes_of(model) if s not in shapes]
        for on in (False, True):
            layers.WIDTH_INVARIANT = on
            t0 = time.perf_counter()
            r = trace(model, draft=args.draft, prompt_len=args.prompt_len,
                      max_len=args.max_len, seed=1, device=args.device)
            r["seconds"] = time.perf_counter() - t0
            report["traces"][f"{name}/{'on' if on else 'off'}"] = r
            print(name, "on" if on else "off", json.dumps(
                {k: r.get(k) for k in ("first_difference", "differing_calls", "logits_equal",
                                       "argmax_equal", "batch4_logits_equal")}), flush=True)
        layers.WIDTH_INVARIANT = False
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        model = None
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.sweep_budget > 0:
        report["sweep"] = sweep(shapes, args.sweep_budget)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
