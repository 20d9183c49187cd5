"""Memory over a run: does ``kvwatch run``'s RSS level off after warm-up? (issue 25)

Two real processes, as in :mod:`bench.scale` (whose simulator, database and fleet helpers
this reuses): ``kvwatch simulate --fleet`` serves ``--endpoints`` + ``--churn`` healthy
endpoints, and ``kvwatch run`` probes ``--endpoints`` of them with ``--probes`` every
``--interval`` seconds. Besides probing, like a production replica:

* ``--web-every S``: every S seconds the web UI's pages (overview, an endpoint, probes, a
  probe, alerts) and the API's reads are fetched, as a person or a dashboard would;
* ``--churn-every S``: every S seconds a reload (SIGHUP) removes the ``--churn`` oldest
  endpoints and adds as many under names never used before (on the simulator endpoints just
  freed), so whatever kvwatch keeps per endpoint must be freed with it; ``--churn 0``
  reloads the unchanged file, which tells what a reload costs from what replacing
  endpoints does.

The process's VmRSS (and its anonymous, file and shared-memory parts) is sampled every
``--sample-every`` (60) seconds, with its live small
Python objects (``kvwatch_python_allocated_blocks``) and what glibc's malloc holds
(``kvwatch_malloc_bytes``): RSS that grows while neither grows is memory held after
transient peaks, not a leak. After ``--warmup``
seconds (first runs, caches filling) the slope of a least-squares line through the samples
of the ``--duration`` window is printed in MB/h and in bytes per probe, with the probes/s
achieved (on a loaded machine it may fall short of the schedule: the bytes per probe are
per probe actually run). ``kvwatch_internal_entries`` (the sizes of kvwatch's per-endpoint
maps) is printed at both ends of the window, and so is what the two allocators under it
hold (kvwatch's ``KVWATCH_MEMSTATS`` snapshot, kvwatch/memtrace.py): CPython's arenas, split
into live objects and the free space inside them, and glibc's heaps with their free chunks.
Growth in live objects is data kvwatch keeps; growth in free space is fragmentation.

``--tracemalloc`` runs kvwatch with ``KVWATCH_TRACEMALLOC`` (kvwatch/memtrace.py) and takes
a snapshot at both ends of the window: the allocation sites that grew most between them are
printed. Tracing itself costs memory and CPU, so its RSS figures are not comparable with
an untraced run's.

The default is a smoke run of about five minutes; issue 25's measurement is e.g.
``python -m bench memory --db sqlite --endpoints 1000 --probes under,over,baseline
--interval 60 --warmup 600 --duration 7200 --web-every 60 --churn-every 300 --churn 20``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from bench import exit_on_sigterm
from bench.machine import describe
from bench.scale import (
    DEFAULT_POSTGRES,
    database,
    free_port,
    simulator,
    status_mb,
    windowed_fleet,
)
from kvwatch.memtrace import MemStats, read_stats
from kvwatch.simulator.fleet import DEMO_MODEL
from kvwatch.simulator.spec import SimEndpoint

TOP_SITES = 15
MB = 1024 * 1024


@dataclass
class Options:
    db: str
    endpoints: int
    probes: list[str]
    interval: float
    warmup: float
    duration: float
    sample_every: float
    web_every: float
    churn_every: float
    churn: int
    tracemalloc: bool
    windows: str
    postgres: str
    keep_logs: bool


@dataclass
class Sample:
    at: float  # seconds since kvwatch started
    rss_mb: float
    probes: int  # probes finished so far
    # glibc malloc's totals (kvwatch_malloc_bytes), MB: RSS that grows while ``allocated``
    # does not is free space malloc keeps, not live data. Empty where malloc has no figures.
    malloc_mb: dict[str, float] = field(default_factory=dict)
    # CPython's live small objects (kvwatch_python_allocated_blocks), thousands: RSS that
    # grows while these do not is held in part-used arenas, not leaked objects.
    blocks_k: float = float("nan")
    # VmRSS split as /proc reports it (RssAnon, RssFile, RssShmem), MB: growth in RssFile or
    # RssShmem is mapped files (libraries, SQLite's WAL index), not the heap.
    parts_mb: dict[str, float] = field(default_factory=dict)


@dataclass
class Fleet:
    """Which simulator endpoint each configured name probes; churn renames a block."""

    sim: list[SimEndpoint]
    active: dict[str, int] = field(default_factory=dict)  # name -> index into sim, oldest first
    spare: list[int] = field(default_factory=list)
    churned: int = 0

    def churn(self, count: int) -> None:
        """Remove the ``count`` oldest names; add as many new ones on the freed endpoints
        (those of the previous churn, so no simulator endpoint serves two names at once)."""
        self.churned += 1
        gone = list(self.active)[:count]
        freed = [self.active.pop(name) for name in gone]
        for i, index in enumerate(self.spare):
            self.active[f"churn{self.churned:04d}-{i:03d}"] = index
        self.spare = freed


class ProbeCounter:
    """Counts ``probe`` lines of kvwatch's log, reading only what was appended."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self.count = 0

    def update(self) -> int:
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk.rfind(b"\n") + 1
        self._offset += complete
        self.count += chunk[:complete].count(b'"event": "probe"')
        return self.count


def write_config(
    opts: Options, fleet: Fleet, path: Path, sim_url: str, db_url: str, listen: str
) -> None:
    config = {
        "database": db_url,
        "listen": listen,
        "replica": "bench-memory",
        "log_level": "info",
        # Spread over the whole interval, as bench.scale does.
        "defaults": {"interval": f"{opts.interval:g}s", "jitter": f"{opts.interval - 1:g}s"},
        "endpoints": [
            {
                "name": name,
                "url": f"{sim_url}/{fleet.sim[index].name}/v1",
                "model": DEMO_MODEL,
                "flavour": "vllm",
                "context_window": fleet.sim[index].window,
                "tokenizer": "server",
                "probes": opts.probes,
            }
            for name, index in fleet.active.items()
        ],
    }
    partial = path.with_suffix(".partial")
    partial.write_text(yaml.safe_dump(config, sort_keys=False))
    partial.rename(path)  # a reload must never read half a file


def read_web(client: httpx.Client, base: str, fleet: Fleet) -> int:
    """Fetch the UI's pages and the API's reads once; returns how many answered 200."""
    name = next(reversed(fleet.active))  # the newest: the next churn keeps it
    paths = [
        "/",
        f"/endpoints/{name}",
        "/probes",
        "/alerts",
        "/api/v1/endpoints",
        f"/api/v1/endpoints/{name}/summary?window=1h",
        f"/api/v1/probes?endpoint={name}",
        "/api/v1/alerts",
        "/metrics",
    ]
    ok = 0
    for path in paths:
        response = client.get(base + path)
        ok += response.status_code == 200
        if path == "/api/v1/probes" + f"?endpoint={name}" and response.status_code == 200:
            probes = response.json().get("probes") or []
            if probes:
                for page in (f"/probes/{probes[0]['id']}", f"/api/v1/probes/{probes[0]['id']}"):
                    ok += client.get(base + page).status_code == 200
    return ok


def read_web_every(every: float, base: str, fleet: Fleet, run: Run, stop: threading.Event) -> None:
    """Read the web UI every ``every`` seconds until ``stop``; in a thread of its own, so a
    slow page does not delay the RSS samples."""
    with httpx.Client(timeout=120) as client:
        while not stop.wait(every):
            run.web_reads += 1
            with contextlib.suppress(httpx.HTTPError):
                run.web_ok += read_web(client, base, fleet)


def labelled(text: str, name: str) -> dict[str, float]:
    """The children of the one-label gauge ``name`` in a /metrics body, by label value."""
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            values[labels.split('"')[1]] = float(value)
    return values


def internal_entries(client: httpx.Client, base: str) -> dict[str, float]:
    return labelled(client.get(base + "/metrics").text, "kvwatch_internal_entries")


def heap_figures(client: httpx.Client, base: str) -> tuple[dict[str, float], float]:
    """malloc's totals (MB by state) and CPython's live blocks (thousands), from one scrape:
    each scrape is a transient load on the process measured. Empty and NaN when it fails."""
    with contextlib.suppress(httpx.HTTPError):
        text = client.get(base + "/metrics").text
        mb = labelled(text, "kvwatch_malloc_bytes")
        blocks = float("nan")
        for line in text.splitlines():
            if line.startswith("kvwatch_python_allocated_blocks "):
                blocks = float(line.split()[1]) / 1000
        return {state: value / 1024 / 1024 for state, value in mb.items()}, blocks
    return {}, float("nan")


def snapshot(proc: subprocess.Popen[bytes], prefix: Path, n: int, suffix: str) -> Path:
    """Ask kvwatch for snapshot ``n`` (``suffix`` tracemalloc or memstats) and wait until its
    forked child has written it."""
    path = Path(f"{prefix}{n}.{suffix}")
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 600
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {suffix} snapshot at {path}")
        time.sleep(0.5)
    return path


def slope(samples: list[Sample], value: Callable[[Sample], float] = lambda s: s.rss_mb) -> float:
    """Least-squares slope of ``value`` (RSS by default) over time, MB per second."""
    n = len(samples)
    if n < 2:
        return float("nan")
    mean_t = sum(s.at for s in samples) / n
    mean_r = sum(value(s) for s in samples) / n
    var = sum((s.at - mean_t) ** 2 for s in samples)
    return sum((s.at - mean_t) * (value(s) - mean_r) for s in samples) / var


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    entries_start: dict[str, float] = field(default_factory=dict)
    entries_end: dict[str, float] = field(default_factory=dict)
    top: list[str] = field(default_factory=list)
    stats: list[MemStats] = field(default_factory=list)  # at the window's start and end
    web_reads: int = 0
    web_ok: int = 0
    reloads: int = 0
    reloads_ok: int = 0
    loadavg: str = ""


@contextlib.contextmanager
def kvwatch(
    config: Path, tmp: Path, snap_prefix: Path, tracing: bool
) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["KVWATCH_TRACEMALLOC" if tracing else "KVWATCH_MEMSTATS"] = str(snap_prefix)
    with open(tmp / "kvwatch.log", "wb") as log, open(tmp / "kvwatch.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvwatch", "run", "--config", str(config)],
            stdout=log,
            stderr=err,
            env=env,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure(opts: Options, tmp: Path) -> Run:
    run = Run(loadavg=" ".join(Path("/proc/loadavg").read_text().split()[:3]))
    sim = windowed_fleet(opts.endpoints + opts.churn, opts.windows)
    fleet = Fleet(sim=sim)
    fleet.active = {e.name: i for i, e in enumerate(sim[: opts.endpoints])}
    fleet.spare = list(range(opts.endpoints, len(sim)))
    listen = f"127.0.0.1:{free_port()}"
    base = f"http://{listen}"
    snap_prefix = tmp / "snap-"
    suffix = "tracemalloc" if opts.tracemalloc else "memstats"
    with (
        simulator(len(sim), opts.windows, tmp) as (sim_url, _),
        database(opts.db, tmp, opts.postgres) as db_url,
    ):
        config = tmp / "kvwatch.yaml"
        write_config(opts, fleet, config, sim_url, db_url, listen)
        with (
            kvwatch(config, tmp, snap_prefix, opts.tracemalloc) as proc,
            httpx.Client(timeout=60) as client,
        ):
            counter = ProbeCounter(tmp / "kvwatch.log")
            start = time.monotonic()
            end = start + opts.warmup + opts.duration
            next_sample = start + opts.sample_every
            stop_reading = threading.Event()
            reader = threading.Thread(
                target=read_web_every,
                args=(opts.web_every, base, fleet, run, stop_reading),
                daemon=True,
            )
            if opts.web_every:
                reader.start()
            next_churn = start + opts.churn_every if opts.churn_every else float("inf")
            window_started = False
            snaps: list[Path] = []
            while True:
                now = time.monotonic()
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"kvwatch exited {proc.returncode}: "
                        f"{(tmp / 'kvwatch.err').read_text()[-2000:]}"
                    )
                if not window_started and now >= start + opts.warmup:
                    window_started = True
                    run.entries_start = internal_entries(client, base)
                    snaps.append(snapshot(proc, snap_prefix, 1, suffix))
                if now >= next_sample or now >= end:
                    # RSS and its parts first, in one read: fetching the figures below makes
                    # kvwatch render /metrics, which moves RSS by megabytes.
                    rss, parts = rss_parts(proc.pid)
                    malloc, blocks = heap_figures(client, base)
                    sample = Sample(now - start, rss, counter.update(), malloc, blocks, parts)
                    run.samples.append(sample)
                    heap = " ".join(f"{k} {v:.1f}" for k, v in sorted(sample.malloc_mb.items()))
                    split = " ".join(f"{k} {v:.1f}" for k, v in parts.items())
                    print(
                        f"  {now - start:7.0f} s  RSS {rss:7.1f} MB  probes {counter.count}"
                        f"  Python blocks {sample.blocks_k:.0f}k  malloc MB: {heap or '-'}"
                        f"  ({split})",
                        file=sys.stderr,
                        flush=True,
                    )
                    next_sample += opts.sample_every
                if now >= end:
                    break
                if now >= next_churn:
                    fleet.churn(opts.churn)
                    write_config(opts, fleet, config, sim_url, db_url, listen)
                    run.reloads += 1
                    with contextlib.suppress(httpx.HTTPError):
                        run.reloads_ok += client.post(base + "/-/reload").status_code == 200
                    next_churn += opts.churn_every
                time.sleep(max(0.0, min(next_sample, next_churn, end) - time.monotonic()))
            stop_reading.set()
            if reader.is_alive():
                reader.join()
            run.entries_end = internal_entries(client, base)
            snaps.append(snapshot(proc, snap_prefix, 2, suffix))
            if opts.tracemalloc:
                run.top = top_sites(*snaps)
            else:
                try:
                    run.stats = [read_stats(path.read_text()) for path in snaps]
                except ValueError as exc:  # e.g. PYTHONMALLOC=malloc: no CPython arenas
                    print(f"allocator snapshots unreadable: {exc}", file=sys.stderr)
    return run


def rss_parts(pid: int) -> tuple[float, dict[str, float]]:
    """VmRSS of ``pid`` in MB, and its parts RssAnon, RssFile and RssShmem (which add up to
    it) as ``anon``, ``file`` and ``shmem``."""
    values = status_mb(pid, "VmRSS", "RssAnon", "RssFile", "RssShmem")
    rss = values.pop("VmRSS")
    return rss, {key.removeprefix("Rss").lower(): mb for key, mb in values.items()}


def top_sites(before: Path, after: Path) -> list[str]:
    """The allocation sites (file:line) that grew most between two snapshots."""
    keep = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
    ]
    old = tracemalloc.Snapshot.load(str(before)).filter_traces(keep)
    new = tracemalloc.Snapshot.load(str(after)).filter_traces(keep)
    lines = []
    grown = sorted(new.compare_to(old, "lineno"), key=lambda s: s.size_diff, reverse=True)
    for stat in grown[:TOP_SITES]:
        frame = stat.traceback[0]
        lines.append(
            f"| {_short(frame.filename)}:{frame.lineno} | {stat.size_diff / 1024:+.1f} "
            f"| {stat.size / 1024:.1f} | {stat.count_diff:+d} |"
        )
    return lines


def _short(filename: str) -> str:
    """A site's file relative to its package (kvwatch's, a library's or the stdlib's)."""
    if "/kvwatch/" in filename:
        return "kvwatch/" + filename.rsplit("/kvwatch/", 1)[1]
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    if "/lib/python3" in filename:  # the stdlib: from after the version's directory
        return filename.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return filename


def report(opts: Options, run: Run) -> None:
    schedule = opts.endpoints * len(opts.probes) / opts.interval
    print(
        f"## {opts.db}: {opts.endpoints} endpoints x {','.join(opts.probes)} every "
        f"{opts.interval:g} s ({schedule:.1f} probes/s scheduled); web reads every "
        f"{opts.web_every:g} s, churn {opts.churn} every {opts.churn_every:g} s; "
        f"tracemalloc {'on' if opts.tracemalloc else 'off'}; load at start {run.loadavg}"
    )
    states = sorted({state for s in run.samples for state in s.malloc_mb})
    print(
        "| minute | RSS MB | probes | Python blocks (k) |"
        + "".join(f" malloc {state} MB |" for state in states)
        + "\n|---|---|---|---|"
        + "---|" * len(states)
    )
    for s in run.samples:
        heap = "".join(f" {s.malloc_mb.get(state, float('nan')):.1f} |" for state in states)
        print(f"| {s.at / 60:.1f} | {s.rss_mb:.1f} | {s.probes} | {s.blocks_k:.0f} |{heap}")
    window = [s for s in run.samples if s.at >= opts.warmup]
    if len(window) >= 2:
        seconds = window[-1].at - window[0].at
        probes = window[-1].probes - window[0].probes
        rate = probes / seconds if seconds else 0.0
        per_second = slope(window)
        per_probe = per_second * 1024 * 1024 / rate if rate else float("nan")
        print(
            f"after warm-up ({opts.warmup:g} s; {len(window)} samples over {seconds:.0f} s): "
            f"RSS slope {per_second * 3600:+.2f} MB/h, {per_probe:+.1f} bytes per probe; "
            f"{rate:.1f} probes/s achieved; "
            f"RSS {window[0].rss_mb:.1f} -> {window[-1].rss_mb:.1f} MB"
        )
        blocks = slope(window, lambda s: s.blocks_k)
        print(f"  Python blocks: {blocks * 3600:+.1f}k/h")
        for part in window[0].parts_mb:
            if all(part in s.parts_mb for s in window):
                rate_mb = slope(window, lambda s, k=part: s.parts_mb[k])  # type: ignore[misc]
                print(f"  RSS {part}: {rate_mb * 3600:+.2f} MB/h")
        for state in states:
            if all(state in s.malloc_mb for s in window):
                rate_mb = slope(window, lambda s, k=state: s.malloc_mb[k])  # type: ignore[misc]
                print(f"  malloc {state}: {rate_mb * 3600:+.2f} MB/h")
    else:
        print("after warm-up: fewer than two samples (lengthen --duration)")
    print(
        f"web reads: {run.web_reads} rounds, {run.web_ok} pages answered 200; "
        f"reloads: {run.reloads} ({run.reloads_ok} ok)"
    )
    names = sorted(set(run.entries_start) | set(run.entries_end))
    print("| kvwatch_internal_entries | window start | window end |\n|---|---|---|")
    for name in names:
        print(f"| {name} | {run.entries_start.get(name, 0):g} | {run.entries_end.get(name, 0):g} |")
    if len(run.stats) == 2:
        print(allocators_table(*run.stats))
    if run.top:
        print(f"top {TOP_SITES} growing allocation sites over the window (tracemalloc):")
        print("| site | growth KiB | size at end KiB | blocks |\n|---|---|---|---|")
        print("\n".join(run.top))


def allocators_table(start: MemStats, end: MemStats) -> str:
    """What each allocator holds at the window's two ends (kvwatch's SIGUSR2 .memstats):
    growth in live blocks is data kvwatch keeps; growth in free space is fragmentation."""
    rows = [
        ("CPython arenas (count)", start.python_arenas, end.python_arenas, 1),
        ("CPython arenas MB", start.python_arena_bytes, end.python_arena_bytes, MB),
        ("  live objects MB", start.python_live, end.python_live, MB),
        ("  free inside MB", start.python_free, end.python_free, MB),
        ("glibc heaps MB", start.c_heaps, end.c_heaps, MB),
        ("  free chunks MB", start.c_free, end.c_free, MB),
        ("glibc mmapped MB", start.c_mmapped, end.c_mmapped, MB),
    ]
    lines = ["| allocator (.memstats) | window start | window end | change |", "|---|---|---|---|"]
    for name, a, b, unit in rows:
        if a is None or b is None:
            continue  # not glibc
        digits = 0 if unit == 1 else 1
        lines.append(
            f"| {name} | {a / unit:.{digits}f} | {b / unit:.{digits}f} "
            f"| {(b - a) / unit:+.{digits}f} |"
        )
    return "\n".join(lines)


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--endpoints", type=int, default=200)
    parser.add_argument("--probes", default="under,over,baseline")
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the window")
    parser.add_argument("--duration", type=float, default=240.0, help="seconds measured")
    parser.add_argument(
        "--sample-every", type=float, default=60.0, help="seconds between RSS samples"
    )
    parser.add_argument("--web-every", type=float, default=30.0, help="0: no web reads")
    parser.add_argument("--churn-every", type=float, default=60.0, help="0: no reloads")
    parser.add_argument(
        "--churn",
        type=int,
        default=10,
        help="endpoints replaced per reload (0: reloads of an unchanged file)",
    )
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--fleet-window", default="2048-8192")
    parser.add_argument(
        "--postgres", default=os.environ.get("KVWATCH_TEST_POSTGRES_URL", DEFAULT_POSTGRES)
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    if args.churn_every and not 0 <= args.churn < args.endpoints:
        parser.error("--churn must be between 0 and --endpoints - 1")
    return Options(
        db=args.db,
        endpoints=args.endpoints,
        probes=[p.strip() for p in args.probes.split(",") if p.strip()],
        interval=args.interval,
        warmup=args.warmup,
        duration=args.duration,
        sample_every=args.sample_every,
        web_every=args.web_every,
        churn_every=args.churn_every,
        churn=args.churn if args.churn_every else 0,
        tracemalloc=args.tracemalloc,
        windows=args.fleet_window,
        postgres=args.postgres,
        keep_logs=args.keep_logs,
    )


def main(argv: list[str] | None = None) -> None:
    opts = parse(sys.argv[1:] if argv is None else argv)
    print(f"# memory — {describe()}")
    tmp = Path(tempfile.mkdtemp(prefix=f"kvwatch-memory-{opts.db}-"))
    try:
        report(opts, measure(opts, tmp))
    finally:
        if opts.keep_logs:
            print(f"# logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
