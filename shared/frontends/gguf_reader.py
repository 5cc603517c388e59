"""Reading GGUF files quickly (the default model ships as one)."""

from __future__ import annotations

import numpy as np


def open_gguf(path: str):
    """A `gguf.GGUFReader` over `path` whose buffer is a plain ndarray view of the file mapping:
    parsing the ~150k metadata parts through np.memmap's subclass hooks costs over twice as long."""
    import gguf

    class _PlainReader(gguf.GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapping: np.ndarray) -> None:
            self._plain = np.asarray(mapping)  # same memory; keeps the mapping alive through .base

    return _PlainReader(path)
