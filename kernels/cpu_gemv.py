"""The CPU decode-row weight GEMM on GGUF-quantised weights read as stored (kernels/cpu_gemv.c).

A CPU decode step is bound by reading the weights: the built-in model dequantised to float32 is
538 MB per token, its Q4_1 / Q8_0 blocks are 97 MB. `QuantizedMatrix.linear` reads the blocks and
forms every weight exactly as the float32 checkpoint has it (the C file says how), so its product
differs from `F.linear` on the dequantised matrix by summation order only.

The C file is compiled with the system's gcc at first use (or by `python -m kernels.cpu_gemv`,
which scripts/install.sh runs) into a per-user cache, keyed by the source and flags, and loaded with
ctypes; it needs an x86-64 CPU with AVX-512 (F, BW, VL) and F16C. Without them, or when the build
fails, `available()` is False (the reason in `unavailable_reason()`) and callers keep `F.linear` on
the float32 weights: the same outputs up to summation order, at the old speed.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

log = logging.getLogger(__name__)

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_gemv.c")
# -ffp-contract=off: the dequantisation's multiply and add round separately, as in gguf-py.
_FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mf16c", "-mfma", "-ffp-contract=off",
          "-fopenmp", "-fPIC", "-shared")
_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "f16c", "fma")
BLOCK = 32  # weights per GGUF block of both formats
KINDS = ("q4_1", "q8_0")
# Rows (B * T) up to which the kernel is taken: it re-forms each weight per 4 rows; against F.linear
# on the float32 weights (bench/cpu_gemv.py --rows, one thread) it measured 4x faster at 1 row, 3x
# at 8, 2x at 16, 1.25x at 32 and 0.9x at 64.
MAX_ROWS = 32

_i64, _int, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "infernix")


def _library_path() -> str:
    with open(_SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    return os.path.join(_cache_dir(), f"cpu_gemv-{key}.so")


def build() -> str:
    """Compile the kernel into the cache unless it is there; returns the library's path. Raises
    RuntimeError naming what is missing (CPU features, a compiler) or gcc's message."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"the CPU GEMV needs x86-64, this is {platform.machine()}")
    missing = [f for f in _CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        raise RuntimeError(f"the CPU GEMV needs CPU features {', '.join(missing)}")
    path = _library_path()
    if os.path.exists(path):
        return path
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("the CPU GEMV needs a C compiler (gcc) to build")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        done = subprocess.run([cc, *_FLAGS, _SOURCE, "-o", tmp], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"building the CPU GEMV failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, path)  # atomic: a concurrent builder finds a whole library or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | str:
    """The loaded kernel library, or the reason there is none."""
    try:
        lib = ctypes.CDLL(build())
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        log.warning("CPU GEMV unavailable (decode keeps float32 F.linear): %s", e)
        return str(e)
    lib.q4_1_linear.argtypes = [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _int]
    lib.q8_0_linear.argtypes = lib.q4_1_linear.argtypes
    lib.q4_1_dequantize.argtypes = [_i64, _i64, _ptr, _ptr, _ptr, _ptr]
    lib.q8_0_dequantize.argtypes = lib.q4_1_dequantize.argtypes
    for fn in (lib.q4_1_linear, lib.q8_0_linear, lib.q4_1_dequantize, lib.q8_0_dequantize):
        fn.restype = None
    return lib


def available() -> bool:
    return not isinstance(_library(), str)


def unavailable_reason() -> str | None:
    lib = _library()
    return lib if isinstance(lib, str) else None


def _halves(pairs: np.ndarray) -> np.ndarray:
    """float16 bytes [..., 2] -> float32 [...] (exact)."""
    return np.ascontiguousarray(pairs).view(np.float16)[..., 0].astype(np.float32)


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A [out_features, in_features] matrix in a GGUF block format: `qs` the quants (Q4_1:
    uint8 [out, in / 2]; Q8_0: int8 [out, in]), `d` (and Q4_1's `m`) the block scales (and
    minima) [out, in / 32], float32 widened exactly from the file's float16."""

    kind: str
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def out_features(self) -> int:
        return self.qs.shape[0]

    @property
    def in_features(self) -> int:
        return self.d.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m)
                   if t is not None)

    @staticmethod
    def from_gguf_blocks(kind: str, blocks: np.ndarray, rows: int) -> "QuantizedMatrix":
        """The matrix of a GGUF tensor's raw blocks (uint8, `rows` rows of whole blocks)."""
        block_bytes = {"q4_1": 20, "q8_0": 34}[kind]
        b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(rows, -1, block_bytes)
        d = torch.from_numpy(_halves(b[:, :, 0:2]))
        if kind == "q4_1":
            m = torch.from_numpy(_halves(b[:, :, 2:4]))
            qs = torch.from_numpy(b[:, :, 4:].reshape(rows, -1).copy())
            return QuantizedMatrix(kind, qs, d, m)
        qs = torch.from_numpy(b[:, :, 2:].reshape(rows, -1).view(np.int8).copy())
        return QuantizedMatrix(kind, qs, d)

    @staticmethod
    def cat(parts: list["QuantizedMatrix"]) -> "QuantizedMatrix | None":
        """The row concatenation of `parts` (a fused projection), None unless all share a kind."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1 or len({p.in_features for p in parts}) != 1:
            return None
        m = torch.cat([p.m for p in parts]) if parts[0].m is not None else None
        return QuantizedMatrix(parts[0].kind, torch.cat([p.qs for p in parts]),
                               torch.cat([p.d for p in parts]), m)

    def rows(self, index: torch.Tensor) -> "QuantizedMatrix":
        """The matrix of rows `index` in that order (a row permutation of the checkpoint's)."""
        m = self.m[index] if self.m is not None else None
        return QuantizedMatrix(self.kind, self.qs[index].contiguous(),
                               self.d[index].contiguous(), m.contiguous() if m is not None else m)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix [out, in] (what the checkpoint's dequantisation gives)."""
        lib = _library()
        if isinstance(lib, str):
            raise RuntimeError(lib)
        w = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        fn = lib.q4_1_dequantize if self.kind == "q4_1" else lib.q8_0_dequantize
        fn(self.out_features, self.in_features, self.qs.data_ptr(), self.d.data_ptr(),
           self._m_ptr, w.data_ptr())
        return w

    @property
    def _m_ptr(self) -> int:
        return 0 if self.m is None else self.m.data_ptr()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., in] float32 on the CPU @ W^T (+ bias float32 [out]) -> [..., out] float32."""
        lib = _library()
        if isinstance(lib, str):
            raise RuntimeError(lib)
        K, N = self.in_features, self.out_features
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != K:
            raise ValueError(f"x must be float32 [..., {K}] on the CPU, got {x.dtype} "
                             f"{tuple(x.shape)} on {x.device}")
        x2 = x.reshape(-1, K).contiguous()
        y = torch.empty(x2.shape[0], N, dtype=torch.float32)
        if bias is not None:
            bias = bias.to(torch.float32).contiguous()  # kept alive through the call
        fn = lib.q4_1_linear if self.kind == "q4_1" else lib.q8_0_linear
        fn(x2.data_ptr(), x2.shape[0], K, self.qs.data_ptr(), self.d.data_ptr(), self._m_ptr,
           0 if bias is None else bias.data_ptr(), y.data_ptr(), N, torch.get_num_threads())
        return y.view(*x.shape[:-1], N)


if __name__ == "__main__":  # scripts/install.sh: build once, so the first request does not
    try:
        print(f"CPU GEMV built: {build()}")
    except RuntimeError as e:
        print(f"CPU GEMV not built (decode keeps float32 F.linear): {e}")
    sys.exit(0)
