"""The kernel benchmark script runs end to end (tiny shapes, Triton's interpreter on the CPU), so
the lead's GPU run of `python -m bench.kernel_speed` does not fail on a typo; its outputs agree
across implementations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_bench_script_writes_every_case(tmp_path):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "bench.kernel_speed", "--tiny", "--out",
                           str(out)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    kernels = {r["kernel"] for r in data["results"]}
    assert {
        "rms_norm",
        "add_rms_norm",
        "qk_norm_q_view",
        "rope_q_k",
        "swiglu",
        "attention",
        "write_kv",
        "qkv_prepare",
        "attention_tuning",
        "attention_prefill",
        "sample_greedy_masked",
        "sample_topk50_masked",
        "sample_greedy_fused_unconstrained",
        "sample_greedy_fused_masked",
        "accept_greedy",
        "accept_onehot_T0.8_topk50",
        "accept_sparse16_T0.8_topk50",
    } <= kernels
    for r in data["results"]:
        assert r["us_eager"] > 0
        if r["max_abs_diff"] is not None:  # bf16 outputs: within a rounding step or two
            assert r["max_abs_diff"] <= 0.07, r
        if r["kernel"].startswith(("sample", "accept")) and r["max_abs_diff"] is not None:
            assert r["max_abs_diff"] == 0.0, r  # the same tokens
    assert data["ratios_to_kernel"]
