"""jemalloc, when kvwatch runs under it: whether it does, and what it holds (issue 25).

An operator may run kvwatch on jemalloc (``LD_PRELOAD=libjemalloc.so.2``, Debian's
``libjemalloc2``), as README's Memory section measured it. Preloaded, jemalloc replaces
``malloc`` for the whole process, and its ``mallctl`` is among the process's global symbols:
that is how kvwatch tells. glibc's malloc then serves nothing, so the tuning in
:mod:`kvwatch.arenas` has no heap to act on and the daemon skips it, and
``kvwatch_malloc_bytes`` reads jemalloc's statistics rather than glibc's, which would be
near zero and read as a measurement.
"""

from __future__ import annotations

import ctypes
from typing import Any

from kvwatch.arenas import Heap
from kvwatch.arenas import _libc as libc

# jemalloc's statistics are a snapshot refreshed by writing "epoch" (jemalloc(3), MALLCTL
# NAMESPACE): without it every read returns the figures of the last refresh.
_EPOCH = b"epoch"
_ALLOCATED = b"stats.allocated"  # bytes in objects the program holds
_RESIDENT = b"stats.resident"  # bytes in pages jemalloc holds resident, metadata included


def active() -> bool:
    """Whether this process's ``malloc`` is jemalloc's."""
    return _mallctl() is not None


def heap() -> Heap | None:
    """What jemalloc holds now, or None where kvwatch does not run under jemalloc or its
    statistics are compiled out.

    ``free`` is what jemalloc keeps resident beyond the objects in use: pages awaiting
    their decay, part-used runs and its own metadata. jemalloc maps no chunk per large
    allocation as glibc does, so ``mmapped`` is None.
    """
    mallctl = _mallctl()
    if mallctl is None:
        return None
    epoch = ctypes.c_uint64(1)
    size = ctypes.c_size_t(ctypes.sizeof(epoch))
    if mallctl(_EPOCH, ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), size):
        return None
    allocated, resident = _read(mallctl, _ALLOCATED), _read(mallctl, _RESIDENT)
    if allocated is None or resident is None:
        return None  # built without --enable-stats
    return Heap(allocated=allocated, free=max(0, resident - allocated), mmapped=None)


def _read(mallctl: Any, name: bytes) -> int | None:
    value = ctypes.c_size_t(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0):
        return None
    return value.value


def _mallctl() -> Any:
    # int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen),
    # found among the process's global symbols only when jemalloc is its malloc.
    argtypes = (
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
        ctypes.c_size_t,
    )
    return libc("mallctl", argtypes, ctypes.c_int)
