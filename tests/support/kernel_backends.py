"""How kernel tests run one scenario on several backends (see
tests/kernels/test_kernels_sampling.py).

`reference` runs the plain-torch reference in this process; `interpreter` runs the Triton kernels
under TRITON_INTERPRET=1 on the CPU, which must be set before triton is first imported, so it only
exists inside a child pytest that `run_interpreted` starts; `cuda` runs the compiled kernels and is
marked gpu (skipped without CUDA).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def backend_params() -> list:
    """pytest params for a `backend` fixture: the backend name and its torch device."""
    if INTERPRETED:
        return [pytest.param(("interpreter", "cpu"), id="interpreter")]
    return [pytest.param(("reference", "cpu"), id="reference"),
            pytest.param(("cuda", "cuda"), id="cuda", marks=pytest.mark.gpu)]


def run_interpreted(test_file: str, timeout: float = 300) -> None:
    """Run the file's `interpreter` cases in a fresh interpreted pytest; fail with its output."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-q", "-x",
                           "-k", "interpreter and not under_interpreter", "-p", "no:cacheprovider"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().split("\n")[-1]
    assert " passed" in last and "skipped" not in last, last
