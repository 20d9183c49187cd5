"""kvwatch run caps glibc's malloc arenas, unless the operator chose a cap."""

from __future__ import annotations

import platform

import pytest

from kvwatch import arenas


def test_an_arena_cap_set_by_the_operator_is_left_alone() -> None:
    """MALLOC_ARENA_MAX in the environment: glibc applied it at start, kvwatch changes nothing."""
    assert arenas.limit_arenas({arenas.ENV: "8"}) is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the cap is glibc's")
def test_on_glibc_the_cap_is_applied() -> None:
    """Without MALLOC_ARENA_MAX, mallopt accepts the cap of two arenas."""
    assert arenas.limit_arenas({}) is True
