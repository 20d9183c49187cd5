"""Two glibc malloc arenas instead of up to eight per core (issue 25).

glibc gives each thread that allocates while another holds the main arena an arena of its
own, up to 8 x cores, and memory freed in an arena stays there, fragmented, for that arena
only. kvwatch allocates from many threads: database calls (``asyncio.to_thread``), the
database writer, the web UI's thread pool. Measured with ``python -m bench memory`` (1,000
endpoints, 50 probes/s, web reads and reloads, SQLite, 2 cores): RSS after warm-up rose
from 272 to 310 MB in 12 minutes with glibc's default and stayed between 243 and 264 MB with
two arenas, at the same probe rate. Allocation is not a bottleneck of kvwatch (the event
loop is), so contention on two arenas costs nothing measurable.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENV = "MALLOC_ARENA_MAX"
ARENAS = 2
# mallopt's parameter number for the arena cap (glibc's malloc.h).
_M_ARENA_MAX = -8


def limit_arenas(environ: Mapping[str, str] = os.environ, arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas``; call before kvwatch starts its threads.

    False, changing nothing, when ``MALLOC_ARENA_MAX`` is set (the operator's value, which
    glibc has already applied, stands) or the C library is not glibc (mallopt is missing or
    refuses the parameter).
    """
    if ENV in environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


@dataclass(frozen=True, slots=True)
class Heap:
    """What glibc's malloc holds, in bytes (``mallinfo2``, summed over its arenas).

    RSS minus these is mostly Python's own small-object arenas (which it maps itself),
    thread stacks and loaded libraries.
    """

    allocated: int  # in chunks the program holds
    free: int  # in free chunks malloc keeps: freed by the program, not returned to the OS
    mmapped: int  # in chunks large enough to get a mapping of their own


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33): ten size_t fields in this order.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    # Looked up once, not on every scrape.
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.argtypes = ()
    mallinfo2.restype = _MallInfo2
    return mallinfo2


def heap() -> Heap | None:
    """glibc's malloc totals now, or None where there is no ``mallinfo2`` (not glibc, or
    older than 2.33)."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return Heap(allocated=info.uordblks, free=info.fordblks, mmapped=info.hblkhd)
