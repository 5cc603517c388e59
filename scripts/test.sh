#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, then runs pytest. Tests that need
# Redis start their own redis-server on a free loopback port and stop it afterwards; tests marked
# `gpu` skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$@"
