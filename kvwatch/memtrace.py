"""Allocation snapshots of a running daemon, for finding what grows (issue 25).

``KVWATCH_TRACEMALLOC=<path prefix>`` starts :mod:`tracemalloc` when ``kvwatch run`` starts,
and every SIGUSR2 writes a snapshot to ``<prefix><n>.tracemalloc`` (n = 1, 2, ...), which
``tracemalloc.Snapshot.load`` reads back; ``python -m bench memory --tracemalloc`` compares
two of them. Tracing costs memory and CPU (every allocation records its stack), so it is
for measuring, never for production.

The snapshot is taken and written by a forked child: copying the traces and pickling them
takes seconds on a large heap, and the event loop of the parent must not stall for them
(probes would start late). The child sees the parent's heap as it was at the fork, which is
exactly the snapshot wanted; it touches nothing but tracemalloc and its file, then exits
without running any of the parent's clean-up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import tracemalloc
from collections.abc import Mapping
from pathlib import Path

import structlog

ENV = "KVWATCH_TRACEMALLOC"
# Frames kept per allocation: enough to see who called the allocating line, few enough that
# tracing does not double the heap it measures.
FRAMES = 5
# Longest a child may take to write one snapshot (a large heap's takes tens of seconds).
CHILD_SECONDS = 600

log = structlog.get_logger("kvwatch.memtrace")


class MemTrace:
    """Writes numbered snapshots under ``prefix``; tracemalloc must be tracing."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._taken = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGUSR2, self.snapshot)

    def snapshot(self) -> Path:
        """Fork a child that writes the next snapshot; returns its path (complete once the
        file exists: the child writes beside it and renames)."""
        self._taken += 1
        path = Path(f"{self.prefix}{self._taken}.tracemalloc")
        pid = os.fork()
        if pid == 0:  # the child: write, and leave without the parent's exit handlers
            code = 1
            # Another thread may have held tracemalloc's lock at the fork (only this thread
            # lives on in the child): a child stuck on it is killed rather than left behind.
            signal.alarm(CHILD_SECONDS)
            try:
                _write(path)
                code = 0
            finally:
                os._exit(code)
        # Reaped from a thread, so the loop neither waits for the child nor leaves a zombie.
        threading.Thread(target=_reap, args=(pid, path), name="memtrace", daemon=True).start()
        return path


def _write(path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    tracemalloc.take_snapshot().dump(str(partial))
    partial.rename(path)


def _reap(pid: int, path: Path) -> None:
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        log.info("memtrace_snapshot", path=str(path))
    else:
        log.error("memtrace_snapshot_failed", path=str(path), status=status)


def start_from_env(environ: Mapping[str, str] = os.environ) -> MemTrace | None:
    """Start tracing if ``KVWATCH_TRACEMALLOC`` names a prefix; None (and no tracing) if not."""
    prefix = environ.get(ENV)
    if not prefix:
        return None
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    return MemTrace(prefix)
