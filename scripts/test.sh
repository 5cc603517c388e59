#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, runs ruff, then pytest. Tests
# that need Redis start their own redis-server on a free loopback port and stop it afterwards;
# tests marked `gpu` skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
# Lint first (pyproject.toml's [tool.ruff]): a style or pyflakes error fails the suite.
"${PYTHON:-python3}" -m ruff check services shared kernels bench tests loadtest scripts
# Two worker processes (pytest-xdist) share the two cores of a CI machine: a serial run leaves one
# idle while a test waits on a process it started or runs single-threaded Python. Each worker runs
# whole modules (their module-scoped servers start once).
# TEST_WORKERS=0 runs serially; arguments after it (`-n 4`, a path) override. The suite uses no
# pytest-benchmark; where one is installed its warning about xdist would be an error here.
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -p no:benchmark \
  -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
