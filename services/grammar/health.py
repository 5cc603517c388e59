"""The grammar service's health check, light enough for a container health check.

    python -m services.grammar.health [--address HOST:PORT] [--timeout S]

prints the service's Health reply as one JSON line and exits 0 when it says SERVING, 1 otherwise
(unreachable, timed out, not serving). It imports grpclib and the generated stubs only: no
xgrammar, no torch (`infernix grammar health` runs the same check, behind the console script's
own imports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, Sequence, TextIO

DEFAULT_ADDRESS = "127.0.0.1:50051"


async def ask(address: str, timeout: float) -> dict[str, Any]:
    """The Health reply of the service at `address` as a dict. Raises OSError,
    asyncio.TimeoutError or grpclib errors when it does not answer."""
    from grpclib.client import Channel

    from shared.proto.grammar_grpc import GrammarStub
    from shared.proto.grammar_pb2 import HealthRequest

    host, _, port = address.rpartition(":")
    channel = Channel(host or "127.0.0.1", int(port))
    try:
        reply = await GrammarStub(channel).Health(HealthRequest(), timeout=timeout)
    finally:
        channel.close()
    return {"status": reply.status, "models": list(reply.models), "redis_ok": reply.redis_ok,
            "cold_compiles": reply.cold_compiles, "cold_waiting": reply.cold_waiting}


def check(address: str, timeout: float, out: TextIO | None = None) -> int:
    """Print the health as one JSON line; 0 when SERVING, else 1."""
    out = out or sys.stdout
    try:
        health = asyncio.run(asyncio.wait_for(ask(address, timeout), timeout + 1.0))
    except Exception as exc:  # noqa: BLE001 - any failure to answer is "unhealthy", said why
        out.write(json.dumps({"status": "UNREACHABLE", "error": type(exc).__name__}) + "\n")
        return 1
    out.write(json.dumps(health) + "\n")
    return 0 if health["status"] == "SERVING" else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.grammar.health",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=DEFAULT_ADDRESS, metavar="HOST:PORT")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    return check(args.address, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
