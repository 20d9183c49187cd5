"""kvwatch tells when it runs under jemalloc and reads what jemalloc holds."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kvwatch import jemalloc
from kvwatch.metrics import MallocCollector
from tests.helpers.processes import free_port, start_kvwatch, stop, wait_for

# The soname, as the image's LD_PRELOAD names it: ld.so finds it on any architecture.
SONAME = "libjemalloc.so.2"

# Run under jemalloc: whether kvwatch sees it, and its figures with 10 MB of 4 KiB buffers
# (above CPython's 512-byte small objects, so malloc's) alive and then freed.
_PROBE = """
import json
from kvwatch import jemalloc
before = jemalloc.heap()
buffers = [bytearray(4096) for _ in range(2560)]
during = jemalloc.heap()
del buffers
after = jemalloc.heap()
print(json.dumps({"active": jemalloc.active(), "figures": [
    None if h is None else [h.allocated, h.free, h.mmapped] for h in (before, during, after)
]}))
"""


def _require_jemalloc() -> None:
    if ctypes.util.find_library("jemalloc"):
        return
    message = "jemalloc is not installed (Debian's libjemalloc2)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so this check must run")
    pytest.skip(message)


def test_without_jemalloc_kvwatch_reads_no_figures_from_it() -> None:
    """In a process whose malloc is the C library's, jemalloc is neither seen nor read."""
    if "jemalloc" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("this test process itself runs under jemalloc")
    assert jemalloc.active() is False
    assert jemalloc.heap() is None


def test_under_jemalloc_an_allocation_counts_while_it_lives_and_not_after() -> None:
    """Preloaded like the image does, jemalloc is seen, and 10 MB of buffers show in its
    allocated bytes while alive and leave them when freed."""
    _require_jemalloc()
    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, "LD_PRELOAD": SONAME},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    reading = json.loads(result.stdout)
    assert reading["active"] is True
    before, during, after = reading["figures"]
    assert during[0] - before[0] >= 10 * 1024 * 1024
    assert during[0] - after[0] >= 10 * 1024 * 1024
    assert [figures[2] for figures in (before, during, after)] == [None, None, None]


def test_under_jemalloc_the_malloc_gauge_has_no_mmapped_child() -> None:
    """jemalloc maps no chunk per allocation, so kvwatch_malloc_bytes exports no mmapped
    rather than a zero that would read as a measurement."""
    registry = CollectorRegistry()
    registry.register(MallocCollector(lambda: jemalloc.Heap(allocated=3, free=2, mmapped=None)))
    assert registry.get_sample_value("kvwatch_malloc_bytes", {"state": "allocated"}) == 3
    assert registry.get_sample_value("kvwatch_malloc_bytes", {"state": "free"}) == 2
    assert registry.get_sample_value("kvwatch_malloc_bytes", {"state": "mmapped"}) is None


def test_kvwatch_run_under_jemalloc_says_so_and_exports_its_figures(tmp_path: Path) -> None:
    """A daemon started with jemalloc preloaded logs malloc=jemalloc at start, and
    kvwatch_malloc_bytes carries jemalloc's allocated bytes (megabytes, not glibc's
    near-zero figures) and no mmapped."""
    _require_jemalloc()
    port = free_port()
    config = tmp_path / "kvwatch.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'kvwatch.db'}\nlisten: 127.0.0.1:{port}\n")
    log = tmp_path / "run.log"
    proc = start_kvwatch("run", "--config", str(config), log=log, env={"LD_PRELOAD": SONAME})
    try:

        def figures() -> dict[str, float] | None:
            assert proc.poll() is None, log.read_text()
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                return None
            found = {
                s.labels["state"]: s.value
                for family in text_string_to_metric_families(body)
                if family.name == "kvwatch_malloc_bytes"
                for s in family.samples
            }
            return found or None

        found = wait_for("kvwatch_malloc_bytes on /metrics", figures, timeout=60)
    finally:
        assert stop(proc) == 0, log.read_text()
    assert set(found) == {"allocated", "free"}, found
    assert found["allocated"] > 1024 * 1024, found
    (started,) = [line for line in log.read_text().splitlines() if '"started"' in line]
    assert json.loads(started)["malloc"] == "jemalloc", started
