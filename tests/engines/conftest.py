"""Fixtures for engine tests: an HTTP client and a fresh marker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.markers import new_marker


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http


@pytest.fixture
def marker() -> str:
    return new_marker()
