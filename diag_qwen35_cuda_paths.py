"""Diagnostic (CPU only): which CUDA-only component of our Qwen3.5 model moves its logits away from
transformers' float32 CPU reference?

Runs the schedule of tests/test_worker_models_qwen35.py::test_prefill_and_decode_match_transformers
on the tiny checkpoint, first on our plain CPU path, then with ONE component at a time dispatched to
its Triton kernel running on the CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, set
below before triton is imported), and finally all of them together. The interpreter has no TF32
and no autotuning, so a gap that shows here is a logic bug; no gap here points at something
GPU-specific.

    cd /work/wt-q35diag && PYTHONPATH=$PWD /tmp/v/bin/python diag_qwen35_cuda_paths.py [variant ...]

patch_interpreter_dot (see there) makes bf16 tl.dot correct under the interpreter and, with
DIAG_TF32=rna|trunc, emulates TF32 tensor-core dots.

DIAG_DTYPE=bf16 runs the model (and its state) in bfloat16 and also reports transformers' own
bfloat16 error and each variant against our CPU bfloat16 path. DIAG_JSON=file writes all numbers.

fla-core (for the `fla_chunk` variant) is taken from FLA_SITE (default /tmp/flasite: fla-core 0.6.0
+ einops installed with `pip install --no-deps --target`), put on sys.path only after the reference
and the other variants ran. Under the interpreter fla needs two workarounds: Triton's autotuner
cannot benchmark without a driver (its benchmark is stubbed: every config ties, the first wins;
FLA_CONFIG=i picks config i instead), and fla's `i_t.to(tl.int64)` on a Python loop index fails in
the interpreter (patch the copy in FLA_SITE: sed 's/\\bi_t\\.to(tl\\.int64)/tl.cast(i_t, tl.int64)/').
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported

import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

from services.worker.models import gdn as gdn_mod  # noqa: E402
from services.worker.models import kv_cache as kv_mod  # noqa: E402
from services.worker.models import layers as ops  # noqa: E402
from services.worker.models.qwen35_loading import load_qwen35_model  # noqa: E402
from tests.qwen35_support import VOCAB, hf_causal_lm, reference_logits, run_schedule  # noqa: E402

DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}[os.environ.get("DIAG_DTYPE", "fp32")]
SCHEDULE = ((40, 5, 0), (0, 9, 12), (1, 3, 1)) + ((1, 1, 1),) * 8
LANES = [3, 0, 1]


def sequences(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


# ---- the torch forms of models/layers.py, kept when uses_kernels is forced True for one op ----
_orig = {name: getattr(ops, name) for name in ("uses_kernels", "rms_norm", "add_rms_norm", "rope", "swiglu")}


def _torch_rms_norm(x, weight, eps, *, zero_centered=False):
    from kernels.norms_ref import rms_norm_ref
    import torch.nn.functional as F

    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight + 1.0 if zero_centered else weight, eps)
    return rms_norm_ref(x, weight, eps, zero_centered=zero_centered)


def _torch_add_rms_norm(x, residual, weight, eps, *, zero_centered=False):
    h = x + residual
    return _torch_rms_norm(h, weight, eps, zero_centered=zero_centered), h


def _torch_rope(q, k, cos, sin):
    from kernels.rope_ref import rope_ref

    return rope_ref(q, cos, sin), rope_ref(k, cos, sin)


def _torch_swiglu(gate_up):
    from kernels.swiglu_ref import swiglu_ref

    return swiglu_ref(gate_up)


def _kernel_rms_norm(x, weight, eps, *, zero_centered=False):
    from kernels.norms import rms_norm

    return rms_norm(x, weight, eps, zero_centered=zero_centered)


def _kernel_add_rms_norm(x, residual, weight, eps, *, zero_centered=False):
    from kernels.norms import add_rms_norm

    return add_rms_norm(x, residual, weight, eps, zero_centered=zero_centered)


def _kernel_rope(q, k, cos, sin):
    from kernels.rope import apply_rope_

    apply_rope_(q, k, cos, sin)
    return q, k


def _kernel_swiglu(gate_up):
    from kernels.swiglu import swiglu

    return swiglu(gate_up)


@contextlib.contextmanager
def patched(obj, name, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextlib.contextmanager
def layer_ops(norms=False, rope=False, swiglu=False):
    """Force the fused (kernel) gates of qwen35_layers / layers.py open (uses_kernels -> True) and
    route each op to its Triton kernel or to its torch form."""
    with contextlib.ExitStack() as st:
        st.enter_context(patched(ops, "uses_kernels", lambda x: x.dtype in ops._KERNEL_DTYPES))
        st.enter_context(patched(ops, "rms_norm", _kernel_rms_norm if norms else _torch_rms_norm))
        st.enter_context(patched(ops, "add_rms_norm", _kernel_add_rms_norm if norms else _torch_add_rms_norm))
        st.enter_context(patched(ops, "rope", _kernel_rope if rope else _torch_rope))
        st.enter_context(patched(ops, "swiglu", _kernel_swiglu if swiglu else _torch_swiglu))
        yield


def _kernel_step(y, a, b, A_log, dt_bias, state, src, dst, reset, counts, skip=None, *, num_k_heads, key_dim,
                 want_out=True):
    from kernels.gdn import gdn_step

    return gdn_step(y, a, b, A_log, dt_bias, state, src, dst, reset, counts, skip, num_k_heads=num_k_heads,
                    key_dim=key_dim, want_out=want_out)


def _kernel_conv(x, windows, weight, src, dst, reset, counts):
    from kernels.conv import causal_conv1d

    assert weight.shape[1] == 4
    return causal_conv1d(x, windows, weight, src, dst, reset, counts)


def _kernel_gated_norm(self, o, z):
    from kernels.gdn_norm import gated_rmsnorm

    B, T, hv, dv = o.shape
    return gated_rmsnorm(o.reshape(B * T, hv, dv), z.reshape(B * T, hv * dv), self.weight, self.eps).view(B, T, hv, dv)


def _kernel_rows(self, lanes, positions, kv_len):
    tables = self.block_table.index_select(0, lanes)
    return kv_mod.PagedRows(tables, positions, kv_len)


def _fla_chunk_call(q, k, v, g, beta, initial):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # exactly kernels/gdn.py gdn_chunk's call
    o, final = chunk_gated_delta_rule(q.to(v.dtype), k.to(v.dtype), v, g, beta.to(v.dtype), scale=1.0,
                                      initial_state=initial, output_final_state=True)
    return o.to(v.dtype), final.float()


def patch_interpreter_dot():
    """Triton 3.9's interpreter multiplies bfloat16 tl.dot operands as their uint16 bit patterns
    (interpreter.py create_dot: np.matmul on the raw storage), so any bf16 tl.dot (all of fla's)
    is garbage there; our own kernels avoid it (paged_attention's F32_DOT). Here bf16/fp16
    operands are widened to float32 first. DIAG_TF32=rna|trunc also rounds float32 operands of
    dots that are not input_precision="ieee" to TF32 (10 mantissa bits; round to nearest, ties
    away, as cvt.rna.tf32.f32 does, or truncation, as an MMA reading raw fp32 does): an estimate,
    on the CPU, of what TF32 tensor-core dots do to the result on the GPU."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    mode = os.environ.get("DIAG_TF32", "")
    seen = set()

    def widen(h):
        if h.dtype.scalar == tl.bfloat16:
            return (h.data.astype(np.uint32) << 16).view(np.float32)
        if h.dtype.scalar == tl.float16:
            return h.data.astype(np.float32)
        return h.data

    def tf32(x):
        bits = x.astype(np.float32).view(np.uint32)
        if mode == "rna":
            bits = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
        else:
            bits = bits & np.uint32(0xFFFFE000)
        return bits.view(np.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            return orig(self, a, b, d, input_precision, max_num_imprecise_acc)
        ad, bd = widen(a), widen(b)
        prec = str(input_precision)
        if prec not in seen:
            seen.add(prec)
            print(f"  [interpreter dot: input_precision {prec}, operands {a.dtype.scalar}]", flush=True)
        if mode and a.dtype.scalar == tl.float32 and "IEEE" not in prec.upper():
            ad, bd = tf32(ad), tf32(bd)
        acc = np.matmul(ad, bd, dtype=np.float32) + widen(d)
        if d.dtype.scalar == tl.bfloat16:  # back to bf16 storage, round to nearest even
            bits = acc.astype(np.float32).view(np.uint32)
            bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
            return it.TensorHandle(bits.astype(np.uint16), d.dtype.scalar)
        return it.TensorHandle(acc.astype(d.data.dtype), d.dtype.scalar)

    orig = it.InterpreterBuilder.create_dot
    it.InterpreterBuilder.create_dot = create_dot


def _stub_autotuner():
    import triton.runtime.autotuner as at

    pick = os.environ.get("FLA_CONFIG")
    if pick is None:
        at.Autotuner.do_bench = property(lambda self: (lambda fn, quantiles=None, **kw: [0.0, 0.0, 0.0]))
        return
    # config `pick` (modulo the number of pruned configs) wins every tuning
    state = {}

    def bench(self, *args, config, **kwargs):
        key = id(self)
        i = state.setdefault(key, [0])
        i[0] += 1
        return [0.0 if (i[0] - 1) == int(pick) else 1.0] * 3

    at.Autotuner._bench = bench


@contextlib.contextmanager
def variant(name):
    """Dispatch one component (or all) to its Triton kernel under the interpreter."""
    with contextlib.ExitStack() as st:
        comps = set(name.split("+")) if name != "all" else {"gdn_step", "conv", "gated_norm", "norms", "rope",
                                                           "swiglu", "paged_kv"}
        if "fla_chunk" in comps or name == "all_fla":
            comps |= {"fla_chunk"}
            if name == "all_fla":
                comps |= {"gdn_step", "conv", "gated_norm", "norms", "rope", "swiglu", "paged_kv"}
        if "gdn_step" in comps:
            st.enter_context(patched(gdn_mod, "step", _kernel_step))
        if "conv" in comps:
            st.enter_context(patched(gdn_mod, "conv", _kernel_conv))
        if "gated_norm" in comps:
            st.enter_context(patched(gdn_mod.GatedRMSNorm, "forward", _kernel_gated_norm))
        if comps & {"norms", "rope", "swiglu"}:
            st.enter_context(layer_ops("norms" in comps, "rope" in comps, "swiglu" in comps))
        if "layers_gate" in comps:  # the fused gates open, every op in its torch form
            st.enter_context(layer_ops())
        if "paged_kv" in comps:
            st.enter_context(patched(kv_mod.KVCache, "rows", _kernel_rows))
        if "fla_chunk" in comps:
            st.enter_context(patched(gdn_mod, "chunk", _fla_chunk_call))
        yield


def compare(ours, ref):
    """Per row: max |ours - ref| / scale (scale = the row's largest |ref|), and the worst token."""
    rows = []
    for b, (o, r) in enumerate(zip(ours, ref)):
        scale = r.abs().max().item()
        err_t = (o - r).abs().amax(-1)  # per token
        t = int(err_t.argmax())
        rows.append({"row": b, "max_err": err_t.max().item(), "scale": scale, "rel": err_t.max().item() / scale,
                     "worst_token": t, "tokens": len(err_t),
                     "per_token_rel": [round(e / scale, 8) for e in err_t.tolist()]})
    return rows


def main(argv):
    variants = argv or ["layers_gate", "gdn_step", "conv", "gated_norm", "norms", "rope", "swiglu", "paged_kv",
                        "all", "fla_chunk", "all_fla"]
    lengths = [sum(step[b] for step in SCHEDULE) for b in range(3)]
    seqs = sequences(lengths, seed=1)
    with tempfile.TemporaryDirectory() as path:
        hf = hf_causal_lm(seed=0)
        hf.save_pretrained(path)
        ref = reference_logits(hf, seqs)
        model, _ = load_qwen35_model(path, DTYPE, "cpu")
    results = {}
    if DTYPE != torch.float32:  # the oracle's own error in this dtype (transformers on CPU)
        hf_low = hf.to(DTYPE)
        low = reference_logits(hf_low, seqs)
        rows = compare(low, ref)
        results["transformers_" + str(DTYPE)] = rows
        print(f"transformers {DTYPE} vs its float32: max rel err {max(r['rel'] for r in rows):.3g}; per row "
              + ", ".join(f"{r['rel']:.2g}" for r in rows), flush=True)
    base = {}

    def run(name):
        t0 = time.time()
        state = model.new_state(5, 64, dtype=DTYPE, device="cpu")
        with variant(name):
            ours = run_schedule(model, state, LANES, seqs, SCHEDULE, device="cpu")
        rows = compare(ours, ref)
        if name == "cpu":
            base["cpu"] = ours
        elif DTYPE != torch.float32:  # also against our own torch path in the same dtype
            vs = compare(ours, base["cpu"])
            for r, v in zip(rows, vs):
                r["rel_vs_our_cpu"] = v["rel"]
            print(f"{'':>12}  vs our CPU {DTYPE} path: per row " + ", ".join(f"{v['rel']:.2g}" for v in vs))
        results[name] = rows
        worst = max(rows, key=lambda r: r["rel"])
        print(f"{name:>12}: max rel err {worst['rel']:.3g} (row {worst['row']} token {worst['worst_token']}, "
              f"abs {worst['max_err']:.3g}, scale {worst['scale']:.3g}); per row "
              + ", ".join(f"{r['rel']:.2g}" for r in rows) + f"  [{time.time() - t0:.0f}s]", flush=True)

    patch_interpreter_dot()
    run("cpu")
    for name in variants:
        if "fla" in name:
            site = os.environ.get("FLA_SITE", "/tmp/flasite")
            if site not in sys.path:
                sys.path.insert(0, site)
            _stub_autotuner()
        try:
            run(name)
        except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others
            import traceback

            traceback.print_exc()
            print(f"{name:>12}: FAILED {type(e).__name__}: {e}", flush=True)
            results[name] = {"error": f"{type(e).__name__}: {e}"}
    out = os.environ.get("DIAG_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
