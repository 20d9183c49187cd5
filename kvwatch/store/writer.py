"""The probe path's database writes, on one thread, committed in groups.

Every probe writes twice (its claim and running row, then its result). Sent one by one
through asyncio's default executor, each write paid for a thread hand-off, a turn of the
SQLite writer lock and a commit of its own, and every return from SQLite or the PostgreSQL
socket waited for the event loop to let go of the GIL; at 50 probes a second the writes
queued for hundreds of milliseconds (issue 13). Here one thread takes whatever writes are
waiting and runs them in one transaction (:meth:`Store.write_group`, which orders them by
endpoint); a write that comes alone runs alone, so nothing waits for a group to fill. A
probe's own writes never share a group: its result is sent only after its start returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import Any, TypeVar

from kvwatch.store.repository import Store, WriteOp

T = TypeVar("T")

# Writes in one transaction at most: a group that is refused is retried write by write, so
# a long one would make a single refusal expensive.
MAX_GROUP = 32
# Seconds without a write after which the thread ends (the next write starts another).
IDLE_EXIT = 10.0

_Item = tuple[WriteOp[Any], asyncio.Future[Any], asyncio.AbstractEventLoop]


class GroupWriter:
    """The writer thread of one :class:`Store`. It starts with the first write and ends
    after ``idle_exit`` seconds without one (a short-lived runner leaves no thread behind)."""

    def __init__(
        self, store: Store, *, max_group: int = MAX_GROUP, idle_exit: float = IDLE_EXIT
    ) -> None:
        self._store = store
        self._max_group = max_group
        self._idle_exit = idle_exit
        # Unbounded as a queue, bounded in practice: every write's caller awaits it, so it
        # holds at most one write per coroutine writing (probes are capped by the scheduler).
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # Guards starting and ending the thread: the thread ends only when it finds the
        # queue empty under this lock, and a write starts one under it after queueing.
        self._lock = threading.Lock()

    async def write(self, op: WriteOp[T]) -> T:
        """Run ``op`` (in a group with any writes waiting beside it); its result, or the
        :class:`StoreError` it met. Cancelling the caller does not undo a write underway."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((op, future, loop))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kvwatch-db-writer", daemon=True
                )
                self._thread.start()
        return await future

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=self._idle_exit)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            group = [first]
            while len(group) < self._max_group:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                outcomes = self._store.write_group([op for op, _, _ in group])
            except BaseException as exc:  # a bug, not a database error: every caller hears it
                outcomes = [exc] * len(group)
            for (_, future, loop), outcome in zip(group, outcomes, strict=True):
                # A closed loop has nobody waiting any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, future, outcome)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.cancelled():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
