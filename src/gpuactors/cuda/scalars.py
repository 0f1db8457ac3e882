"""NumPy scalars as the C values kernels take: the ``struct`` code of each kind and
size (standard sizes, little-endian), shared by the launch path and the engine's
argument encoder."""

from __future__ import annotations

import numpy as np

_STRUCT_CODES = {
    ("b", 1): "?",
    ("i", 1): "b", ("i", 2): "h", ("i", 4): "i", ("i", 8): "q",
    ("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q",
    ("f", 2): "e", ("f", 4): "f", ("f", 8): "d",
}  # fmt: skip


def struct_code(dtype: np.dtype[np.generic]) -> str | None:
    """The ``struct`` code of ``dtype`` (without byte order), or None where there is
    none (complex)."""
    return _STRUCT_CODES.get((dtype.kind, dtype.itemsize))
