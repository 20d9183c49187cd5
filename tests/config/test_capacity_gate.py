"""The capacity gate refuses an endpoint whose window is larger than its KV pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.config import (
    capacity_message,
    capacity_violations,
    exceeds_capacity,
    load_config,
    parse_config,
)

VALID = Path(__file__).parent / "valid"


def endpoint(name: str, window: int | None, pool: int | None) -> str:
    lines = f"  - name: {name}\n    url: http://{name}:8000/v1\n    model: m\n"
    if window is not None:
        lines += f"    context_window: {window}\n"
    if pool is not None:
        lines += f"    kv_pool_tokens: {pool}\n"
    return lines


def test_it_refuses_the_design_example_with_the_exact_line() -> None:
    """DESIGN §7's glm-prod (1048576 > 681280) yields exactly the documented message."""
    config = load_config(VALID / "design_example.yaml", env={"GLM_API_KEY": "sk"})
    assert capacity_violations(config) == [
        "glm-prod: context_length 1048576 exceeds KV pool 681280 tokens; refusing to start"
    ]


@pytest.mark.parametrize(
    ("window", "pool"),
    [(681280, 681280), (131072, 681280), (131072, None), (None, 681280), (None, None)],
)
def test_it_passes_a_window_that_fits_or_a_missing_number(
    window: int | None, pool: int | None
) -> None:
    """Equal, smaller, or unknown window/pool is no violation at config time."""
    config = parse_config("endpoints:\n" + endpoint("a", window, pool), env={})
    assert capacity_violations(config) == []


def test_it_lists_every_violating_endpoint_in_config_order() -> None:
    """Each endpoint over its pool gets its own line with its own numbers."""
    text = (
        "endpoints:\n"
        + endpoint("big", 262144, 200000)
        + endpoint("fine", 4096, 8192)
        + endpoint("huge", 1048576, 681280)
    )
    assert capacity_violations(parse_config(text, env={})) == [
        "big: context_length 262144 exceeds KV pool 200000 tokens; refusing to start",
        "huge: context_length 1048576 exceeds KV pool 681280 tokens; refusing to start",
    ]


def test_the_comparison_is_reusable_for_discovered_values() -> None:
    """exceeds_capacity and capacity_message work on bare numbers, e.g. an engine's report."""
    assert exceeds_capacity(1048576, 681280)
    assert not exceeds_capacity(681280, 681280)
    assert capacity_message(1048576, 681280) == (
        "context_length 1048576 exceeds KV pool 681280 tokens; refusing to start"
    )
