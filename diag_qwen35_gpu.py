"""GPU diagnostic of the Qwen3.5 gap in tests/test_worker_models_qwen35.py::
test_prefill_and_decode_match_transformers[cuda-fp32 / cuda-bf16]. Needs torch, triton,
transformers, fla-core and this repo; writes everything into $OUT (results.json, rewritten after
every variant, and log.txt); about a minute on an H200.

    cd <repo> && OUT=/some/dir PYTHONPATH=$PWD python diag_qwen35_gpu.py

On the CPU (diag_qwen35_cuda_paths.py) every kernel, run under Triton's interpreter, matches the
reference to ~1e-5; emulating TF32 in fla-core's tl.dot reproduced the fp32 gap (0.0526 at scale
8.86, row 0 token 33). This script checks that on the GPU:

  fp32 and bf16, each against transformers' float32 CPU logits (the test's reference):
    ours                   the model as the test runs it (float32 prefill: the torch chunked form
                           since commit 439eca7; bf16: fla)
    fla_forced             gdn.chunk -> fla-core for every dtype (the behaviour before 439eca7)
    torch_chunk            gdn.chunk -> the torch chunked form (what INFERNIX_FLA=0 does)
    unfused                model.fused = False (the op-by-op torch norms / RoPE / SwiGLU)
    ref_step / ref_conv / ref_gated_norm / ref_kv   one CUDA component -> its torch reference
    all_ref                every component above at once (only torch on CUDA)
    fla_ieee               (child process, float32) ours and fla_forced with TRITON_F32_DEFAULT=ieee:
                           fla's dots without TF32
  the oracle itself: transformers bf16 on CUDA (its own fla path) and on CPU vs its float32 CPU;
  transformers fp32 on CUDA (its fla path) vs CPU.
  unit: fla's chunk_gated_delta_rule called as kernels/gdn.py calls it, against the float64
  token loop, at the tiny shapes (dk=16, dv=8, Hk=2, Hv=4, T=40, a padded row) and at dv=16/128.
Each variant is wrapped in try/except (the error is recorded; the others still run).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

OUT = os.environ.get("OUT") or tempfile.mkdtemp(prefix="diag_qwen35_")
os.makedirs(OUT, exist_ok=True)
DEV = os.environ.get("DIAG_DEVICE", "cuda")  # "cpu": a dry run of this script's plumbing
CHILD = os.environ.get("DIAG_CHILD")  # set in the fla_ieee child: run only `ours`
T0 = time.time()
RESULTS: dict = {}
LOG = open(os.path.join(OUT, "log_child.txt" if CHILD else "log.txt"), "a")


def log(msg: str) -> None:
    line = f"[{time.time() - T0:6.1f}s] {msg}"
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


def save() -> None:
    name = "results_child.json" if CHILD else "results.json"
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


SCHEDULE = ((40, 5, 0), (0, 9, 12), (1, 3, 1)) + ((1, 1, 1),) * 8
LANES = [3, 0, 1]


def sequences(lengths, seed):
    from tests.qwen35_support import VOCAB

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def compare(ours, ref):
    rows = []
    for b, (o, r) in enumerate(zip(ours, ref)):
        o, r = o.float().cpu(), r.float().cpu()
        scale = r.abs().max().item()
        err_t = (o - r).abs().amax(-1)
        rows.append({"row": b, "max_err": err_t.max().item(), "scale": scale, "rel": err_t.max().item() / scale,
                     "worst_token": int(err_t.argmax()),
                     "per_token_rel": [round(e / scale, 7) for e in err_t.tolist()]})
    return rows


def summary(rows) -> str:
    worst = max(rows, key=lambda r: r["rel"])
    return (f"max rel {worst['rel']:.3g} (abs {worst['max_err']:.3g}, scale {worst['scale']:.3g}, row "
            f"{worst['row']} token {worst['worst_token']}); per row " + ", ".join(f"{r['rel']:.2g}" for r in rows))


def record(name, fn):
    try:
        t = time.time()
        rows = fn()
        RESULTS[name] = rows
        text = summary(rows) if isinstance(rows, list) and rows and "rel" in rows[0] else \
            ("see above" if isinstance(rows, (list, dict)) else rows)
        log(f"{name:>28}: {text}  [{time.time() - t:.1f}s]")
    except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others
        RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        log(f"{name:>28}: FAILED {type(e).__name__}: {e}")
    save()


@contextlib.contextmanager
def patched(obj, name, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def torch_gated_norm(self, o, z):
    import torch.nn.functional as F

    B, T, hv, dv = o.shape
    x32 = F.rms_norm(o.float(), (dv,), eps=self.eps)
    out = (self.weight * x32.to(o.dtype)) * F.silu(z.reshape(B, T, hv, dv).float())
    return out.to(o.dtype)


def cpu_rows(self, lanes, positions, kv_len):
    """KVCache.rows' CPU branch (slots + SDPA) on CUDA tensors."""
    from services.worker.models import kv_cache as kv

    tables = self.block_table.index_select(0, lanes)
    bs = self.block_size
    pos = positions.long()
    blk = tables.long().gather(1, pos.clamp(min=0) // bs)
    slots = torch.where(pos >= 0, blk * bs + pos % bs, kv.TRASH_BLOCK * bs)
    blocks = tables[:, :kv.blocks_per_lane(kv_len, bs)].long()
    visible = (torch.arange(kv_len, device=pos.device)[None, None, :] <= pos[:, :, None])[:, None]
    return kv.PagedRows(tables, positions, kv_len, slots=slots, blocks=blocks, visible=visible)


def fla_direct(q, k, v, g, beta, initial):
    """fla-core's kernel called as kernels/gdn.py gdn_chunk called it before float32 was routed to
    the torch form (commit 439eca7): for every dtype."""
    from kernels.gdn import _fla_chunk

    fla = _fla_chunk()
    if fla is None:
        raise RuntimeError("fla-core not importable (or INFERNIX_FLA=0)")
    o, final = fla(q.to(v.dtype), k.to(v.dtype), v, g, beta.to(v.dtype), scale=1.0, initial_state=initial,
                   output_final_state=True)
    return o.to(v.dtype), final.float()


def model_variants():
    from kernels import gdn_ref
    from services.worker.models import gdn as gdn_mod
    from services.worker.models import kv_cache as kv_mod

    return {
        "ours": [],
        "fla_forced": [(gdn_mod, "chunk", fla_direct)],
        "torch_chunk": [(gdn_mod, "chunk", gdn_ref.chunk_gated_delta_rule_ref)],
        "unfused": ["unfused"],
        "ref_step": [(gdn_mod, "step", lambda *a, **k: gdn_ref.gdn_step_ref(*a, **k))],
        "ref_conv": [(gdn_mod, "conv", gdn_ref.causal_conv1d_indexed_ref)],
        "ref_gated_norm": [(gdn_mod.GatedRMSNorm, "forward", torch_gated_norm)],
        "ref_kv": [(kv_mod.KVCache, "rows", cpu_rows)],
        "all_ref": ["unfused", (gdn_mod, "chunk", gdn_ref.chunk_gated_delta_rule_ref),
                    (gdn_mod, "step", lambda *a, **k: gdn_ref.gdn_step_ref(*a, **k)),
                    (gdn_mod, "conv", gdn_ref.causal_conv1d_indexed_ref),
                    (gdn_mod.GatedRMSNorm, "forward", torch_gated_norm), (kv_mod.KVCache, "rows", cpu_rows)],
    }


def run_ours(model, seqs, dtype, patches):
    from tests.qwen35_support import run_schedule

    with contextlib.ExitStack() as st:
        fused = model.fused
        if "unfused" in patches:
            model.fused = False
        try:
            for p in patches:
                if p != "unfused":
                    st.enter_context(patched(*p))
            state = model.new_state(5, 64, dtype=dtype, device=DEV)
            out = run_schedule(model, state, LANES, seqs, SCHEDULE, device=DEV)
            if DEV == "cuda":
                torch.cuda.synchronize()
            return out
        finally:
            model.fused = fused


def fla_unit():
    """fla's chunk kernel as kernels/gdn.py calls it (fla_direct) vs the float64 loop, per dtype and dv."""
    import torch.nn.functional as F

    from kernels import gdn as kgdn
    from kernels.gdn_ref import gated_delta_rule_ref

    fla = kgdn._fla_chunk()
    if fla is None:
        return "fla not importable (or INFERNIX_FLA=0)"
    out = []
    for dv in (8, 16, 128):
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(dv)
            B, T, hk, hv, dk = 2, 40, 2, 4, 16
            q = F.normalize(torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64), dim=-1) * dk ** -0.5
            k = F.normalize(torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64), dim=-1)
            v = torch.randn(B, T, hv, dv, generator=g, dtype=torch.float64)
            gate = -torch.rand(B, T, hv, generator=g, dtype=torch.float64) * 2
            beta = torch.rand(B, T, hv, generator=g, dtype=torch.float64)
            gate[1, 5:], beta[1, 5:] = 0, 0  # row 1: 5 real tokens, right-padded (as the test's step 0)
            s0 = torch.randn(B, hv, dk, dv, generator=g, dtype=torch.float64)
            o_ref, s_ref = gated_delta_rule_ref(q, k, v, gate, beta, s0)
            c = (lambda x, dt: x.to(DEV, dt))
            o, s = fla_direct(c(q, torch.float32), c(k, torch.float32), c(v, dtype), c(gate, torch.float32),
                              c(beta, torch.float32), c(s0, torch.float32))
            if DEV == "cuda":
                torch.cuda.synchronize()
            o_err = (o.double().cpu() - o_ref).abs().max().item() / o_ref.abs().max().item()
            s_err = (s.double().cpu() - s_ref).abs().max().item() / s_ref.abs().max().item()
            pad_err = (s[1].double().cpu() - gated_delta_rule_ref(q[1:, :5], k[1:, :5], v[1:, :5], gate[1:, :5],
                                                                 beta[1:, :5], s0[1:])[1][0]).abs().max().item()
            out.append({"dv": dv, "dtype": str(dtype), "o_rel": o_err, "state_rel": s_err,
                        "padded_row_state_abs": pad_err})
            log(f"    fla unit dv={dv:>3} {str(dtype):>14}: o rel {o_err:.3g}, state rel {s_err:.3g}, "
                f"padded row state abs {pad_err:.3g}")
    return out


def main():
    from tests.qwen35_support import hf_causal_lm, reference_logits
    from services.worker.models.qwen35_loading import load_qwen35_model

    import triton
    import transformers

    try:
        import fla

        fla_version = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        fla_version = f"not importable: {e}"
    RESULTS["env"] = {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
                      "fla": fla_version, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                      "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                      "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                      "float32_matmul_precision": torch.get_float32_matmul_precision(),
                      "TRITON_F32_DEFAULT": os.environ.get("TRITON_F32_DEFAULT"),
                      "INFERNIX_FLA": os.environ.get("INFERNIX_FLA"), "child": CHILD}
    log(f"env: {RESULTS['env']}")
    lengths = [sum(step[b] for step in SCHEDULE) for b in range(3)]
    seqs = sequences(lengths, seed=1)
    path = tempfile.mkdtemp(prefix="qwen35_tiny_")
    hf = hf_causal_lm(seed=0)
    hf.save_pretrained(path)
    ref = reference_logits(hf, seqs)  # float32 CPU, transformers' torch rule
    log(f"reference scales per row: {[round(r.abs().max().item(), 3) for r in ref]}")
    variants = model_variants()
    names = ["ours", "fla_forced"] if CHILD else list(variants)
    dtypes = ((torch.float32, "fp32"),) if CHILD else ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
    for dtype, tag in dtypes:  # (the child: float32 only, where TF32 matters)
        try:
            model, _ = load_qwen35_model(path, dtype, DEV)
        except Exception as e:  # noqa: BLE001
            RESULTS[f"{tag}/load"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log(f"{tag} load FAILED: {e}")
            continue
        for name in names:
            record(f"{tag}/{name}", lambda: compare(run_ours(model, seqs, dtype, variants[name]), ref))
        del model
        if CHILD:
            continue
        if tag == "fp32":
            record("fla_unit", fla_unit)
    if CHILD:
        return
    # the oracle's own error: transformers in bf16 (CUDA, its fla path; CPU, torch) and fp32 on CUDA
    def hf_run(dev, dtype, torch_rule):
        m = hf_causal_lm(seed=0).to(device=dev, dtype=dtype)
        out = []
        with torch.no_grad(), (torch_gated_delta_rule() if torch_rule else contextlib.nullcontext()):
            for s in seqs:
                out.append(m(input_ids=torch.tensor([s], device=dev), use_cache=False).logits[0].float().cpu())
        return compare(out, ref)

    from tests.qwen35_support import torch_gated_delta_rule

    record("transformers/cuda-fp32 (its fla path)", lambda: hf_run(DEV, torch.float32, False))
    record("transformers/cuda-fp32 (torch rule)", lambda: hf_run(DEV, torch.float32, True))
    record("transformers/cuda-bf16 (its fla path)", lambda: hf_run(DEV, torch.bfloat16, False))
    record("transformers/cuda-bf16 (torch rule)", lambda: hf_run(DEV, torch.bfloat16, True))
    record("transformers/cpu-bf16", lambda: hf_run("cpu", torch.bfloat16, True))

    # ours with fla's float32 dots in IEEE (no TF32): a child process, the knob read at compile time
    def child():
        env = dict(os.environ, DIAG_CHILD="1", TRITON_F32_DEFAULT="ieee",
                   TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton_ieee_"))
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True,
                                  text=True, timeout=max(30, 110 - (time.time() - T0)))
            text = proc.stdout + "\n--- stderr ---\n" + proc.stderr[-20000:]
        except subprocess.TimeoutExpired as e:  # keep what the child wrote so far
            text = f"TIMEOUT after {e.timeout:.0f}s\n{e.stdout or ''}\n--- stderr ---\n{(e.stderr or '')[-20000:]}"
        with open(os.path.join(OUT, "child_stdout.txt"), "w") as f:
            f.write(text if isinstance(text, str) else str(text))
        with open(os.path.join(OUT, "results_child.json")) as f:
            res = json.load(f)
        for k in ("fp32/ours", "fp32/fla_forced"):
            if isinstance(res.get(k), list):
                log(f"{'fla_ieee ' + k:>28}: {summary(res[k])}")
        return {k: v for k, v in res.items() if k != "env"}

    record("fla_ieee (TRITON_F32_DEFAULT=ieee)", child)
    log("done")


if __name__ == "__main__":
    main()
