"""Where inside its interval each job runs: a fixed phase from a hash of its identity (pure).

With every job anchored to multiples of its interval since the epoch, a fleet's runs all fell
into the first seconds of each interval (the jitter, at most 30 s): 3,000 jobs every 15 min
started at ~100 a second for 30 s, then nothing for 14.5 min. Prometheus spreads its scrapes
the same way as here: an offset inside the interval derived from a hash of the target, so the
fleet's runs are even over the interval, and every replica (and every restart, and every
region) computes the same offset without talking to the others.

All arithmetic is in whole milliseconds: a float ``(when - phase) / interval`` that lands a
hair below a whole number names the previous slot, and a job that fires once per slot must
never map two fires to one slot (a duplicate claim, refused) and skip the next (a lost slot).
"""

from __future__ import annotations

import hashlib

MS = 1000


def phase_ms(endpoint: str, kind: str, interval_seconds: float) -> int:
    """The job's offset inside its interval, in ms: stable across processes and versions.

    sha256, not ``hash()``: Python salts ``str`` hashes per process, and replicas must agree.
    The interval enters only as the modulus: the same job keeps the same hash, folded into
    whatever interval it has now.
    """
    digest = hashlib.sha256(f"{endpoint}\x00{kind}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % interval_ms(interval_seconds)


def interval_ms(interval_seconds: float) -> int:
    return max(1, round(interval_seconds * MS))


def slot_for(when: float, interval_seconds: float, phase: int = 0) -> int:
    """The slot a run at ``when`` (epoch seconds) belongs to, for a job at ``phase`` ms.

    A slot is named by its multiple of the interval (epoch seconds, phase excluded): it stays
    an integer whatever the phase, and the same for every replica. Its run is due at
    ``slot + phase / 1000`` seconds. Intervals are whole seconds or longer (config), so
    consecutive slots never share a name.
    """
    length = interval_ms(interval_seconds)
    index = (round(when * MS) - phase) // length
    return int(index * length // MS)


def slot_start(slot: int, interval_seconds: float, phase: int) -> float:
    """When (epoch seconds) the run of ``slot`` is due, before any jitter."""
    length = interval_ms(interval_seconds)
    # The slot's index: its name is the index's start rounded down to a second, and with
    # intervals of a second or more only one index rounds down to it.
    index = -((-slot * MS) // length)
    return (index * length + phase) / MS


def next_slot_start(when: float, interval_seconds: float, phase: int) -> float:
    """The first due time of this job at or after ``when`` (no jitter)."""
    length = interval_ms(interval_seconds)
    now = round(when * MS)
    index = -((phase - now) // length)  # ceil((now - phase) / length)
    return (index * length + phase) / MS
