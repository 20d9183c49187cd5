"""One kvwatch per SQLite file: a second daemon on the same file refuses to start.

SQLite serialises writers but cannot run two schedulers' probe slots exactly once; several
replicas need PostgreSQL. The lock is an advisory ``flock`` on ``<database>.lock`` held for
the life of the process (the kernel drops it when the process dies, even on SIGKILL).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sqlalchemy.engine import make_url

from kvwatch.store.errors import StoreError


class InstanceLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise StoreError(
                f"another kvwatch ({holder}) is already using the SQLite database next to "
                f"{self.path}; run one kvwatch per SQLite file, or use PostgreSQL for "
                "several replicas"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown pid"
    except OSError:
        return "unknown pid"


def sqlite_lock_for(url: str) -> InstanceLock | None:
    """The lock guarding a SQLite file database; ``None`` for other databases."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite") or not parsed.database:
        return None
    if parsed.database == ":memory:":
        return None
    return InstanceLock(Path(parsed.database + ".lock"))
