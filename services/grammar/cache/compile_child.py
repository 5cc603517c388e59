"""The compile child: `python -m services.grammar.cache.compile_child`, one per cold-compile slot.

It reads length-prefixed pickled messages on stdin and answers on the stdout it had at start
(file descriptor 1 is pointed at stderr, so nothing a library prints can corrupt the protocol):

    parent -> child  ("init", TokenDomain, StorePolicy)       child -> ("ready", None)
    parent -> child  ("compile", constraint, want)             child -> ("compiled", compile_ms)
                                                               child -> ("built", (BuildInfo,
                                                                                   blob | None))
                                                  or instead   child -> ("error", error dict)

`want` is "always" (the caller needs the grammar itself: it is serialised whatever the policy),
"stored" (the blob only when the store policy keeps it; serialised only when it might) or "never"
(the verdict of the footprint alone). The parent (`isolation.py`) enforces the deadline and
the memory budget by killing this process; it also dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
from typing import Any, BinaryIO

_LEN = struct.Struct("<Q")


def write_message(out: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LEN.pack(len(data)))
    out.write(data)
    out.flush()


def _read_exact(inp: BinaryIO, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = inp.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(inp: BinaryIO) -> Any:
    """The next message, or None at end of input (the parent closed the pipe or died)."""
    head = _read_exact(inp, _LEN.size)
    if head is None:
        return None
    body = _read_exact(inp, _LEN.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe ends us between compiles
        pass


def main() -> int:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    _die_with_parent()

    from services.grammar.cache import records
    from services.grammar.compiler import ModelCompiler
    from shared.errors import InfernixError, InternalError

    init = read_message(inp)
    if init is None:
        return 0
    _, domain, policy = init
    compiler = ModelCompiler(domain)
    compiler.warm()  # the vocabulary indexes, built once, before "ready"
    write_message(out, ("ready", None))
    while True:
        message = read_message(inp)
        if message is None:
            return 0
        _, constraint, want = message
        try:
            outcome = compiler.compile(constraint)
        except InfernixError as exc:
            write_message(out, ("error", exc.to_dict()))
            continue
        except Exception as exc:  # noqa: BLE001 - a converter bug: reported as internal
            error = InternalError(f"grammar compile failed: {type(exc).__name__}: {exc}"[:500])
            write_message(out, ("error", error.to_dict()))
            continue
        size = records.footprint(outcome.grammar)
        write_message(out, ("compiled", outcome.compile_ms))
        info = records.BuildInfo(outcome.compile_ms, size, False)
        blob = None
        if want == "always" or (want == "stored"
                                and policy.worth_serializing(outcome.compile_ms, size)):
            blob, serialized = records.serialize_sized(outcome.grammar)
            info = records.BuildInfo(
                outcome.compile_ms,
                size,
                policy.should_store(outcome.compile_ms, serialized),
                serialized,
            )
        if want != "always" and not info.stored:
            blob = None
        write_message(out, ("built", (info, blob)))
        del outcome


if __name__ == "__main__":
    sys.exit(main())
