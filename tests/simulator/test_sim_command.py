"""`kvwatch simulate`: endpoint options, the demo fleet, and a clean stop on SIGTERM/SIGINT."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest
from click.testing import CliRunner

from kvwatch.simulator.command import parse_endpoint, parse_listen, simulate
from kvwatch.simulator.fleet import demo_fleet
from kvwatch.simulator.spec import FaultMode, SimEndpoint


def test_an_endpoint_option_becomes_a_sim_endpoint() -> None:
    """Every key of the option maps onto the SimEndpoint field of the same name."""
    parsed = parse_endpoint(
        "name=x, window=8_192,kv_pool=6144,fault=stale_kv,model=m,report_usage=sent,"
        "api_key=k,prefill_tokens_per_second=5000,ttfb_delay=0.5,flavour=llamacpp"
    )
    assert parsed == SimEndpoint(
        name="x",
        window=8192,
        kv_pool=6144,
        fault=FaultMode.STALE_KV,
        model="m",
        report_usage="sent",
        api_key="k",
        prefill_tokens_per_second=5000.0,
        ttfb_delay=0.5,
        flavour="llamacpp",  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("window=8192", "name is required"),
        ("name=x,size=3", "unknown key 'size'; known keys: name, model, window"),
        ("name=x,window=big", "window must be an integer, got 'big'"),
        ("name=x,fault=flaky", "fault must be one of: healthy, stale_kv"),
        ("name=x,name=y", "name given twice"),
        ("name=x,window", "'window': expected key=value"),
        ("name=x,window=0", "endpoint x: window must be a positive integer"),
    ],
)
def test_a_bad_endpoint_option_is_refused_with_a_precise_message(text: str, message: str) -> None:
    """Each mistake names the key at fault."""
    with pytest.raises(ValueError) as raised:
        parse_endpoint(text)
    assert str(raised.value).startswith(message)


def test_listen_addresses_parse_with_ipv4_and_ipv6() -> None:
    """HOST:PORT and [V6]:PORT are accepted; anything else is refused."""
    assert parse_listen("127.0.0.1:8400") == ("127.0.0.1", 8400)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8400", "localhost:", "host:99999", ":80"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_the_command_reports_a_bad_endpoint_as_a_usage_error() -> None:
    """click exits 2 and repeats the parse error."""
    result = CliRunner().invoke(simulate, ["--endpoint", "name=x,fault=flaky"])
    assert result.exit_code == 2
    assert "fault must be one of" in result.output


def test_the_demo_fleet_has_one_endpoint_per_fault_with_small_windows() -> None:
    """Healthy plus every fault mode once, windows of 4,096-8,192, KV gaps where needed; and
    two more healthy endpoints: one whose vocabulary is not the simulator's own, one without
    a prefix cache."""
    fleet = demo_fleet()
    assert sorted(e.fault for e in fleet) == sorted([*FaultMode, *[FaultMode.HEALTHY] * 2])
    assert [e.name for e in fleet if e.token_skew] == ["estimated"]
    assert [e.name for e in fleet if not e.prefix_cache] == ["prefix-cache-off"]
    assert len({e.name for e in fleet}) == len(fleet)
    assert all(4096 <= e.window <= 8192 for e in fleet)
    for e in fleet:
        if e.fault in (FaultMode.STALE_KV, FaultMode.TRUNCATE_HEAD, FaultMode.WINDOW_NOT_SERVED):
            assert e.pool_tokens < e.window


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_command_serves_the_demo_fleet_until_a_signal_and_exits_cleanly(
    sig: signal.Signals,
) -> None:
    """It prints every endpoint's URL, serves them, and exits 0 on SIGTERM or SIGINT."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from kvwatch.simulator.command import simulate; simulate()",
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(len(demo_fleet()) + 2)]
        base = re.search(r"http://127\.0\.0\.1:\d+", lines[0])
        assert base is not None, lines
        urls = [line.split()[1] for line in lines[1:-1]]
        assert urls == [f"{base.group(0)}/{e.name}/v1" for e in demo_fleet()]
        assert httpx.get(f"{urls[0]}/models", timeout=10).status_code == 200
        process.send_signal(sig)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
