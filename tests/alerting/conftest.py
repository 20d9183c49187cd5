"""Fixtures for the alerting tests: a real Alertmanager and the webhook it notifies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer, running_alertmanager


@pytest.fixture
def webhook() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture
def alertmanager(webhook: RecordingServer) -> Iterator[AlertmanagerProcess]:
    yield from running_alertmanager(webhook.url)


@pytest.fixture
def recorder() -> Iterator[RecordingServer]:
    """A stand-in Alertmanager that records exact payloads and answers a chosen status."""
    with RecordingServer() as server:
        yield server
