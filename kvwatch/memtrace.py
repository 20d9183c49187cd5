"""Memory snapshots of a running daemon, for finding what grows (issue 25).

``KVWATCH_MEMSTATS=<path prefix>``: every SIGUSR2 writes ``<prefix><n>.memstats`` (n = 1, 2,
...), what the two allocators under kvwatch hold: CPython's small-object arenas
(``sys._debugmallocstats``) and glibc's heaps (``malloc_info``). It costs nothing until the
signal, so it may be set on a production replica whose RSS is growing; :func:`read_stats`
sums a file up and ``python -m bench memory`` prints the change across its window. It tells
live data that grows (a leak, a cache filling) from free space the allocators keep
(fragmentation), which RSS alone cannot.

``KVWATCH_TRACEMALLOC=<path prefix>`` instead starts :mod:`tracemalloc` when ``kvwatch run``
starts, and each SIGUSR2 writes a snapshot to ``<prefix><n>.tracemalloc``, which
``tracemalloc.Snapshot.load`` reads back; ``python -m bench memory --tracemalloc`` compares
two of them. Tracing costs memory and CPU (every allocation records its stack), so it is
for measuring, never for production. It also hooks CPython's allocator, which then reports
no arena figures, so a traced run writes no ``.memstats``.

Both are written by a forked child: copying the traces and pickling them takes seconds on a
large heap, and the event loop of the parent must not stall for them (probes would start
late). The child sees the parent's heap as it was at the fork, which is exactly the snapshot
wanted; it touches nothing but the allocators' statistics and its files, then exits without
running any of the parent's clean-up.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import signal
import sys
import threading
import tracemalloc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from kvwatch.arenas import _libc as libc

ENV = "KVWATCH_TRACEMALLOC"
STATS_ENV = "KVWATCH_MEMSTATS"
# Frames kept per allocation: enough to see who called the allocating line, few enough that
# tracing does not double the heap it measures.
FRAMES = 5
# Longest a child may take to write one snapshot (a large heap's takes tens of seconds).
CHILD_SECONDS = 600
# Where each allocator's part of a .memstats file starts.
PYTHON_HEADING = "# CPython sys._debugmallocstats()\n"
GLIBC_HEADING = "# glibc malloc_info()\n"

log = structlog.get_logger("kvwatch.memtrace")


class MemTrace:
    """Writes numbered snapshots under ``prefix``: a tracemalloc snapshot when ``tracing``
    (tracemalloc must then be tracing), the allocators' statistics when not."""

    def __init__(self, prefix: str, *, tracing: bool = True) -> None:
        self.prefix = prefix
        self.tracing = tracing
        self._taken = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGUSR2, self.snapshot)

    def snapshot(self) -> Path:
        """Fork a child that writes the next snapshot; returns its path (complete once the
        file exists: the child writes beside it and renames)."""
        self._taken += 1
        path = Path(f"{self.prefix}{self._taken}.{'tracemalloc' if self.tracing else 'memstats'}")
        pid = os.fork()
        if pid == 0:  # the child: write, and leave without the parent's exit handlers
            code = 1
            # Another thread may have held tracemalloc's lock at the fork (only this thread
            # lives on in the child): a child stuck on it is killed rather than left behind.
            signal.alarm(CHILD_SECONDS)
            try:
                (_write_trace if self.tracing else _write_stats)(path)
                code = 0
            finally:
                os._exit(code)
        # Reaped from a thread, so the loop neither waits for the child nor leaves a zombie.
        threading.Thread(target=_reap, args=(pid, path), name="memtrace", daemon=True).start()
        return path


def _write_trace(path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    tracemalloc.take_snapshot().dump(str(partial))
    partial.rename(path)


def _write_stats(path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, PYTHON_HEADING.encode())
        # CPython prints its statistics to the C library's stderr: in this child only,
        # stderr is the file.
        sys.stderr.flush()
        os.dup2(fd, 2)
        sys._debugmallocstats()
        os.write(fd, GLIBC_HEADING.encode())
        _malloc_info(fd)
    finally:
        os.close(fd)
    partial.rename(path)


def _malloc_info(fd: int) -> None:
    # glibc writes its XML to a FILE*: one opened on a copy of the file's descriptor, flushed
    # and closed before the child leaves. Not glibc: the section stays empty.
    fdopen = libc("fdopen", (ctypes.c_int, ctypes.c_char_p), ctypes.c_void_p)
    malloc_info = libc("malloc_info", (ctypes.c_int, ctypes.c_void_p), ctypes.c_int)
    fclose = libc("fclose", (ctypes.c_void_p,), ctypes.c_int)
    if fdopen is None or malloc_info is None or fclose is None:
        return
    stream = fdopen(os.dup(fd), b"w")
    if stream:
        malloc_info(0, stream)
        fclose(stream)


def _reap(pid: int, path: Path) -> None:
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        log.info("memtrace_snapshot", path=str(path))
    else:
        log.error("memtrace_snapshot_failed", path=str(path), status=status)


def start_from_env(environ: Mapping[str, str] = os.environ) -> MemTrace | None:
    """Snapshots on SIGUSR2 if ``KVWATCH_TRACEMALLOC`` (tracing) or else ``KVWATCH_MEMSTATS``
    (the allocators' statistics) names a prefix; None, and no tracing, if neither does."""
    prefix = environ.get(ENV)
    tracing = bool(prefix)
    prefix = prefix or environ.get(STATS_ENV)
    if not prefix:
        return None
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    if tracing:
        tracemalloc.start(FRAMES)
    return MemTrace(prefix, tracing=tracing)


@dataclass(frozen=True, slots=True)
class MemStats:
    """A ``.memstats`` file summed up, in bytes (glibc's figures None where it wrote none)."""

    python_arenas: int  # CPython's small-object arenas mapped now
    python_arena_bytes: int  # their size
    python_live: int  # in blocks that hold objects
    python_free: int  # inside the arenas but holding nothing (free blocks and pools)
    c_heaps: int | None  # glibc's heaps (the main one and its other arenas), as mapped
    c_free: int | None  # free chunks inside them, which glibc keeps
    c_mmapped: int | None  # chunks with a mapping of their own


def read_stats(text: str) -> MemStats:
    """Sum up a ``.memstats`` file; ValueError if its CPython part is missing."""
    python, _, glibc = text.partition(GLIBC_HEADING)

    def field(name: str) -> int:
        match = re.search(rf"^# {re.escape(name)}\s*=\s*([\d,]+)", python, re.M)
        if match is None:
            raise ValueError(f"no {name!r} in the CPython statistics")
        return int(match.group(1).replace(",", ""))

    arenas = field("arenas allocated current")
    sizes = re.search(r"^(\d+) arenas \* (\d+) bytes/arena\s*=\s*([\d,]+)", python, re.M)
    unused = re.search(r"^(\d+) unused pools \* (\d+) bytes", python, re.M)
    free = field("bytes in available blocks")
    if unused is not None:
        free += int(unused.group(1)) * int(unused.group(2))
    c_heaps = c_free = c_mmapped = None
    # The XML's last totals are over all heaps, after one block per heap.
    totals = glibc.rsplit("</heap>", 1)[-1]
    heap = re.search(r'<system type="current" size="(\d+)"', totals)
    if heap is not None:
        c_heaps = int(heap.group(1))
        c_free = sum(
            int(m.group(1))
            for m in re.finditer(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"', totals)
        )
        mapped = re.search(r'<total type="mmap" count="\d+" size="(\d+)"', totals)
        c_mmapped = int(mapped.group(1)) if mapped else 0
    return MemStats(
        python_arenas=arenas,
        python_arena_bytes=int(sizes.group(3).replace(",", "")) if sizes else 0,
        python_live=field("bytes in allocated blocks"),
        python_free=free,
        c_heaps=c_heaps,
        c_free=c_free,
        c_mmapped=c_mmapped,
    )
