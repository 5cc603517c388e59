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
# child's start (torch, Triton, the collection) is paid once, not once per file. Under
# pytest-xdist the workers share that run through a locked file (whichever asks first runs it).
SESSION_FILES: list[str] = []
SHARED_DIR: list[Path] = []  # under xdist: the workers' common temporary directory (pytest's)
_RUNS: dict[str, dict] = {}  # file -> the child run that ran it (status, output, cases by file)


def _run_child(files: list[str], timeout: float) -> dict:
    """One interpreted pytest over `files`: its exit status (None: timed out), output tail and
    each case's (name, outcome, detail) by file, from its JUnit XML."""
    import tempfile
    import xml.etree.ElementTree as ET

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    run: dict = {"status": None, "output": "", "cases": {f: [] for f in files}}
    with tempfile.TemporaryDirectory(prefix="infernix-interpreted-") as tmp:
        report = Path(tmp) / "report.xml"
        with subprocess.Popen([sys.executable, "-m", "pytest", *files, "-q",
                               "-k", "interpreter and not under_interpreter",
                               "-p", "no:cacheprovider", f"--junitxml={report}",
                               "-o", "junit_family=xunit1"],
                              cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            _LIVE.append(proc)
            try:
                out, err = proc.communicate(timeout=timeout)
                run["status"] = proc.returncode
                run["output"] = out[-6000:] + err[-3000:]
            except subprocess.TimeoutExpired:  # every file's test fails, once
                proc.kill()
                out, _ = proc.communicate()
                run["output"] = f"timed out after {timeout:.0f} s: {out[-6000:]}"
            finally:
                _LIVE.remove(proc)
        for case in ET.parse(report).getroot().iter("testcase") if report.exists() else ():
            outcome, detail = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = child.tag
                    detail = (child.get("message") or "") + "\n" + (child.text or "")[-3000:]
            path = str((root / case.get("file", "")).resolve())
            run["cases"].setdefault(path, []).append((case.get("name", ""), outcome, detail))
    return run


def _shared_run(files: list[str], timeout: float) -> dict:
    """`_run_child(files)`, once per test run: xdist workers (one PYTEST_XDIST_TESTRUNUID) take
    a lock; the first runs the child and leaves its result for the others."""
    import fcntl
    import hashlib
    import json
    import tempfile

    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return _run_child(files, timeout)
    key = hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]
    base = SHARED_DIR[0] if SHARED_DIR else Path(tempfile.gettempdir())
    shared = base / f"infernix-interpreted-{uid}"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = shared / f"{key}.json"
        if result.exists():
            return json.loads(result.read_text())
        run = _run_child(files, timeout)
        result.write_text(json.dumps(run))
        return run


_SESSION_RUN: list = []  # the Future of the session's shared run, once started
_LIVE: list[subprocess.Popen] = []  # child runs still going


def end_session_run(interrupted: bool) -> None:
    """At the end of a session: an interrupted one kills a child run still going; any other waits
    for it, since another xdist worker may be waiting for its result."""
    if interrupted:
        for proc in list(_LIVE):
            proc.kill()
    elif _SESSION_RUN:
        _SESSION_RUN[0].exception()  # waits; a failure is the tests' to report


def start_session_run(timeout_per_file: float = 600) -> None:
    """Start the shared run of SESSION_FILES in a background thread (tests/conftest.py, once
    collected), so that the child works while the other tests run instead of while they wait."""
    import threading
    from concurrent.futures import Future

    files = list(SESSION_FILES)
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(_shared_run(files, timeout_per_file * len(files)))
        except BaseException as error:  # noqa: BLE001 - handed to the test that waits
            future.set_exception(error)

    threading.Thread(target=work, name="interpreted-run", daemon=True).start()
    _SESSION_RUN[:] = [future]


def run_interpreted(test_file: str, timeout: float = 300) -> None:
    """Run the file's `interpreter` cases in a fresh interpreted pytest (shared with the session's
    other such files; `timeout` bounds each file's share); fail with their failures or output."""
    path = str(Path(test_file).resolve())
    if path not in _RUNS:
        if path in SESSION_FILES and _SESSION_RUN:
            run = _SESSION_RUN[0].result()
            _RUNS.update(dict.fromkeys(SESSION_FILES, run))
        else:
            files = SESSION_FILES if path in SESSION_FILES else [path]
            _RUNS.update(dict.fromkeys(files, _shared_run(files, timeout * len(files))))
    run = _RUNS[path]
    cases = run["cases"].get(path, [])
    bad = [c for c in cases if c[1] != "passed"]
    assert cases and not bad, bad or run["output"]
    failed = any(c[1] != "passed" for found in run["cases"].values() for c in found)
    # 0: all passed; 1: some case failed (another file's, reported by that file's test)
    assert run["status"] == 0 or (run["status"] == 1 and failed), (run["status"], run["output"])
