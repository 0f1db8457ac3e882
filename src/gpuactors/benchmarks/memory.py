"""This process's resident memory, measured so that a leak shows and a reserve does not.

``bench_recovery`` and ``benchmarks/soak.py`` compare it before and after many jobs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os


def release_free_heap() -> None:
    """Ask glibc to give freed heap pages back to the OS, so RSS shows what is still held
    (memory freed by Python but kept by the allocator is not a leak)."""
    # Not glibc: nothing to ask, and RSS then includes the allocator's reserve.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_bytes() -> int:
    """Resident set size in bytes, after :func:`release_free_heap` (Linux: /proc)."""
    release_free_heap()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
