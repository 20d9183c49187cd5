"""kvwatch benchmarks: `python -m bench NAME` (or `make bench` for all of them)."""

from __future__ import annotations

import signal
import sys


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a CI timeout) unwind like Ctrl-C, so the benchmarks' context
    managers stop the kvwatch and simulator processes they started and drop the PostgreSQL
    database they made. Python's default for SIGTERM ends the process at once, leaving
    them behind (seen: a killed ``bench memory`` left two simulators, two daemons and a
    database)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
