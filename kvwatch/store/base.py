"""What every part of the store shares: the engine, short write transactions (queued on
SQLite), grouped writes, and the mapping of database errors to :class:`StoreError`.

The daemon calls the store through ``asyncio.to_thread``; each method opens its own session
and returns frozen records, so nothing database-shaped escapes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    Engine,
    text,
)
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.migrate import current_revision, head_revision
from kvwatch.store.models import (
    Probe,
)
from kvwatch.store.statements import insert_for


def _utcnow() -> datetime:
    return datetime.now(UTC)


T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class WriteOp(Generic[T]):
    """One write of the probe path, to run alone or in a group (:meth:`Store.write_group`):
    ``run`` does it inside a transaction it is given; ``what`` heads its error message."""

    what: str
    run: Callable[[Session], T]
    endpoint: str = ""  # whose rows it writes: a group runs its ops in this order


class StoreBase:
    """The engine, its sessions and the write path every part of the store shares."""

    def __init__(
        self,
        engine: Engine,
        *,
        now: Callable[[], datetime] = _utcnow,
        region: str | None = None,
    ) -> None:
        self._engine = engine
        self._region = region
        self._region_key = region or ""
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._now = now
        self._head: str | None = None  # read from the scripts once; /readyz asks often
        # SQLite has one writer at a time, and a writer that finds the lock taken sleeps in
        # SQLite's busy handler (up to 100 ms a try) rather than waking when it is free. With
        # hundreds of probe writes a second that sleeping was most of every write's time, so
        # this process's writers queue on a lock of its own instead.
        self._write_lock = threading.Lock() if engine.dialect.name == "sqlite" else None

    @property
    def engine(self) -> Engine:
        return self._engine

    def ping(self) -> None:
        """Raise :class:`StoreError` unless the database answers a trivial query."""
        with self._errors("database unreachable"), self._engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def readiness(self) -> tuple[bool, str]:
        """Whether the store can serve this kvwatch, and a sentence saying why (not)."""
        try:
            self.ping()
            current = current_revision(self._engine)
        except StoreError as exc:
            return False, str(exc)
        if self._head is None:
            self._head = head_revision()
        head = self._head
        if current == head:
            return True, f"database reachable, schema at {head}"
        shown = current if current is not None else "none"
        return False, f"schema at {shown}, expected {head}: run `kvwatch db upgrade`"

    def write_group(self, ops: Sequence[WriteOp[Any]]) -> list[Any]:
        """Run ``ops`` in one transaction where they all succeed; each gets its own outcome.

        The outcome of an op is its result, or the :class:`StoreError` it met. Several
        probes' writes then cost one commit (and on SQLite one turn of the writer lock).
        The ops run in order of endpoint, so that two replicas' groups lock their rows in
        one order and cannot deadlock each other on PostgreSQL. When the database is
        unreachable every op gets that error; when one op is refused (a probe no longer
        running, a constraint) or the group lost a conflict with another transaction, the
        group is rolled back and each op runs in a transaction of its own, so only an op
        that fails alone fails.
        """
        if len(ops) > 1:
            order = sorted(range(len(ops)), key=lambda i: ops[i].endpoint)
            try:
                with self._errors("could not write a group of probe writes"), self._write() as s:
                    done = {i: ops[i].run(s) for i in order}
                return [done[i] for i in range(len(ops))]
            except StoreUnavailable as exc:
                if not _lost_a_conflict(exc.__cause__):
                    return [exc] * len(ops)
            except StoreError:
                pass
        outcomes: list[Any] = []
        for op in ops:
            try:
                outcomes.append(self._write_one(op))
            except StoreError as exc:
                outcomes.append(exc)
        return outcomes

    def _write_one(self, op: WriteOp[T]) -> T:
        with self._errors(op.what), self._write() as s:
            return op.run(s)

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A write transaction (queued behind this process's other writers on SQLite)."""
        if self._write_lock is None:
            with self._sessions.begin() as session:
                yield session
            return
        with self._write_lock, self._sessions.begin() as session:
            yield session

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (OperationalError, InterfaceError) as exc:
            raise StoreUnavailable(f"{what}: {_first_line(exc)}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StoreUnavailable(f"{what}: {_first_line(exc)}") from exc
            raise StoreError(f"{what}: {_first_line(exc)}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"{what}: {_first_line(exc)}") from exc

    def _own_probes(self) -> ColumnElement[bool]:
        """Probes run in this region (IS NULL without a region)."""
        if self._region is None:
            return Probe.region.is_(None)
        return Probe.region == self._region

    @staticmethod
    def _insert(session: Session, model: type[Any]) -> Any:
        return insert_for(session.get_bind().dialect.name, model)


# SQLSTATEs of a transaction that lost to another one (deadlock, serialization failure):
# running it again can succeed, unlike when the server is gone.
_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})


def _lost_a_conflict(exc: BaseException | None) -> bool:
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) in _CONFLICT_SQLSTATES


def _first_line(exc: SQLAlchemyError) -> str:
    # The driver message without SQLAlchemy's echo of the statement and its parameters
    # (which may hold an answer excerpt) and its documentation link.
    orig = getattr(exc, "orig", None)
    message = str(orig) if orig is not None else str(exc)
    return message.strip().splitlines()[0] if message.strip() else type(exc).__name__
