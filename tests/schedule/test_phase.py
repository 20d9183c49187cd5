"""Each job's phase inside its interval: stable, even over a fleet, and one run per slot."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime

from kvwatch.phase import interval_ms, next_slot_start, phase_ms, slot_for, slot_start
from kvwatch.scheduler import SlotTrigger

INTERVAL = 900.0


def test_the_phase_is_the_sha256_of_the_job_folded_into_its_interval() -> None:
    """The phase is a pure function of endpoint, kind and interval (pinned, so a release that
    changed it would move every job of a fleet at once)."""
    import hashlib

    digest = hashlib.sha256(b"glm-prod\x00under").digest()
    expected = int.from_bytes(digest[:8], "big") % 900_000
    assert phase_ms("glm-prod", "under", INTERVAL) == expected
    assert 0 <= expected < 900_000
    assert phase_ms("glm-prod", "over", INTERVAL) != expected


def test_a_restarted_process_or_another_replica_computes_the_same_phase() -> None:
    """Processes with different hash seeds (a restart, a replica) agree on every phase."""
    code = (
        "from kvwatch.phase import phase_ms;"
        "print([phase_ms(f'e{i}', k, 900.0) for i in range(50) for k in ('under', 'capacity')])"
    )
    outputs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(run.stdout)
    here = [phase_ms(f"e{i}", k, 900.0) for i in range(50) for k in ("under", "capacity")]
    assert outputs == {f"{here}\n"}


def test_a_run_at_its_due_time_belongs_to_its_slot_not_the_one_before() -> None:
    """Due times computed back from a slot name that slot, for awkward phases and intervals
    (float sums that land a hair short must not name the previous slot)."""
    rng = random.Random(3)
    for _ in range(5000):
        interval = rng.choice([1.0, 3.0, 60.0, 61.7, 900.0, 3600.0, 86_400.0])
        phase = rng.randrange(interval_ms(interval))
        slot = rng.randrange(1_700_000_000, 1_800_000_000) // int(interval) * int(interval)
        slot = slot_for(slot_start(slot, interval, phase), interval, phase)
        due = slot_start(slot, interval, phase)
        assert slot_for(due, interval, phase) == slot
        assert slot_for(due - 0.001, interval, phase) < slot
        assert slot_for(due + interval - 0.001, interval, phase) == slot
        assert next_slot_start(due, interval, phase) == due
        assert next_slot_start(due + 0.001, interval, phase) > due


def test_a_phased_jittered_trigger_fires_once_in_every_slot() -> None:
    """With a phase and a jitter just under the interval, 500 fires land in 500 consecutive
    slots: none twice, none skipped (a skipped slot is a lost canary)."""
    for phase in (0, 1, 17_345, 59_999):
        trigger = SlotTrigger(seconds=60, phase=phase, jitter=59.999, timezone=UTC)
        now = datetime(2026, 12, 5, 7, 0, 30, tzinfo=UTC)
        fire = trigger.get_next_fire_time(None, now)
        assert fire is not None and fire >= now
        first = slot_for(fire.timestamp(), 60, phase)
        for n in range(1, 500):
            fire = trigger.get_next_fire_time(fire, fire)
            assert fire is not None
            assert slot_for(fire.timestamp(), 60, phase) == first + 60 * n


def test_three_thousand_jobs_every_fifteen_minutes_start_at_an_even_rate() -> None:
    """Spread by their phases, 3,000 jobs start at about 3.3 a second all interval long,
    instead of 100 a second for the first 30 s."""
    slot = 1_800_000_000 // 900 * 900
    starts = [
        slot_start(slot, INTERVAL, phase_ms(f"endpoint-{i}", "under", INTERVAL))
        for i in range(3000)
    ]
    per_minute = Counter(int((t - slot) // 60) for t in starts)
    assert sorted(per_minute) == list(range(15))
    # 200 a minute on average; a hash is as even as a fair draw (sd 14).
    assert max(per_minute.values()) < 260 and min(per_minute.values()) > 140
    per_second = Counter(int(t) for t in starts)
    assert max(per_second.values()) <= 15
