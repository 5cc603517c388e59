"""What a cold compile leaves behind, and the one place where a compiled grammar becomes bytes.

A compiled grammar is opaque everywhere else: `serialize` / `deserialize` / `footprint` below are
the only functions that know it is an xgrammar `CompiledGrammar` (an engine interface swaps them
here and nowhere else). `BLOB_FORMAT` names the serialisation and the compression; it is part of
every Redis name and of every blob sent over gRPC, so an upgrade never reads an old format.

A `Record` is what the Redis store and the grammar service keep for one key: the `BuildInfo` of its
compile (how long, how large, whether the store policy keeps its blob) and the compressed blob when
the policy keeps it. A record without a blob is a verdict: this grammar compiles faster than it
loads, and it compiled within the limits, so whoever needs it compiles it itself.
"""

from __future__ import annotations

import importlib.metadata
import json
import zlib
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

# xgrammar's serialisation version, and our compression (zlib level 1).
BLOB_FORMAT = (
    f"xgr{xgr.get_serialization_version()}-llg{importlib.metadata.version('llguidance')}-z1"
)
_RECORD_MAGIC = b"IXR1"


def serialize(compiled: Any) -> bytes:
    """The compressed serialisation of a compiled grammar (`serialize_json`, zlib level 1: fast,
    since blobs are read far more often than written)."""
    return serialize_sized(compiled)[0]


def serialize_sized(compiled: Any) -> tuple[bytes, int]:
    """`serialize`, and the size of the serialisation before compression (what a load's cost
    follows: see `StorePolicy`)."""
    text = compiled.serialize_json().encode()
    return zlib.compress(text, 1), len(text)


def deserialize(blob: bytes, compiler: Any) -> Any:
    """The compiled grammar of `blob` for the vocabulary of `compiler` (a ModelCompiler). Raises
    whatever the decompressor or the engine raises for a corrupt or foreign blob."""
    return compiler.deserialize(zlib.decompress(blob).decode())


def footprint(compiled: Any) -> int:
    """Bytes a compiled grammar holds in memory (what L1 budgets count)."""
    return int(compiled.memory_size_bytes)


@dataclass(frozen=True)
class BuildInfo:
    """How one cold compile went: its wall time, its footprint, its serialised size (0 when it was
    never serialised), and the store policy's verdict."""

    compile_ms: float
    memory_bytes: int
    stored: bool  # the blob is kept (Redis, the service's L1) and shipped to workers
    serialized_bytes: int = 0

    def __post_init__(self) -> None:
        if self.compile_ms < 0 or self.memory_bytes < 0 or self.serialized_bytes < 0:
            raise ValueError("BuildInfo sizes and compile_ms must be >= 0")


@dataclass(frozen=True)
class Record:
    """A key's build verdict and, when the policy keeps it, its compressed blob."""

    info: BuildInfo
    blob: bytes | None = None

    def __post_init__(self) -> None:
        if self.info.stored != (self.blob is not None):
            raise ValueError("a Record carries a blob exactly when its BuildInfo says stored")

    @property
    def nbytes(self) -> int:
        """What the record costs a byte budget (the blob plus a small header)."""
        return (len(self.blob) if self.blob is not None else 0) + 64

    def encode(self) -> bytes:
        """`IXR1`, a 4-byte header length, the header as JSON, then the blob (if any)."""
        header = json.dumps({"compile_ms": round(self.info.compile_ms, 3),
                             "memory_bytes": self.info.memory_bytes,
                             "serialized_bytes": self.info.serialized_bytes,
                             "stored": self.info.stored}).encode()
        return b"".join((_RECORD_MAGIC, len(header).to_bytes(4, "little"), header,
                         self.blob or b""))

    @classmethod
    def decode(cls, data: bytes) -> "Record":
        """The record `encode` wrote. Raises ValueError for anything else."""
        if data[:4] != _RECORD_MAGIC or len(data) < 8:
            raise ValueError("not an Infernix grammar record")
        n = int.from_bytes(data[4:8], "little")
        header = json.loads(data[8:8 + n])
        info = BuildInfo(float(header["compile_ms"]), int(header["memory_bytes"]),
                         bool(header["stored"]), int(header.get("serialized_bytes", 0)))
        blob = data[8 + n:] if info.stored else None
        return cls(info, blob)
