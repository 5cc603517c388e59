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


# Files whose `*_under_interpreter` test this session runs (tests/conftest.py records them at
# collection): the first such test runs all their interpreter cases in one child pytest, so the
# child's start (torch, Triton, the collection) is paid once, not once per file.
SESSION_FILES: list[str] = []
_CHILDREN: dict[str, "_Child"] = {}  # file -> the child run that ran it


class _Child:
    """One interpreted pytest over `files`: its exit status, output tail and each case's outcome
    by file (from its JUnit XML)."""

    def __init__(self, files: list[str], timeout: float) -> None:
        import tempfile
        import xml.etree.ElementTree as ET

        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
        self.cases: dict[str, list[tuple[str, str, str]]] = {f: [] for f in files}
        with tempfile.TemporaryDirectory(prefix="infernix-interpreted-") as tmp:
            report = Path(tmp) / "report.xml"
            try:
                proc = subprocess.run([sys.executable, "-m", "pytest", *files, "-q",
                                       "-k", "interpreter and not under_interpreter",
                                       "-p", "no:cacheprovider", f"--junitxml={report}",
                                       "-o", "junit_family=xunit1"],
                                      cwd=root, env=env, capture_output=True, text=True,
                                      timeout=timeout)
                self.status: int | None = proc.returncode
                self.output = proc.stdout[-6000:] + proc.stderr[-3000:]
            except subprocess.TimeoutExpired as expired:  # every file's test fails, once
                self.status = None
                self.output = f"timed out after {timeout:.0f} s: {expired.output!r}"[-6000:]
            for case in ET.parse(report).getroot().iter("testcase") if report.exists() else ():
                outcome, detail = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = child.tag
                        detail = (child.get("message") or "") + "\n" + (child.text or "")[-3000:]
                path = str((root / case.get("file", "")).resolve())
                self.cases.setdefault(path, []).append((case.get("name", ""), outcome, detail))

    def check(self, path: str) -> None:
        cases = self.cases.get(path, [])
        bad = [c for c in cases if c[1] != "passed"]
        assert cases and not bad, bad or self.output
        failed = any(c[1] != "passed" for run in self.cases.values() for c in run)
        # 0: all passed; 1: some case failed (another file's, reported by that file's test)
        assert self.status == 0 or (self.status == 1 and failed), self.output


def run_interpreted(test_file: str, timeout: float = 300) -> None:
    """Run the file's `interpreter` cases in a fresh interpreted pytest (shared with the session's
    other such files; `timeout` bounds each file's share); fail with their failures or output."""
    path = str(Path(test_file).resolve())
    if path not in _CHILDREN:
        files = SESSION_FILES if path in SESSION_FILES else [path]
        child = _Child(files, timeout * len(files))
        _CHILDREN.update(dict.fromkeys(files, child))
    _CHILDREN[path].check(path)
